"""``difflab selfcheck``: prove each probe observes the fix itself, not the release around it."""

from __future__ import annotations

import argparse

from rich.text import Text

from difflab.commands import _args
from difflab.progress import Reporter, data
from difflab.workflows.selfcheck import SelfcheckRequest, coverage_ratio, execute, selfcheck_passed

NAME = "selfcheck"
HELP = "apply each fix's reverting mutations to its head source; the probes must flip back to base"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    _args.add_selection(parser, "results/selfcheck-<timestamp>", local_only=True)


def main(args: argparse.Namespace) -> int:
    reporter = Reporter()
    results, coverage, out = execute(SelfcheckRequest(**_args.selection(args)), reporter)
    for r in results:
        colour = "green" if r.passed else "red"
        line = Text.assemble(data(f"  {r.fix:>7} {r.mutation:<40} "), (r.outcome, colour), "  ", data(r.reason))
        reporter.console.print(line)
    covered, total = coverage_ratio(coverage)
    for c in coverage:
        if c.uncovered and not c.note.startswith("head unavailable"):
            uncovered = data(", ".join(c.uncovered))
            reporter.console.print(
                Text.assemble(f"  {c.fix:>7} ", ("paths without a causal mutation", "red"), ": ", uncovered)
            )
    share = f"{100 * covered / total:.0f} %" if total else "n/a"
    reporter.console.print(f"hunk coverage: {covered}/{total} ({share})")
    reporter.console.print(data(f"results: {out}"))
    return 0 if selfcheck_passed(results, coverage) else 1
