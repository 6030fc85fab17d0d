"""``difflab reproduce PATH``: re-run a bundle's pins and compare every verdict and observed field."""

from __future__ import annotations

import argparse
from pathlib import Path

from difflab.bundle import trust
from difflab.progress import Reporter
from difflab.workflows.reproduce import reproduce

NAME = "reproduce"
HELP = "Verify a bundle, re-run exactly its pins, and report any verdict or observation that differs."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", type=Path, metavar="PATH", help="sealed run folder or .tar.gz")
    parser.add_argument(
        "-o",
        "--out",
        type=Path,
        metavar="DIR",
        help="keep the re-run in this new folder (default: a temporary folder, removed)",
    )
    parser.add_argument(
        "--skip-signatures", action="store_true", help="check files against SHA256SUMS only, not who signed them"
    )
    trust.add_arguments(parser)


def main(args: argparse.Namespace) -> int:
    out = Reporter()
    policy = None if args.skip_signatures else trust.from_args(args)
    if policy is None:
        out.print("warning: signatures not checked; the bundle's origin is unverified")
    report = reproduce(args.path, policy, out=args.out)
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
