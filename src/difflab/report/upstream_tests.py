"""SGLang's own tests replayed (:mod:`difflab.upstream_tests`): their files in a results folder, and their
section of the folder's Markdown summary.

``upstream-tests.json`` (every fix: files with origin and sha256, per test its outcome on
each side and, for a base/head pair, its change; the agreement with the probe),
``upstream-tests.xml`` (JUnit, one case per fix and test: a pair's change, else each side's
outcome) and ``upstream-tests/<fix>/<side>.json|.xml|.log`` (one side's outcomes, its JUnit
and the test process's output). ``stale`` is a JUnit *skip* with its reason: a test whose
fakes no longer fit the code says nothing about behaviour, so it is neither red nor green.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from difflab.report.junit import Case, write_cases
from difflab.report.markdown import cell, table
from difflab.report.record import write_json
from difflab.upstream_tests.agreement import short
from difflab.upstream_tests.outcomes import Outcome
from difflab.upstream_tests.replay import FixReplay, SideRun

SCHEMA = 2
"""``upstream-tests.json``'s schema version."""
JSON = "upstream-tests.json"
JUNIT = "upstream-tests.xml"
FOLDER = "upstream-tests"
CHANGE_CASE = {
    "fixed": "passed",
    "still-passing": "passed",
    "regressed": "failed",
    "still-failing": "failed",
    "error": "error",
}


def document(replays: list[FixReplay], tests_dir: Path | None) -> dict[str, object]:
    return {
        "schema": SCHEMA,
        "tests_dir": str(tests_dir) if tests_dir else None,
        "fixes": [r.to_dict() for r in replays],
    }


def _explain(o: Outcome) -> str:
    bits = [o.why, f"{o.error_type}: {o.message}" if o.error_type else o.message]
    return "; ".join(b for b in bits if b)


def _outcome_case(classname: str, name: str, o: Outcome) -> Case:
    if o.outcome in ("passed", "failed", "error", "skipped"):
        return Case(classname, name, o.outcome, _explain(o), o.error_type or "", o.duration_s, stderr=o.traceback)
    return Case(classname, name, "skipped", f"stale: {_explain(o)}", "", o.duration_s, stderr=o.traceback)


def side_cases(replay: FixReplay, run: SideRun) -> Iterator[Case]:
    if run.status != "ok":
        yield Case(f"upstream.{replay.fix.id}.{run.side}", "(run)", "error", run.error or run.status, run.status)
    for tid, o in run.tests.items():
        file, _, name = tid.partition("::")
        yield _outcome_case(file.removesuffix(".py").replace("/", "."), name or tid, o)


def summary_cases(replays: list[FixReplay]) -> Iterator[Case]:
    for r in replays:
        classname = f"upstream.{r.fix.id}"
        if not r.rows:
            yield Case(classname, "(no tests)", "skipped", r.note or "no test ran")
        for row in r.rows:
            if r.pair:
                described = "; ".join(f"{s}: {o.outcome}" for s, o in row.outcomes.items())
                outcome = CHANGE_CASE.get(row.change or "", "skipped")
                yield Case(classname, short(row.id), outcome, f"{row.change}: {described}", row.change or "")
            else:
                for side, o in row.outcomes.items():
                    yield _outcome_case(classname, f"{short(row.id)} @ {side}", o)


def write_files(work: Path, replays: list[FixReplay], tests_dir: Path | None) -> Path:
    """Every file of the replay into ``work``; returns the path of ``upstream-tests.json``."""
    for r in replays:
        for name, run in r.sides.items():
            folder = work / FOLDER / r.fix.id
            folder.mkdir(parents=True, exist_ok=True)
            write_json(folder / f"{name}.json", run.to_dict())
            (folder / f"{name}.log").write_text(run.log)
            write_cases(folder / f"{name}.xml", f"upstream-tests.{r.fix.id}.{name}", side_cases(r, run))
    write_cases(work / JUNIT, "upstream-tests", summary_cases(replays))
    return write_json(work / JSON, document(replays, tests_dir))


def _cell(o: Outcome | None) -> str:
    return o.outcome if o else "—"


def section(replays: list[FixReplay]) -> list[str]:
    """The Markdown section: per fix the agreement, the files, and a row per test."""
    lines = ["", "## SGLang's own tests (supporting evidence)", ""]
    for r in replays:
        lines += [f"### {r.fix.label}", ""]
        if r.agreement:
            lines += [cell(r.agreement.text), ""]
        if r.note:
            lines += [f"Note: {cell(r.note)}", ""]
        for f in r.files:
            lines.append(f"- `{f.id}` from {cell(f.origin)} (sha256 `{f.sha256[:16]}`)")
        if not r.rows:
            lines.append("")
            continue
        sides = list(r.sides)
        headers = ["test", "own", *sides, *(["change"] if r.pair else [])]
        rows = [
            [f"`{short(row.id)}`", "✓" if row.own else "", *(_cell(row.outcomes.get(s)) for s in sides)]
            + ([row.change or ""] if r.pair else [])
            for row in r.rows
        ]
        lines += ["", *table(headers, rows), ""]
        grouped: dict[tuple[str, str, str], list[str]] = {}
        for row in r.rows:
            for side, o in row.outcomes.items():
                if o.outcome != "passed" and _explain(o):
                    grouped.setdefault((side, o.outcome, _explain(o)), []).append(f"`{short(row.id)}`")
        why = [f"- {side}, {kind}: {cell(text)} — {', '.join(ids)}" for (side, kind, text), ids in grouped.items()]
        if why:
            lines += ["<details><summary>why each test that did not pass did not</summary>", "", *why, "", "</details>"]
            lines.append("")
    return lines
