"""Re-run a bundle's pins and compare: same verdicts, same observed fields, same sources.

The executor that performs the re-run is injectable: by default it is the lab's pipeline
(imported only when used), in tests a stub that writes a run folder.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from difflab.bundle import layout, pack
from difflab.bundle.trust import TrustPolicy
from difflab.bundle.verify import verify_folder
from difflab.errors import ConfigError, VerificationFailed

# Observation attributes compared besides the per-field values.
COMPARED_ATTRIBUTES = ("status", "source", "sglang_version")


@dataclass(frozen=True)
class RerunSpec:
    """What the recorded run asked for; handed to the executor."""

    matrix: Path
    fixes: list[str] | None
    out: Path
    source_kind: str
    repo: str | None
    runner: str
    sides: tuple[str, ...] | None = None  # only for a one-side (``observe``) recording


Executor = Callable[[RerunSpec], Path]


def pipeline_executor(spec: RerunSpec) -> Path:
    """Run through :mod:`difflab.workflows.run` without bundling; returns the new run folder.

    The result cache is bypassed: a reproduction re-executes every probe.
    """
    from difflab.workflows.run import RunRequest, execute

    options = {} if spec.sides is None else {"sides": spec.sides}
    outcome = execute(
        RunRequest(
            matrix=spec.matrix,
            fixes=spec.fixes,
            out=spec.out,
            source_kind=spec.source_kind,
            repo=spec.repo,
            runner=spec.runner,
            bundle=False,
            use_cache=False,
            **options,
        )
    )
    return Path(outcome.out_dir)


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


def spec_for(bundle_root: Path, out: Path) -> RerunSpec:
    """The re-run request from the bundle's own run.json and matrix.toml."""
    try:
        run = json.loads((bundle_root / layout.RUN_JSON).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{bundle_root / layout.RUN_JSON}: cannot read ({exc})") from None
    fixes = run.get("fixes")
    sides = run.get("sides")
    one_side = isinstance(sides, list) and sorted(sides) != sorted(layout.SIDES)
    return RerunSpec(
        matrix=bundle_root / layout.MATRIX,
        fixes=[str(f) for f in fixes] if fixes else None,
        out=out,
        source_kind=str(run.get("source_kind") or "release"),
        repo=run.get("repo"),
        runner=str((run.get("runner") or {}).get("name") or "subprocess"),
        sides=tuple(str(s) for s in sides) if one_side else None,
    )


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


def _compare_observation(rel: str, old: dict[str, Any], new: dict[str, Any]) -> Iterator[Difference]:
    for attribute in COMPARED_ATTRIBUTES:
        if old.get(attribute) != new.get(attribute):
            yield Difference(f"{_where(rel)} {attribute}", old.get(attribute), new.get(attribute))
    old_fields, new_fields = old.get("fields") or {}, new.get("fields") or {}
    for name in sorted(set(old_fields) | set(new_fields)):
        if old_fields.get(name, _MISSING) != new_fields.get(name, _MISSING):
            yield Difference(
                f"{_where(rel)} field {name}", old_fields.get(name, "(absent)"), new_fields.get(name, "(absent)")
            )


_MISSING = object()


def compare_runs(recorded: Path, rerun: Path) -> ReproduceReport:
    """Differences in verdicts and observations; environment drift is a note, not a difference."""
    report = ReproduceReport(rerun_dir=rerun)
    old_verdicts, new_verdicts = _verdicts(recorded), _verdicts(rerun)
    for fix in sorted(set(old_verdicts) | set(new_verdicts)):
        old, new = old_verdicts.get(fix, "(absent)"), new_verdicts.get(fix, "(absent)")
        if old != new:
            report.differences.append(Difference(f"fix {fix} verdict", old, new))
    old_obs, new_obs = _observations(recorded), _observations(rerun)
    for rel in layout.bytewise(set(old_obs) | set(new_obs)):
        old, new = old_obs.get(rel), new_obs.get(rel)
        if not isinstance(old, dict) or not isinstance(new, dict):
            presence = ("present" if old else "(absent)", "present" if new else "(absent)")
            report.differences.append(Difference(f"{_where(rel)} observation", *presence))
            continue
        report.differences.extend(_compare_observation(rel, old, new))
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


def reproduce(
    path: Path,
    trust: TrustPolicy | None,
    *,
    out: Path | None = None,
    executor: Executor | None = None,
) -> ReproduceReport:
    """Verify the bundle (signatures too, unless ``trust`` is None), re-run it, compare.

    With ``out`` unset the re-run goes to a temporary folder that is removed afterwards.
    """
    executor = executor or pipeline_executor
    with pack.opened(path) as root:
        problems = verify_folder(root, trust).problems
        if problems:
            raise VerificationFailed(
                "refusing to reproduce a bundle that does not verify:\n" + "\n".join(f"  {p}" for p in problems)
            )
        if out is not None:
            if out.exists():
                raise ConfigError(f"{out}: already exists; choose a new folder for the re-run")
            return _run_and_compare(root, out, executor)
        with tempfile.TemporaryDirectory(prefix="difflab-reproduce-") as tmp:
            report = _run_and_compare(root, Path(tmp) / "rerun", executor)
            report.rerun_dir = None
            return report


def _run_and_compare(root: Path, out: Path, executor: Executor) -> ReproduceReport:
    rerun = executor(spec_for(root, out))
    if not (rerun / layout.DIFF_JSON).is_file():
        raise VerificationFailed(f"{rerun}: the re-run wrote no {layout.DIFF_JSON}; nothing to compare")
    return compare_runs(root, rerun)
