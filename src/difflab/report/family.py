"""The family answer beside the per-fix table: ``family.json`` and the Markdown section.

``backport`` and ``contains`` call :func:`write_family` with the per-fix verdicts they already
judged; it writes ``family.json`` into the run folder and returns the lines their summary
appends. ``defaults`` adds, per build, the configuration-only defences the build ships with
(:mod:`difflab.preflight.defaults`), since no probe can judge a switch an operator sets.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from difflab.diff.family import FamilyReport, judge_families
from difflab.matrix.model import Matrix
from difflab.report.markdown import cell, table
from difflab.report.record import write_json

SCHEMA = 1
JSON_NAME = "family.json"


def render_lines(reports: Sequence[FamilyReport], defaults: Mapping[str, Sequence[str]] | None = None) -> list[str]:
    """One section per family: a line per build, then each build's configuration defaults if read."""
    lines: list[str] = []
    for report in reports:
        lines += ["", f"## Family `{report.family.name}`: {cell(report.family.title)}", ""]
        rows = [(cell(b.build), ("✅ " if b.safe else "❌ ") + cell(b.line())) for b in report.builds]
        lines += table(("build", "answer"), rows)
    for build, found in (defaults or {}).items():
        lines += ["", f"### Configuration-only defences: {cell(build)}'s defaults", ""]
        lines += [f"- {cell(line)}" for line in found]
    return lines


def write_family(
    folder: Path,
    matrix: Matrix,
    per_build: Mapping[str, Mapping[str, str]],
    defaults: Mapping[str, Sequence[Any]] | None = None,
) -> list[str]:
    """Judge every family on every build, write ``family.json``, return the summary's lines (none: no family)."""
    reports = judge_families(matrix.families.values(), matrix.fixes, per_build)
    described = {build: [d.describe() for d in found] for build, found in (defaults or {}).items()}
    if not reports and not described:
        return []
    doc = {
        "schema": SCHEMA,
        "families": [r.to_dict() for r in reports],
        "defaults": {build: [d.to_dict() for d in found] for build, found in (defaults or {}).items()},
    }
    write_json(folder / JSON_NAME, doc)
    return render_lines(reports, described)


def answer_lines(folder: Path) -> list[str]:
    """``family <name> @ <build>: <answer>``, one per build, from a run folder's family.json (none: no file)."""
    path = folder / JSON_NAME
    if not path.is_file():
        return []
    doc = json.loads(path.read_text())
    return [f"family {f['family']} @ {b['build']}: {b['line']}" for f in doc.get("families", []) for b in f["builds"]]
