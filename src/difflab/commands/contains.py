"""``difflab contains``: a fix x release table of fixed / bug / partial / error / n/a."""

from __future__ import annotations

import argparse

from rich.table import Table

from difflab.commands import _args
from difflab.progress import Reporter
from difflab.workflows.contains import ContainsRequest, execute

NAME = "contains"
HELP = "run every fix's probes on every pinned release and tabulate which release carries which fix"
COLOURS = {"fixed": "green", "bug": "red", "partial": "yellow", "error": "bold red", "n/a": "dim"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    _args.add_selection(parser, "results/contains-<timestamp>", local_only=True)
    parser.add_argument(
        "--release",
        action="append",
        dest="releases",
        metavar="X.Y.Z",
        help="release to check (repeatable; default: every pinned release)",
    )
    _args.upstream_tests(parser)


def main(args: argparse.Namespace) -> int:
    reporter = Reporter()
    req = ContainsRequest(releases=args.releases, upstream_tests=args.upstream_tests, **_args.selection(args))
    fixes, releases, cells, out = execute(req, reporter)
    table = Table(title="which release carries which fix (by behaviour)")
    table.add_column("fix")
    for r in releases:
        table.add_column(r)
    by = {(c.fix, c.release): c for c in cells}
    for fix in fixes:
        row = []
        for r in releases:
            c = by[(fix.id, r)]
            mark = "" if c.agrees else f" [bold](expected {c.expected})[/bold]"
            row.append(f"[{COLOURS[c.verdict]}]{c.verdict}[/{COLOURS[c.verdict]}]{mark}")
        table.add_row(fix.label, *row)
    reporter.console.print(table)
    for c in cells:
        if c.detail:
            reporter.console.print(f"  {c.fix} @ {c.release}: {c.detail}")
    for c in cells:
        if c.upstream:
            reporter.console.print(f"  {c.fix} @ {c.release}: {c.upstream['text']}", markup=False)
    reporter.console.print(f"results: {out}")
    return 0 if all(c.agrees and c.verdict != "error" for c in cells) else 1
