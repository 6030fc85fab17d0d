"""``difflab contains``: a fix x release table of fixed / bug / partial / error / n/a."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.table import Table

from difflab.environment.shared import SharedEnvironment
from difflab.paths import default_matrix
from difflab.progress import Reporter
from difflab.workflows.contains import run_contains
from difflab.workflows.run import RunRequest, make_runner

NAME = "contains"
HELP = "run every fix's probes on every pinned release and tabulate which release carries which fix"
COLOURS = {"fixed": "green", "bug": "red", "partial": "yellow", "error": "bold red", "n/a": "dim"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--matrix", type=Path, default=default_matrix())
    parser.add_argument("--fix", action="append", dest="fixes", metavar="N")
    parser.add_argument(
        "--release",
        action="append",
        dest="releases",
        metavar="X.Y.Z",
        help="release to check (repeatable; default: every pinned release)",
    )
    parser.add_argument("--out", type=Path, help="folder for contains.json / contains.md")
    parser.add_argument("--backend", dest="runner", choices=["subprocess", "warm"], default="warm")
    parser.add_argument("--no-cache", dest="use_cache", action="store_false")


def main(args: argparse.Namespace) -> int:
    reporter = Reporter()
    env = SharedEnvironment()
    env.ensure(progress=reporter.say)
    runner = make_runner(RunRequest(runner=args.runner, use_cache=args.use_cache), env)
    fixes, releases, cells, out = run_contains(
        args.matrix, args.fixes, args.releases, args.out, runner, env, reporter.track
    )
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
    reporter.console.print(f"results: {out}")
    return 0 if all(c.agrees and c.verdict != "error" for c in cells) else 1
