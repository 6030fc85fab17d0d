"""``difflab verify PATH``: check a sealed run folder or packed bundle offline."""

from __future__ import annotations

import argparse
from pathlib import Path

from difflab.bundle import trust
from difflab.bundle.verify import verify_path
from difflab.commands import _args
from difflab.errors import VerificationFailed
from difflab.progress import Reporter

NAME = "verify"
HELP = "Check a run folder or bundle archive offline: checksums, signatures (trusted keys only), statements."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "path", type=Path, metavar="PATH", help="sealed run folder, or a .tar.gz made by `difflab pack`"
    )
    trust.add_arguments(parser)
    _args.archive_limit(parser)


def main(args: argparse.Namespace) -> int:
    out = Reporter()
    report = verify_path(args.path, trust.from_args(args), _args.max_unpacked(args))
    for note in report.notes:
        out.print(f"note: {note}")
    if not report.ok:
        raise VerificationFailed(report.failure_message())
    signers = ", ".join(sorted(report.signers))
    out.print(
        f"OK {args.path}: {report.files} files match SHA256SUMS; {len(report.envelopes)} statements signed by {signers}"
    )
    return 0
