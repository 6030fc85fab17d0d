"""``diff.json``: the machine-readable verdicts with every observation inline."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from difflab.diff.throughput import ThroughputResult
from difflab.diff.verdict import FixVerdict
from difflab.observation import SCHEMA_VERSION
from difflab.report.record import write_json

SCHEMA = SCHEMA_VERSION
"""diff.json's schema version: that of the observations it carries inline."""


def diff_document(
    verdicts: list[FixVerdict],
    extra: dict[str, Any] | None = None,
    throughput: list[ThroughputResult] | None = None,
) -> dict[str, Any]:
    """Every fix's verdict; with a throughput A/B, its ``throughput`` part in the fix's entry."""
    measured = {r.fix: r.to_dict() for r in throughput or []}
    fixes = [v.to_dict() | ({"throughput": measured[v.id]} if v.id in measured else {}) for v in verdicts]
    doc: dict[str, Any] = {"schema": SCHEMA, "fixes": fixes}
    doc["passed"] = all(v.passed for v in verdicts)
    if extra:
        doc.update(extra)
    return doc


def write_diff_json(
    path: Path,
    verdicts: list[FixVerdict],
    extra: dict[str, Any] | None = None,
    throughput: list[ThroughputResult] | None = None,
) -> None:
    write_json(path, diff_document(verdicts, extra, throughput))
