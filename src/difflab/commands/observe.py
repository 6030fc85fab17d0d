"""``difflab observe``: one side of one fix, for a CI matrix cell (``nox -s side``)."""

from __future__ import annotations

import argparse

from difflab.commands import run as run_cmd
from difflab.observation import SIDES
from difflab.progress import Reporter
from difflab.workflows.run import execute

NAME = "observe"
HELP = "run the probes of the selected fixes on ONE side only; `difflab merge` judges the cells"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    run_cmd.add_probe_arguments(parser, sealed=False)  # a cell's folder is merged, never sealed
    parser.add_argument("--side", required=True, choices=list(SIDES), help="which side to observe")


def main(args: argparse.Namespace) -> int:
    reporter = Reporter()
    outcome = execute(run_cmd.request(args, bundle=False, sides=(args.side,)), reporter)
    reporter.say(f"observations: {outcome.out_dir}")
    return outcome.exit_code
