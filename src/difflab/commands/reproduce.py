"""``difflab reproduce PATH``: re-run a bundle's pins and compare every verdict and observed field."""

from __future__ import annotations

import argparse

from difflab.bundle import trust
from difflab.commands import _args
from difflab.files.names import argument_path
from difflab.progress import Reporter
from difflab.runner import RUNNERS
from difflab.workflows.reproduce import Overrides, reproduce

NAME = "reproduce"
HELP = "Verify a bundle, re-run exactly its pins, and report any verdict or observation that differs."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", type=argument_path, metavar="PATH", help="sealed run folder or .tar.gz")
    parser.add_argument(
        "-o",
        "--out",
        type=argument_path,
        metavar="DIR",
        help="keep the re-run in this new folder (default: a temporary folder, removed)",
    )
    parser.add_argument(
        "--skip-signatures",
        action="store_true",
        help="check files against SHA256SUMS only, not who signed them; needs --backend docker "
        "(and --repo for a git bundle): an unverified bundle never chooses what runs",
    )
    parser.add_argument(
        "--backend",
        dest="runner",
        choices=list(RUNNERS),
        help="run the probes on this back end instead of the recorded one",
    )
    parser.add_argument("--repo", help="re-run git commits from this repository instead of the recorded one")
    trust.add_arguments(parser)
    _args.archive_limit(parser)


def main(args: argparse.Namespace) -> int:
    out = Reporter()
    policy = None if args.skip_signatures else trust.from_args(args)
    if policy is None:
        out.print("warning: signatures not checked; the bundle's origin is unverified")
    overrides = Overrides(repo=args.repo, runner=args.runner)
    report = reproduce(args.path, policy, out=args.out, overrides=overrides, max_bytes=_args.max_unpacked(args))
    for note in report.notes:
        out.print(f"note: {note}")
    if report.rerun_dir is not None:
        out.print(f"re-run written to {report.rerun_dir}")
    if report.matches:
        out.print(f"reproduced {args.path}: every verdict and observed field matches")
        return 0
    out.print(f"{len(report.differences)} difference(s) from {args.path}:")
    for difference in report.differences:
        out.print(f"  {difference}")
    return 1
