"""``difflab reproduce``: verify a bundle, re-run its pins, compare (:mod:`difflab.bundle.compare`).

The executor that performs the re-run is injectable: by default it is the lab's run
workflow, in tests a stub that writes a run folder.
"""

from __future__ import annotations

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
