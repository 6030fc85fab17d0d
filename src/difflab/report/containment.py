"""The release table's files: ``contains.json``, ``contains.md`` and its JUnit cases (one per fix x release).

Regressions come first in every form: they are what an operator acts on. A release the watch
discovered (not pinned by hand in the matrix) is marked *new*.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from difflab.diff.containment import ERROR, NOT_APPLICABLE, NOT_JUDGED, ContainmentTable
from difflab.report.grid import switch_notes
from difflab.report.junit import Case, write_cases
from difflab.report.markdown import cell as markdown_cell
from difflab.report.markdown import table as markdown_table
from difflab.report.record import write_json

SCHEMA = 2
JSON_NAME, MARKDOWN_NAME, JUNIT_NAME = "contains.json", "contains.md", "junit.xml"


def column_title(release: Any) -> str:
    marks = [m for m, on in (("new", release.new), ("pre-release", release.prerelease)) if on]
    if release.yanked is not None:
        marks.append("yanked")
    return release.version + (f" ({', '.join(marks)})" if marks else "")


def document(t: ContainmentTable, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """``contains.json``: releases, fixes, regressions, cells; ``extra`` (environments, lock) merged in."""
    return {
        **(extra or {}),
        "schema": SCHEMA,
        "releases": [r.to_dict() for r in t.releases],
        "new_releases": [r.version for r in t.new_releases],
        "fixes": [{"id": f.id, "label": f.label, "title": f.title} for f in t.fixes],
        "regressions": [vars(r) for r in t.regressions],
        "cells": [c.to_dict() for c in t.cells],
        "agrees": not t.disagreements,
        "exit_code": t.exit_code,
    }


def render_markdown(t: ContainmentTable) -> str:
    lines = ["# Which SGLang release carries which fix (by behaviour)", ""]
    if t.regressions:
        lines += [f"## Regressions ({len(t.regressions)})", ""]
        lines += [f"- **{r.label}** {r.describe().removeprefix(r.label + ' ')}" for r in t.regressions]
    else:
        lines.append("No regressions: no fix present in a release is absent or partial in a later one.")
    lines.append("")
    if t.new_releases:
        lines += ["## New releases", ""]
        lines += [
            f"- {r.version}: first seen {r.first_seen or 'now'}, not pinned in the matrix (`{r.file}`)"
            for r in t.new_releases
        ]
        lines.append("")
    rows = []
    for fix in t.fixes:
        row: list[object] = [fix.label]
        for r in t.releases:
            c = t.cell(fix.id, r.version)
            text = c.verdict + (" ⚠ regression" if c.regression else "")
            if not c.agrees:
                text += f" (expected {c.expected})"
            if c.backends:
                text += f" ({c.backend_note()})"
            row.append(text)
        rows.append(row)
    lines += markdown_table(["fix", *(column_title(r) for r in t.releases)], rows)
    notes = [c for c in t.cells if c.verdict not in ("present", "absent") or not c.agrees]
    if notes:
        lines += ["", "## Details", ""] + [f"- {c.fix} @ {c.release}: {c.verdict}: {c.reason}" for c in notes]
    switches = switch_notes(t)  # a verdict that holds only with a switch forced must say so, as the grid does
    if switches:
        lines += ["", "## Switches the probes forced", ""]
        lines += [f"- {s['fix_label']} ({', '.join(s['releases'])}): {markdown_cell(s['note'])}" for s in switches]
    return "\n".join(lines) + "\n"


def junit_cases(t: ContainmentTable) -> Iterable[Case]:
    """A case per fix x release: a regression or a contradicted expectation fails, an error errs, n/a skips."""
    for fix in t.fixes:
        for r in t.releases:
            c = t.cell(fix.id, r.version)
            message = f"{c.verdict}: {c.reason}" if c.reason else c.verdict
            if c.regression:
                outcome, kind = "failed", "regression"
                message = f"regression: {message}"
            elif c.verdict == ERROR:
                outcome, kind = "error", "error"
            elif not c.agrees:
                outcome, kind = "failed", "unexpected"
                message = f"expected {c.expected}, got {message}"
            elif c.verdict in (NOT_APPLICABLE, NOT_JUDGED):
                outcome, kind = "skipped", ""
            else:
                outcome, kind = "passed", ""
            probes = "\n".join(f"{name}: {p.like} ({p.observation})" for name, p in c.probes.items())
            yield Case(f"contains.{fix.id}", r.version, outcome, message, kind, stdout=probes or None)


def write_files(
    folder: Path, t: ContainmentTable, extra: dict[str, Any] | None = None, appendix: Sequence[str] = ()
) -> None:
    """contains.json, contains.md (with ``appendix``: e.g. SGLang's own tests) and junit.xml into the run folder."""
    write_json(folder / JSON_NAME, document(t, extra))
    text = render_markdown(t) + "".join(f"{line}\n" for line in appendix)
    (folder / MARKDOWN_NAME).write_text(text, encoding="utf-8")
    write_cases(folder / JUNIT_NAME, "difflab.contains", junit_cases(t))
