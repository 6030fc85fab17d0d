"""``difflab lock``: resolve each fix's PR to full commit SHAs and write the lock file."""

from __future__ import annotations

import argparse
from pathlib import Path

from difflab.matrix import load_matrix
from difflab.paths import default_matrix
from difflab.source.lock import lock_path_for, resolve_lock, write_lock
from difflab.source.mirror import REPO_ENV, Mirror, normalise_repo

NAME = "lock"
HELP = "resolve each fix's PR to its merge commit on main (head) and first parent (base); write the lock file"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--matrix", type=Path, default=default_matrix(), help="matrix file (default: %(default)s)")
    parser.add_argument("--repo", help=f"git repository URL or path (default: ${REPO_ENV} or SGLang upstream)")
    parser.add_argument("--branch", default="main", help="branch PRs are squash-merged into (default: main)")
    parser.add_argument("--out", type=Path, help="lock file (default: <matrix>.lock.json next to the matrix)")


def main(args: argparse.Namespace) -> int:
    matrix = load_matrix(args.matrix)
    mirror = Mirror(normalise_repo(args.repo))
    lock = resolve_lock(matrix, mirror, branch=args.branch)
    out = args.out or lock_path_for(matrix.path)
    write_lock(out, lock)
    print(f"{mirror.repo} {args.branch} at {lock.branch_tip}")
    for entry in lock.entries.values():
        if entry.status == "resolved":
            print(f"  {entry.fix:<8} resolved   base {entry.base}  head {entry.head}  {entry.subject}")
        else:
            print(f"  {entry.fix:<8} {entry.status:<10} {entry.reason}")
        for check in entry.checks:
            mark = "ok" if check.ok else "MISMATCH"
            print(f"  {'':<8} matrix {check.side} {check.matrix_sha}: {mark}")
    print(f"wrote {out}")
    return 0 if lock.complete else 1
