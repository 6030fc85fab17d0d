"""``difflab merge``: verdicts from the observations of separate CI cells."""

from __future__ import annotations

import argparse

from difflab.commands import _args
from difflab.files.names import argument_path
from difflab.progress import Reporter
from difflab.workflows.merge import MergeRequest, execute

NAME = "merge"
HELP = "judge observations written by `difflab observe` runs (one folder per CI cell)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("folders", nargs="+", type=argument_path, help="folders holding observe results")
    _args.out(parser, None, required=True)
    parser.add_argument("--matrix", type=argument_path, help="matrix (default: the matrix.toml the cells recorded)")
    _args.bundle(parser, key=False)


def main(args: argparse.Namespace) -> int:
    reporter = Reporter()
    req = MergeRequest(folders=args.folders, out=args.out, matrix=args.matrix, bundle=args.bundle, force=args.force)
    outcome = execute(req, reporter)
    reporter.table(outcome.verdicts, args.out)
    return outcome.exit_code
