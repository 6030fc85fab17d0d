"""``difflab selfcheck``: prove each probe observes the fix itself, not the release around it."""

from __future__ import annotations

import argparse

from rich.text import Text

from difflab.commands import _args
from difflab.progress import Reporter, data
from difflab.workflows.selfcheck import SelfcheckRequest, coverage_ratio, execute

NAME = "selfcheck"
HELP = "apply each fix's reverting mutations to its head source; the probes must flip back to base"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    _args.add_session(parser, "results/selfcheck-<timestamp>", local_only=True)


def main(args: argparse.Namespace) -> int:
    reporter = Reporter()
    outcome = execute(SelfcheckRequest(**_args.probe_options(args)), reporter)
    coverage = outcome.coverage
    for r in outcome.results:
        colour = "green" if r.passed else "red"
        line = Text.assemble(data(f"  {r.fix:>7} {r.mutation:<40} "), (r.outcome, colour), "  ", data(r.reason))
        reporter.console.print(line)
    covered, total = coverage_ratio(coverage)
    for c in coverage:
        if c.uncovered and c.counted:
            uncovered = data(", ".join(c.uncovered))
            reporter.console.print(
                Text.assemble(f"  {c.fix:>7} ", ("paths without a causal mutation", "red"), ": ", uncovered)
            )
    share = f"{100 * covered / total:.0f} %" if total else "n/a"
    reporter.console.print(f"hunk coverage: {covered}/{total} ({share})")
    reporter.console.print(data(f"results: {outcome.out_dir}"))
    return outcome.exit_code
