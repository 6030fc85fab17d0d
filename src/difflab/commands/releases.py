"""``difflab releases``: the SGLang releases the package index serves, and ``--lock`` to pin new ones."""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.table import Table

from difflab.commands import _args
from difflab.matrix import load_matrix
from difflab.paths import refuse_installed
from difflab.source.index import IndexClient
from difflab.source.pip_config import pip_settings
from difflab.source.release_lock import (
    LockReport,
    ReleaseLock,
    Sighting,
    compare,
    load_lock,
    matrix_floor,
    parse_floor,
    pin_new,
    refuse_changes,
)

NAME = "releases"
HELP = "list SGLang releases from the package index pip uses; --lock pins new ones (trust on first use)"
STYLE = {"locked": "green", "new": "bold cyan", "skipped": "dim", "changed": "bold red", "gone": "yellow"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    _args.matrix(parser)
    _args.release_lock(parser)
    _args.since(parser, "the oldest release a fix's base is pinned to in the matrix")
    parser.add_argument("--lock", action="store_true", help="pin every new release's wheel sha256 into the lock")
    parser.add_argument("--pre", action="store_true", help="watch pre-releases too (listed, skipped by default)")
    parser.add_argument("--yanked", action="store_true", help="watch yanked releases too (listed, skipped by default)")


def _row(s: Sighting, package: str, locking: bool) -> tuple[str, ...]:
    """One release as the table shows it: the listed wheel, else the locked one."""
    file = s.release.file if s.release else (s.locked.file if s.locked else "")
    sha = (s.release.sha256 or "") if s.release else (s.locked.sha256 if s.locked else "")
    uploaded = (s.release.upload_time or "") if s.release else ""
    state = s.state if s.state != "new" or locking else "new (not locked; --lock pins it)"
    style = STYLE[s.state]
    tags = file.removeprefix(f"{package}-{s.version}-").removesuffix(".whl")
    return s.version, tags, sha[:12], uploaded[:10], f"[{style}]{state}[/{style}] {s.detail}".strip()


def _pin(out: Console, lock: ReleaseLock, report: LockReport) -> None:
    added = pin_new(lock, report)
    if not added:
        out.print(f"no new release; {lock.path} unchanged")
        return
    lock.save()
    for entry in added:
        out.print(f"new: {entry.version} pinned ({entry.file} sha256 {entry.sha256})")
    out.print(f"wrote {lock.path}")


def main(args: argparse.Namespace) -> int:
    out = Console(highlight=False)
    if args.lock:
        refuse_installed(args.lock_file, "--lock-file")
    matrix = load_matrix(args.matrix)
    floor = parse_floor(args.since) if args.since else matrix_floor(matrix.fixes, matrix.path)
    lock = load_lock(args.lock_file)
    settings = pip_settings()
    listing = IndexClient(settings).list(lock.package)
    report = compare(lock, listing, floor, matrix.releases, include_pre=args.pre, include_yanked=args.yanked)
    table = Table(title=f"{lock.package} releases from {floor} ({', '.join(listing.sources) or 'no index'})")
    for column in ("version", "wheel tags", "sha256", "uploaded", "state"):
        table.add_column(column, overflow="fold")
    for s in report.sightings:
        table.add_row(*_row(s, lock.package, args.lock))
    out.print(table)
    refuse_changes(report, lock)
    if args.lock:
        _pin(out, lock, report)
    return 0
