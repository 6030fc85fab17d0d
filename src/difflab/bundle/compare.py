"""Compare a re-run with the recorded run: same verdicts, same observed fields, same sources.

Reads two run folders and nothing else; environment drift is a note, not a difference.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from difflab.bundle import layout
from difflab.probe.kit import DEFAULT_BACKEND, backend_field

# Observation attributes compared besides the per-field values.
COMPARED_ATTRIBUTES = ("status", "source", "sglang_version")
SOURCE_KEYS_SINCE = {"tree_sha256": 2}
"""Source identity keys by the observation schema that introduced them: an older recording
cannot hold them, so they are left out of its comparison (and noted), not reported as changed."""


@dataclass(frozen=True)
class Difference:
    """One thing that came out differently; ``where`` names fix, side, probe and field."""

    where: str
    recorded: Any
    now: Any

    def __str__(self) -> str:
        return (
            f"{self.where}: recorded {json.dumps(self.recorded, sort_keys=True)}, "
            f"now {json.dumps(self.now, sort_keys=True)}"
        )


@dataclass
class ReproduceReport:
    differences: list[Difference] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    rerun_dir: Path | None = None

    @property
    def matches(self) -> bool:
        return not self.differences


def _read(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _verdicts(run_dir: Path) -> dict[str, Any]:
    diff = _read(run_dir / layout.DIFF_JSON) or {}
    fixes = [f for f in diff.get("fixes") or [] if isinstance(f, dict)]
    return {str(f.get("id", f.get("fix"))): f.get("verdict") for f in fixes}


def _observations(run_dir: Path) -> dict[str, Any]:
    files = layout.scan(run_dir).files
    return {rel: _read(run_dir / rel) for group in layout.observation_groups(files).values() for rel in group}


def _where(rel: str) -> str:
    _, fix, side, name = rel.split("/")
    return f"fix {fix} {side} {name[: -len('.json')]}"


def _compare_observation(rel: str, old: dict[str, Any], new: dict[str, Any], notes: list[str]) -> Iterator[Difference]:
    """Every recorded field must come out the same; a field only the re-run observes is a note.

    Probe code may observe more than it did when the bundle was made (a new
    scenario); what the recording holds is still checked field by field.
    """
    now = dict(new)
    schema = old.get("schema") if isinstance(old.get("schema"), int) else 1
    if isinstance(new.get("source"), dict):
        newer = {k for k, since in SOURCE_KEYS_SINCE.items() if schema < since and k in new["source"]}
        now["source"] = {k: v for k, v in new["source"].items() if k not in newer}
    for attribute in COMPARED_ATTRIBUTES:
        if old.get(attribute) != now.get(attribute):
            yield Difference(f"{_where(rel)} {attribute}", old.get(attribute), now.get(attribute))
    old_fields, new_fields = old.get("fields") or {}, new.get("fields") or {}
    # Recorded before its probe observed each transport back end: what it holds is what the
    # server's default back end showed, which the re-run names ``<default>:<field>``.
    renamed = {
        name: backend_field(DEFAULT_BACKEND, name)
        for name in old_fields
        if name not in new_fields and backend_field(DEFAULT_BACKEND, name) in new_fields
    }
    new_fields = {k: v for k, v in new_fields.items() if k not in renamed.values()} | {
        old_name: new_fields[new_name] for old_name, new_name in renamed.items()
    }
    if renamed:
        notes.append(
            f"{_where(rel)}: recorded before per-back-end fields; compared with the re-run's {DEFAULT_BACKEND}"
        )
    for name in sorted(old_fields):
        if old_fields[name] != new_fields.get(name, _MISSING):
            yield Difference(f"{_where(rel)} field {name}", old_fields[name], new_fields.get(name, "(absent)"))
    added = sorted(set(new_fields) - set(old_fields))
    if added:
        notes.append(f"{_where(rel)}: the re-run also observed {len(added)} field(s) not recorded: {', '.join(added)}")


_MISSING = object()


def _throughput(run_dir: Path) -> dict[str, Any]:
    diff = _read(run_dir / layout.DIFF_JSON) or {}
    fixes = [f for f in diff.get("fixes") or [] if isinstance(f, dict) and isinstance(f.get("throughput"), dict)]
    return {str(f.get("id", f.get("fix"))): f["throughput"] for f in fixes}


def _compare_throughput(old: dict[str, Any], new: dict[str, Any], notes: list[str]) -> Iterator[Difference]:
    """A timing never repeats exactly: the re-run's ratio must fall inside the recorded interval.

    Outside it but with overlapping intervals is a note (two noisy estimates of one ratio);
    disjoint intervals are a difference.
    """
    for fix, recorded in sorted(old.items()):
        ci, ratio = recorded.get("ci"), recorded.get("ratio")
        if recorded.get("status") != "ok" or not ci or ratio is None:
            continue
        now = new.get(fix) or {}
        now_ratio, now_ci = now.get("ratio"), now.get("ci") or [now.get("ratio")] * 2
        where = f"fix {fix} throughput ratio"
        if now.get("status") != "ok" or now_ratio is None:
            yield Difference(where, ratio, now.get("status") or "(absent)")
        elif not ci[0] <= now_ratio <= ci[1]:
            if now_ci[1] < ci[0] or now_ci[0] > ci[1]:
                yield Difference(f"{where} (recorded 95% CI {ci[0]:.3f}-{ci[1]:.3f})", ratio, now_ratio)
            else:
                span = f"{ci[0]:.3f}-{ci[1]:.3f}"
                notes.append(f"{where}: {now_ratio:.3f} is outside the recorded CI {span}; the intervals overlap")


def compare_runs(recorded: Path, rerun: Path) -> ReproduceReport:
    """Differences in verdicts and observations; environment drift is a note, not a difference."""
    report = ReproduceReport(rerun_dir=rerun)
    old_verdicts, new_verdicts = _verdicts(recorded), _verdicts(rerun)
    for fix in sorted(set(old_verdicts) | set(new_verdicts)):
        old, new = old_verdicts.get(fix, "(absent)"), new_verdicts.get(fix, "(absent)")
        if old != new:
            report.differences.append(Difference(f"fix {fix} verdict", old, new))
    report.differences.extend(_compare_throughput(_throughput(recorded), _throughput(rerun), report.notes))
    old_obs, new_obs = _observations(recorded), _observations(rerun)
    for rel in layout.bytewise(set(old_obs) | set(new_obs)):
        old, new = old_obs.get(rel), new_obs.get(rel)
        if not isinstance(old, dict) or not isinstance(new, dict):
            presence = ("present" if old else "(absent)", "present" if new else "(absent)")
            report.differences.append(Difference(f"{_where(rel)} observation", *presence))
            continue
        report.differences.extend(_compare_observation(rel, old, new, report.notes))
    report.notes.extend(_environment_notes(recorded, rerun))
    return report


def _environment_notes(recorded: Path, rerun: Path) -> Iterator[str]:
    old = _read(recorded / layout.ENVIRONMENT_JSON) or {}
    new = _read(rerun / layout.ENVIRONMENT_JSON) or {}
    if old.get("python_version") != new.get("python_version"):
        yield f"environment: Python {new.get('python_version')} now, {old.get('python_version')} recorded"
    old_pkgs, new_pkgs = set(old.get("packages") or []), set(new.get("packages") or [])
    for package in sorted(old_pkgs - new_pkgs):
        yield f"environment: recorded {package} is not installed now"
    for package in sorted(new_pkgs - old_pkgs):
        yield f"environment: {package} installed now, not recorded"
