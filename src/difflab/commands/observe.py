"""``difflab observe``: one side of one fix, for a CI matrix cell (``nox -s side``)."""

from __future__ import annotations

import argparse

from difflab.commands import run as run_cmd
from difflab.workflows.run import RunRequest, execute

NAME = "observe"
HELP = "run the probes of the selected fixes on ONE side only; `difflab merge` judges the cells"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    run_cmd.add_arguments(parser)
    parser.add_argument("--side", required=True, choices=["base", "head"], help="which side to observe")
    parser.set_defaults(bundle=False)


def main(args: argparse.Namespace) -> int:
    req = RunRequest(
        matrix=args.matrix,
        fixes=args.fixes,
        out=args.out,
        source_kind=args.source_kind,
        repo=args.repo,
        runner=args.runner,
        bundle=False,
        timeout_s=args.timeout,
        use_cache=args.use_cache,
        sides=(args.side,),
        selfcheck=args.selfcheck,
    )
    return execute(req).exit_code
