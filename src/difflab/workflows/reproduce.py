"""``difflab reproduce``: verify a bundle, re-run its pins, compare (:mod:`difflab.bundle.compare`).

The executor that performs the re-run is injectable: by default it is the lab's run
workflow, in tests a stub that writes a run folder.

Without verified signatures (``--skip-signatures``) nobody vouches for the bundle, so it may not
choose what runs: the re-run needs a hermetic back end (Docker: no network, the source read-only)
and, for a git bundle, the repository given by the user (``--repo``), never the one in its run.json.
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from difflab.bundle import layout, pack
from difflab.bundle.compare import ReproduceReport, compare_runs
from difflab.bundle.trust import TrustPolicy
from difflab.bundle.verify import verify_folder
from difflab.errors import ConfigError, VerificationFailed
from difflab.observation import SIDES
from difflab.provenance import mismatches
from difflab.runner import RUNNERS, runner_class
from difflab.workflows.run import RunRequest, execute
from difflab.workflows.throughput import ThroughputOptions


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
    throughput: dict[str, Any] | None = None  # the recorded --throughput settings, if any


Executor = Callable[[RerunSpec], Path]


def pipeline_executor(spec: RerunSpec) -> Path:
    """Run through :mod:`difflab.workflows.run` without bundling; returns the new run folder.

    The result cache is bypassed: a reproduction re-executes every probe.
    """
    fields = {k: getattr(spec, k) for k in ("matrix", "fixes", "out", "source_kind", "repo", "runner")}
    if spec.sides is not None:
        fields["sides"] = spec.sides
    if spec.throughput is not None:
        fields["throughput"] = ThroughputOptions.from_record(spec.throughput)
    return execute(RunRequest(**fields, bundle=False, use_cache=False)).out_dir


def spec_for(bundle_root: Path, out: Path) -> RerunSpec:
    """The re-run request from the bundle's own run.json and matrix.toml."""
    try:
        run = json.loads((bundle_root / layout.RUN_JSON).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{bundle_root / layout.RUN_JSON}: cannot read ({exc})") from None
    fixes = run.get("fixes")
    sides = run.get("sides")
    one_side = isinstance(sides, list) and sorted(sides) != sorted(SIDES)
    return RerunSpec(
        matrix=bundle_root / layout.MATRIX,
        fixes=[str(f) for f in fixes] if fixes else None,
        out=out,
        source_kind=str(run.get("source_kind") or "release"),
        repo=run.get("repo"),
        runner=str((run.get("runner") or {}).get("name") or "subprocess"),
        sides=tuple(str(s) for s in sides) if one_side else None,
        throughput=run["throughput"] if isinstance(run.get("throughput"), dict) else None,
    )


@dataclass(frozen=True)
class Overrides:
    """What the user sets instead of the bundle: required when its signatures are not checked."""

    repo: str | None = None
    runner: str | None = None


def _refuse_unvouched(overrides: Overrides) -> None:
    """Before anything is opened: an unverified bundle never picks a back end that can reach the host."""
    hermetic = [name for name, cls in RUNNERS.items() if cls.hermetic]
    if overrides.runner is None or not runner_class(overrides.runner).hermetic:
        raise ConfigError(
            "--skip-signatures: nobody vouches for this bundle, so its run.json may not choose what runs; "
            f"pass --backend {' or '.join(hermetic)} (no network, the source read-only) explicitly"
        )


def _unvouched_spec(spec: RerunSpec, overrides: Overrides) -> RerunSpec:
    if spec.source_kind == "git" and not overrides.repo:
        recorded = f" (it records {spec.repo!r})" if spec.repo else ""
        raise ConfigError(
            f"--skip-signatures: this bundle re-runs git commits{recorded}; pass --repo with the SGLang "
            "repository you trust to hold them"
        )
    return spec


def reproduce(
    path: Path,
    trust: TrustPolicy | None,
    *,
    out: Path | None = None,
    executor: Executor | None = None,
    overrides: Overrides | None = None,
    max_bytes: int = pack.DEFAULT_MAX_UNPACKED,
) -> ReproduceReport:
    """Verify the bundle (signatures too, unless ``trust`` is None), re-run it, compare.

    With ``out`` unset the re-run goes to a temporary folder that is removed afterwards.
    ``trust=None`` needs ``overrides`` naming a hermetic back end (and the repository, for git).
    """
    executor = executor or pipeline_executor
    overrides = overrides or Overrides()
    if trust is None:
        _refuse_unvouched(overrides)
    if out is not None and out.exists():
        raise ConfigError(f"{out}: already exists; choose a new folder for the re-run")
    with pack.opened(path, max_bytes) as root:
        problems = verify_folder(root, trust).problems
        if problems:
            raise VerificationFailed(
                "refusing to reproduce a bundle that does not verify:\n" + "\n".join(f"  {p}" for p in problems)
            )
        if out is not None:
            return _run_and_compare(root, out, executor, trust is None, overrides)
        with tempfile.TemporaryDirectory(prefix="difflab-reproduce-") as tmp:
            report = _run_and_compare(root, Path(tmp) / "rerun", executor, trust is None, overrides)
            report.rerun_dir = None
            return report


def _run_and_compare(
    root: Path, out: Path, executor: Executor, unvouched: bool, overrides: Overrides
) -> ReproduceReport:
    spec = spec_for(root, out)
    if unvouched:
        spec = _unvouched_spec(spec, overrides)
    changes = {k: v for k, v in (("repo", overrides.repo), ("runner", overrides.runner)) if v is not None}
    rerun = executor(dataclasses.replace(spec, **changes))
    # a one-side recording (``RunRequest(sides=...)``) has observations and no verdicts: those alone are compared
    if spec.sides is None and not (rerun / layout.DIFF_JSON).is_file():
        raise VerificationFailed(f"{rerun}: the re-run wrote no {layout.DIFF_JSON}; nothing to compare")
    report = compare_runs(root, rerun)
    report.notes[:0] = lab_mismatches(root)
    return report


def lab_mismatches(bundle_root: Path) -> list[str]:
    """Where this lab is not the one that recorded the bundle (version, probes digest), and what to install."""
    try:
        run = json.loads((bundle_root / layout.RUN_JSON).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    return mismatches(run) if isinstance(run, dict) else []
