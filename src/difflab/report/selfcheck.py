"""The self-check's files: ``selfcheck.json``, ``selfcheck-junit.xml`` and ``selfcheck.md``.

Written beside a ``difflab selfcheck`` run's other files, or beside a ``difflab run --selfcheck``
run's verdicts. One JUnit case per mutation (causal passes, an error errs, anything else fails)
and one per fix for its hunk coverage (skipped for a fix with nothing to revert).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from difflab.diff.mutation import HunkCoverage, MutationResult, coverage_ratio, selfcheck_passed
from difflab.report.junit import Case, write_cases
from difflab.report.markdown import cell
from difflab.report.record import write_json

SCHEMA = 1
JSON_NAME, JUNIT_NAME, MARKDOWN_NAME = "selfcheck.json", "selfcheck-junit.xml", "selfcheck.md"
CASE_OUTCOME = {"causal": "passed", "error": "error"}


def document(results: list[MutationResult], coverage: list[HunkCoverage]) -> dict[str, Any]:
    covered, total = coverage_ratio(coverage)
    return {
        "schema": SCHEMA,
        "passed": selfcheck_passed(results, coverage) if coverage else all(r.passed for r in results),
        "hunk_coverage": {"covered": covered, "hunks": total, "fixes": [c.to_dict() for c in coverage]},
        "mutations": [r.to_dict() for r in results],
    }


def _coverage_case(c: HunkCoverage) -> Case:
    if not c.counted:  # nothing to revert (no head source, or no probe): said, never a passed case
        return Case(f"selfcheck.{c.fix}", "hunk-coverage", "skipped", c.note, "")
    if c.uncovered:
        return Case(
            f"selfcheck.{c.fix}",
            "hunk-coverage",
            "failed",
            "no causal mutation for: " + ", ".join(c.uncovered),
            "uncovered",
        )
    return Case(f"selfcheck.{c.fix}", "hunk-coverage")


def junit_cases(results: list[MutationResult], coverage: list[HunkCoverage]) -> Iterator[Case]:
    for r in results:
        yield Case(f"selfcheck.{r.fix}", r.mutation, CASE_OUTCOME.get(r.outcome, "failed"), r.reason, r.outcome)
    yield from (_coverage_case(c) for c in coverage)


def render_markdown(results: list[MutationResult], coverage: list[HunkCoverage]) -> str:
    covered, total = coverage_ratio(coverage)
    lines = [
        "# Causality self-check",
        "",
        "Each mutation reverts only the fix's essential lines in the head source; the targeted probes",
        "must return to the base behaviour while controls hold.",
        "",
        f"Hunk coverage: {covered}/{total} declared paths have a causal mutation.",
        "",
        "| fix | mutation | hunks | file | head | outcome | reason |",
        "|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r.fix} | `{r.mutation}` | {', '.join(r.hunks)} | `{r.file}` | {r.head} | {r.outcome} | {cell(r.reason)} |"
        for r in results
    ]
    if coverage:
        lines += ["", "| fix | paths | covered | not covered | note |", "|---|---|---|---|---|"]
        lines += [
            f"| {c.fix} | {len(c.hunks)} | {len(c.covered)} | {', '.join(c.uncovered) or '-'} | {cell(c.note or '-')} |"
            for c in coverage
        ]
    return "\n".join(lines) + "\n"


def write_selfcheck(folder: Path, results: list[MutationResult], coverage: list[HunkCoverage] | None = None) -> None:
    """selfcheck.json, selfcheck-junit.xml and selfcheck.md beside the run's other results."""
    coverage = coverage or []
    write_json(folder / JSON_NAME, document(results, coverage))
    write_cases(folder / JUNIT_NAME, "difflab-selfcheck", junit_cases(results, coverage))
    (folder / MARKDOWN_NAME).write_text(render_markdown(results, coverage))
