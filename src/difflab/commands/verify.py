"""``difflab verify PATH``: check a sealed run folder or packed bundle offline."""

from __future__ import annotations

import argparse

from difflab.bundle import keyless, trust
from difflab.bundle.verify import verify_path
from difflab.commands import _args
from difflab.errors import VerificationFailed
from difflab.files.names import argument_path
from difflab.progress import Reporter

NAME = "verify"
HELP = (
    "Check a run folder or bundle archive offline: checksums, signatures (trusted keys only), statements, "
    "and Sigstore signatures where sigstore is installed."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "path", type=argument_path, metavar="PATH", help="sealed run folder, or a .tar.gz made by `difflab pack`"
    )
    trust.add_arguments(parser)
    keyless.add_arguments(parser)
    _args.archive_limit(parser)


def main(args: argparse.Namespace) -> int:
    out = Reporter()
    report = verify_path(
        args.path,
        trust.from_args(args),
        keyless.policy_from_args(args),
        args.sigstore_bundle,
        max_bytes=_args.max_unpacked(args),
    )
    for check in report.keyless:
        for line in check.lines():
            out.print(line)
    for note in report.notes:
        out.print(f"note: {note}")
    if not report.ok:
        raise VerificationFailed(report.failure_message())
    signers = ", ".join(sorted(report.signers))
    vouched = report.trust.vouched_by if report.trust else None
    out.print(
        f"OK {args.path}: {report.files} files match SHA256SUMS; {len(report.envelopes)} statements signed by {signers}"
        + (f" (key trusted through {vouched})" if vouched else "")
    )
    return 0
