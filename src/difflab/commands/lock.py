"""``difflab lock``: resolve each fix's PR to full commit SHAs and write the lock file."""

from __future__ import annotations

import argparse

from difflab.commands import _args
from difflab.files.names import argument_path
from difflab.matrix import load_matrix
from difflab.paths import refuse_installed
from difflab.progress import Reporter
from difflab.source.lock import lock_path_for, resolve_lock, write_lock
from difflab.source.mirror import Mirror, normalise_repo

NAME = "lock"
HELP = "resolve each fix's PR to its merge commit on main (head) and first parent (base); write the lock file"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    _args.matrix(parser)
    _args.repo(parser)
    parser.add_argument("--branch", default="main", help="branch PRs are squash-merged into (default: main)")
    parser.add_argument("--out", type=argument_path, help="lock file (default: <matrix>.lock.json next to the matrix)")


def main(args: argparse.Namespace) -> int:
    matrix = load_matrix(args.matrix)
    out = refuse_installed(args.out or lock_path_for(matrix.path), "--out")
    mirror = Mirror(normalise_repo(args.repo))
    lock = resolve_lock(matrix, mirror, branch=args.branch)
    write_lock(out, lock)
    show = Reporter().print
    show(f"{mirror.repo} {args.branch} at {lock.branch_tip}")
    for entry in lock.entries.values():
        if entry.status == "resolved":
            show(f"  {entry.fix:<8} resolved   base {entry.base}  head {entry.head}  {entry.subject}")
        else:
            show(f"  {entry.fix:<8} {entry.status:<10} {entry.reason}")
        for check in entry.checks:
            mark = "ok" if check.ok else "MISMATCH"
            show(f"  {'':<8} matrix {check.side} {check.matrix_sha}: {mark}")
    show(f"wrote {out}")
    return 0 if lock.complete else 1
