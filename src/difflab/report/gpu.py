"""The GPU tier's files (``difflab gpu``): the usual verdict files plus what only a live deployment has.

``deployment/<target>.json`` (how each distinct target was deployed), ``preflight/<target>.json``
(the engine facts' gates), ``throughput/<fix>/ab.json`` (the interleaved A/B rounds) and
diff.json, junit.xml and summary.md as for every run, diff.json marked ``tier: gpu`` and the
summary followed by the tier's own sections (throughput, preflight).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from difflab.diff.verdict import FixVerdict
from difflab.report import write_reports
from difflab.report.record import write_json
from difflab.report.results import SCHEMA

__all__ = ["SCHEMA", "write_ab", "write_deployment", "write_preflight", "write_tier"]
"""diff.json (``SCHEMA``) is the tier's versioned document; the per-target files are its evidence."""

DEPLOYMENT, PREFLIGHT, THROUGHPUT = "deployment", "preflight", "throughput"


def write_deployment(work: Path, key: str, described: Mapping[str, Any]) -> Path:
    """How one target was deployed (image, GPUs, flags); values JSON lacks (paths) as text."""
    (work / DEPLOYMENT).mkdir(exist_ok=True)
    path = work / DEPLOYMENT / f"{key}.json"
    path.write_text(json.dumps(dict(described), indent=2, default=str) + "\n")
    return path


def write_preflight(work: Path, key: str, report: Mapping[str, Any]) -> Path:
    """One target's preflight gates, from the engine facts it served."""
    (work / PREFLIGHT).mkdir(exist_ok=True)
    return write_json(work / PREFLIGHT / f"{key}.json", dict(report))


def write_ab(work: Path, fix_id: str, ab: Mapping[str, Any]) -> Path:
    """One fix's throughput A/B: every round and the pairwise comparison (beside the rounds' own logs)."""
    path = work / THROUGHPUT / fix_id / "ab.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(dict(ab), indent=2) + "\n")
    return path


def write_tier(work: Path, verdicts: list[FixVerdict], *, testserver: bool, sections: Sequence[str] = ()) -> None:
    """diff.json, junit.xml and summary.md for the tier; ``sections`` (Markdown lines) end the summary."""
    mode = "testserver" if testserver else "docker"
    title = "SGLang GPU/RDMA tier" + (" (test server: pre-fix switches on base, off on head)" if testserver else "")
    write_reports(work, verdicts, title=title, suite="difflab-gpu", extra={"tier": "gpu", "mode": mode})
    if sections:
        with (work / "summary.md").open("a") as fh:
            fh.write("\n".join(sections) + "\n")
