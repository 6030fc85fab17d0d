"""``contains.html``: the fix x release grid an operator opens to answer "which release do I need?".

One static, self-contained page (inline CSS, no script, no remote resource): a colour per
verdict, regressions listed first and marked in their cells, new releases flagged, and every
cell linking to its observation files in the run folder (relative links, so the page works
from the folder and from the unpacked bundle). Rendered by Jinja2 with autoescaping, since
reasons quote SGLang's own error text.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from jinja2 import Environment, PackageLoader, StrictUndefined

from difflab.diff.containment import ABSENT, PRESENT, VERDICTS, Cell, ContainmentTable

HTML_NAME = "contains.html"
TEMPLATE = "contains.html.j2"
PLAIN = (PRESENT, ABSENT)
"""Cells whose reason the page leaves to the tooltip and the observation; the rest are spelt out."""


def probe_title(probe: str) -> str:
    """``pr38935_prefill_door`` -> ``prefill door``."""
    return re.sub(r"^pr\d+_", "", probe).replace("_", " ")


def _cell_view(c: Cell, label: str) -> dict[str, Any]:
    links = [{"name": probe_title(name), "href": p.observation} for name, p in c.probes.items() if p.observation]
    return {
        "fix": c.fix,
        "fix_label": label,
        "release": c.release,
        "verdict": c.verdict,
        "expected": c.expected,
        "agrees": c.agrees,
        "regression": c.regression,
        "reason": c.reason,
        "links": links,
        "backend_note": c.backend_note(),
    }


def switch_notes(t: ContainmentTable) -> list[dict[str, Any]]:
    """Each switch a fix's probes forced, once, with the releases it was said of."""
    found: dict[tuple[str, str], list[str]] = {}
    labels = {f.id: f.label for f in t.fixes}
    for c in t.cells:
        for note in c.notes:
            found.setdefault((c.fix, note), []).append(c.release)
    return [{"fix_label": labels[fix], "note": note, "releases": rs} for (fix, note), rs in found.items()]


def render_html(t: ContainmentTable, meta: dict[str, Any]) -> str:
    env = Environment(
        loader=PackageLoader("difflab.report", "templates"),
        autoescape=True,  # one template, HTML: reasons quote SGLang's own error text
        undefined=StrictUndefined,
        keep_trailing_newline=True,
    )
    rows = [
        {"fix": fix, "cells": [_cell_view(t.cell(fix.id, r.version), fix.label) for r in t.releases]} for fix in t.fixes
    ]
    details = [
        c for row in rows for c in row["cells"] if c["verdict"] not in PLAIN or c["regression"] or not c["agrees"]
    ]
    return env.get_template(TEMPLATE).render(
        details=details,
        switches=switch_notes(t),
        fixes=t.fixes,
        releases=t.releases,
        rows=rows,
        regressions=t.regressions,
        new_releases=t.new_releases,
        verdicts=VERDICTS,
        meta=meta,
    )


def write_html(folder: Path, t: ContainmentTable, meta: dict[str, Any]) -> Path:
    path = folder / HTML_NAME
    path.write_text(render_html(t, meta), encoding="utf-8")
    return path
