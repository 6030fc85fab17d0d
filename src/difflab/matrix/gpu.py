"""The GPU tier's part of the matrix: which live scenarios judge which fix, and what they must show.

``[gpu."<fix id>"]`` tables at the end of the matrix file, shaped like a fix's probes
(``[[gpu."<id>".probes]]`` with ``expect`` = [base, head] and ``controls``), so the GPU
verdicts come from :func:`difflab.diff.verdict.judge_fix` too; ``throughput = true`` also
runs the interleaved throughput A/B. Adding a fix to the GPU tier is one TOML edit. Errors
name the file, the fix and the field, as :mod:`difflab.matrix.load` does.
"""

from __future__ import annotations

import hashlib
import tomllib
from dataclasses import dataclass
from typing import Any

from difflab.errors import ConfigError
from difflab.matrix.load import _probe, _table, _Where
from difflab.matrix.model import Matrix, ProbeSpec


@dataclass(frozen=True)
class GpuPlan:
    """One fix's live scenarios (named like the probes they stand in for)."""

    probes: tuple[ProbeSpec, ...]
    throughput: bool = False


def load_gpu_plans(matrix: Matrix) -> dict[str, GpuPlan]:
    """Every ``[gpu."<id>"]`` table of ``matrix``'s file, checked; ``{}`` when it has none."""
    data = matrix.path.read_bytes()
    if hashlib.sha256(data).hexdigest() != matrix.sha256:
        raise ConfigError(f"{matrix.path}: changed since it was loaded; run again")
    w = _Where(matrix.path)
    tables = _table(w, "gpu", tomllib.loads(data.decode("utf-8")).get("gpu", {}))
    known = {f.id for f in matrix.fixes}
    return {fix_id: _plan(w, fix_id, raw, known) for fix_id, raw in tables.items()}


def _plan(w: _Where, fix_id: str, raw: Any, known: set[str]) -> GpuPlan:
    where = f"gpu.{fix_id!r}"
    if fix_id not in known:
        raise w.fail(where, f"no fix {fix_id!r} in this matrix (known: {', '.join(sorted(known))})")
    table = _table(w, where, raw)
    unknown = set(table) - {"probes", "throughput"}
    if unknown:
        raise w.fail(where, f"unknown field(s) {sorted(unknown)}")
    probes_raw = table.get("probes")
    if not isinstance(probes_raw, list) or not probes_raw:
        raise w.fail(f"{where}.probes", f'expected at least one [[gpu."{fix_id}".probes]] table')
    probes = tuple(_probe(w, f"{where}.probes[{i}]", p, channels_required=False) for i, p in enumerate(probes_raw))
    throughput = table.get("throughput", False)
    if not isinstance(throughput, bool):
        raise w.fail(f"{where}.throughput", "expected true or false")
    return GpuPlan(probes=probes, throughput=throughput)
