"""``difflab contains``: a fix x release table of present / absent / partial / not-applicable / error."""

from __future__ import annotations

import argparse
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from difflab.commands import _args
from difflab.diff.containment import ContainmentTable
from difflab.progress import Reporter, data
from difflab.report.family import answer_lines
from difflab.workflows.contains import ContainsRequest, execute

NAME = "contains"
HELP = "run every fix's probes on every pinned (--all: every locked) release; which release carries which fix"
COLOURS = {
    "present": "green",
    "absent": "red",
    "partial": "yellow",
    "error": "bold magenta",
    "not-applicable": "dim",
    "not-judged": "dim",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    _args.add_session(parser, "results/contains-<timestamp>", local_only=True, sources=False)
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


def _mark(c: Any) -> str:
    """One cell: its verdict, coloured, with a regression, a contradicted expectation and back ends noted."""
    mark = " [bold]▼ regression[/bold]" if c.regression else ""
    mark += "" if c.agrees else f" [bold](expected {c.expected})[/bold]"
    mark += f"\n[dim]{c.backend_note()}[/dim]" if c.backends else ""
    return f"[{COLOURS[c.verdict]}]{c.verdict}[/{COLOURS[c.verdict]}]{mark}"


def _grid(t: ContainmentTable) -> Table:
    grid = Table(title="which release carries which fix (by behaviour)")
    grid.add_column("fix")
    for r in t.releases:
        grid.add_column(r.version + (" (new)" if r.new else ""))
    for fix in t.fixes:
        grid.add_row(fix.label, *(_mark(t.cell(fix.id, r.version)) for r in t.releases))
    return grid


def _headlines(out: Console, t: ContainmentTable) -> None:
    """Regressions first, then the releases the matrix does not pin by hand."""
    for r in t.regressions:
        out.print(Text.assemble(("REGRESSION", "bold red"), " ", data(r.describe())))
    for r in t.new_releases:
        out.print(
            Text.assemble(("new release", "bold cyan"), " ", data(f"{r.version} (first seen {r.first_seen or 'now'})"))
        )


def _notes(out: Console, t: ContainmentTable) -> None:
    """Every cell that is neither plainly present nor absent, or contradicts the matrix; SGLang's own tests."""
    for c in t.cells:
        if c.verdict not in ("present", "absent") or not c.agrees:
            out.print(data(f"  {c.fix} @ {c.release}: {c.verdict}: {c.reason}"))
    for c in t.cells:
        if c.upstream:
            out.print(data(f"  {c.fix} @ {c.release}: {c.upstream['text']}"))


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
    out = Console(highlight=False)
    _headlines(out, outcome.table)
    out.print(_grid(outcome.table))
    for line in answer_lines(outcome.out_dir):  # the family's question, one line per release
        out.print(data(line))
    _notes(out, outcome.table)
    out.print(data(f"results: {outcome.out_dir} (contains.html, contains.md, contains.json, junit.xml)"))
    return outcome.exit_code
