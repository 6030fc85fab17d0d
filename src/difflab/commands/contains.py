"""``difflab contains``: a fix x release table of present / absent / partial / not-applicable / error."""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.table import Table
from rich.text import Text

from difflab.commands import _args
from difflab.progress import Reporter, data
from difflab.report.family import answer_lines
from difflab.workflows.contains import ContainsRequest, execute

NAME = "contains"
HELP = "run every fix's probes on every pinned (--all: every locked) release; which release carries which fix"
COLOURS = {"present": "green", "absent": "red", "partial": "yellow", "error": "bold magenta", "not-applicable": "dim"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    _args.add_selection(parser, "results/contains-<timestamp>", local_only=True)
    _args.timeout(parser)
    _args.bundle(parser)
    parser.add_argument(
        "--all",
        dest="all_releases",
        action="store_true",
        help="every release in the release lock (difflab releases --lock), not only the matrix's own",
    )
    _args.release_lock(parser)
    _args.since(parser, "every release in the lock or the matrix")
    parser.add_argument(
        "--release",
        action="append",
        dest="releases",
        metavar="X.Y.Z",
        help="release to check (repeatable; default: every pinned release, with --all every locked one)",
    )
    _args.upstream_tests(parser)


def main(args: argparse.Namespace) -> int:
    reporter = Reporter()
    req = ContainsRequest(
        releases=args.releases,
        all_releases=args.all_releases,
        lock=args.lock_file,
        since=args.since,
        upstream_tests=args.upstream_tests,
        **_args.probe_options(args),
    )
    outcome = execute(req, reporter)
    t = outcome.table
    out = Console(highlight=False)
    for r in t.regressions:
        out.print(Text.assemble(("REGRESSION", "bold red"), " ", data(r.describe())))
    for r in t.new_releases:
        out.print(
            Text.assemble(("new release", "bold cyan"), " ", data(f"{r.version} (first seen {r.first_seen or 'now'})"))
        )
    grid = Table(title="which release carries which fix (by behaviour)")
    grid.add_column("fix")
    for r in t.releases:
        grid.add_column(r.version + (" (new)" if r.new else ""))
    for fix in t.fixes:
        row = []
        for r in t.releases:
            c = t.cell(fix.id, r.version)
            mark = " [bold]▼ regression[/bold]" if c.regression else ""
            mark += "" if c.agrees else f" [bold](expected {c.expected})[/bold]"
            mark += f"\n[dim]{c.backend_note()}[/dim]" if c.backends else ""
            row.append(f"[{COLOURS[c.verdict]}]{c.verdict}[/{COLOURS[c.verdict]}]{mark}")
        grid.add_row(fix.label, *row)
    out.print(grid)
    for line in answer_lines(outcome.out_dir):  # the family's question, one line per release
        out.print(data(line))
    for c in t.cells:
        if c.verdict not in ("present", "absent") or not c.agrees:
            out.print(data(f"  {c.fix} @ {c.release}: {c.verdict}: {c.reason}"))
    for c in t.cells:
        if c.upstream:
            out.print(data(f"  {c.fix} @ {c.release}: {c.upstream['text']}"))
    out.print(data(f"results: {outcome.out_dir} (contains.html, contains.md, contains.json, junit.xml)"))
    return outcome.exit_code
