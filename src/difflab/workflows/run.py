"""``difflab run``: matrix → sources → environment → probes → diff → reports → bundle.

The folder is written under a temporary sibling and renamed into place only
when the run completes, so a crashed or interrupted run never replaces a
good result.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from difflab import __version__
from difflab.diff.verdict import FixVerdict, judge_fix
from difflab.environment.shared import SharedEnvironment
from difflab.errors import ConfigError
from difflab.files.atomic import atomic_folder
from difflab.matrix import Fix, Matrix, SidePin, load_matrix
from difflab.observation import SCHEMA_VERSION, Observation
from difflab.paths import default_matrix, probes_dir, repo_root
from difflab.report import write_diff_json, write_junit, write_summary
from difflab.runner import ProbeJob, Runner, build_runner
from difflab.runner.base import DEFAULT_TIMEOUT_S
from difflab.source import MaterialisedSource, SourceBackend, backend_for

SIDES = ("base", "head")


@dataclass
class RunRequest:
    """Everything that determines a run (recorded in run.json, replayed by ``reproduce``)."""

    matrix: Path = field(default_factory=default_matrix)
    fixes: list[str] | None = None
    out: Path | None = None
    source_kind: str = "release"
    repo: str | None = None
    runner: str = "warm"
    bundle: bool = True
    key: Path | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    use_cache: bool = True
    argv: list[str] = field(default_factory=lambda: list(sys.argv))
    runner_options: dict[str, Any] = field(default_factory=dict)
    sides: tuple[str, ...] = SIDES
    selfcheck: bool = False
    """Both sides give verdicts; one side (``difflab observe``) only records observations."""


@dataclass
class RunOutcome:
    out_dir: Path
    exit_code: int
    verdicts: list[FixVerdict]


Say = Callable[[str], None]


def default_out() -> Path:
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    return repo_root() / "results" / stamp


def _source_backend(req: RunRequest, matrix: Matrix) -> SourceBackend:
    if req.source_kind == "release":
        return backend_for("release", releases=matrix.releases)
    options: dict[str, Any] = {"with_tests": True} if req.source_kind == "git" else {}
    if req.repo:
        options["repo"] = req.repo
    return backend_for(req.source_kind, **options)


def side_pin(fix: Fix, side: str, source_kind: str, matrix_path: Path | None = None) -> SidePin:
    """The pin for one side under the chosen source kind (git uses the matrix's commits/lock)."""
    pin: SidePin = getattr(fix, side)
    if source_kind == "git" and not pin.unavailable:
        from difflab.source.git import commit_pin_for

        return commit_pin_for(fix, side, matrix_path)
    return pin


def materialise_sides(
    fixes: list[Fix],
    backend: SourceBackend,
    source_kind: str,
    say: Say,
    sides: tuple[str, ...] = SIDES,
    matrix_path: Path | None = None,
) -> dict[tuple[str, str], MaterialisedSource | str]:
    """Source per (fix, side), or the reason it is unavailable."""
    out: dict[tuple[str, str], MaterialisedSource | str] = {}
    for fix in fixes:
        for side in sides:
            pin = side_pin(fix, side, source_kind, matrix_path)
            if pin.unavailable:
                out[(fix.id, side)] = pin.unavailable
                continue
            say(f"source {fix.label} {side}: {pin.label}")
            out[(fix.id, side)] = backend.materialise(fix, side, pin)
    return out


def build_jobs(
    fixes: list[Fix],
    sources: dict[tuple[str, str], MaterialisedSource | str],
    work: Path,
    timeout_s: float,
) -> tuple[list[ProbeJob], list[Observation]]:
    """Probe jobs to run, plus observations already known (unavailable side, missing probe file)."""
    jobs: list[ProbeJob] = []
    known: list[Observation] = []
    pdir = probes_dir()
    for fix in fixes:
        for side in SIDES:
            if (fix.id, side) not in sources:
                continue
            src = sources[(fix.id, side)]
            for spec in fix.probes:
                if isinstance(src, str):
                    known.append(Observation.unavailable(fix.id, spec.name, side, src))
                    continue
                probe_file = pdir / f"{spec.name}.py"
                if not probe_file.exists():
                    known.append(
                        Observation(
                            fix=fix.id,
                            probe=spec.name,
                            side=side,
                            source=dict(src.identity),
                            status="error",
                            error=f"probe file {probe_file} does not exist",
                        )
                    )
                    continue
                jobs.append(
                    ProbeJob(
                        fix_id=fix.id,
                        probe=spec.name,
                        side=side,
                        source=src,
                        probe_file=probe_file,
                        log_path=work / "observations" / fix.id / side / f"{spec.name}.log",
                        timeout_s=timeout_s,
                    )
                )
    return jobs, known


def source_label(src: MaterialisedSource | str) -> dict[str, Any]:
    if isinstance(src, str):
        return {"label": "unavailable", "reason": src}
    return {"label": src.label, **src.identity}


def make_runner(req: RunRequest, env: SharedEnvironment) -> Runner:
    return build_runner(req.runner, env, req.use_cache, **req.runner_options)


def execute(req: RunRequest, say: Say | None = None) -> RunOutcome:
    """Run the matrix and write the run folder. Raises :class:`DifflabError` on bad input."""
    from difflab.progress import Reporter

    reporter = Reporter()
    say = say or reporter.say
    started = dt.datetime.now(dt.UTC)
    matrix = load_matrix(req.matrix)
    fixes = matrix.select(req.fixes)
    out = (req.out or default_out()).resolve()
    with atomic_folder(out) as work:
        backend = _source_backend(req, matrix)
        if not set(req.sides) <= set(SIDES) or not req.sides:
            raise ConfigError(f"--side must be base or head, got {req.sides}")
        sources = materialise_sides(fixes, backend, req.source_kind, say, req.sides, matrix.path)
        env = SharedEnvironment()
        if req.runner != "docker":
            env.ensure(progress=say)
        runner = make_runner(req, env)
        jobs, known = build_jobs(fixes, sources, work, req.timeout_s)
        for obs in known:
            if obs.status == "error":
                say(f"{obs.fix} {obs.side} {obs.probe}: {obs.error}")
        observed = reporter.track(runner, jobs)
        all_obs = known + observed
        for obs in all_obs:
            obs.write(work / "observations" / obs.fix / obs.side / f"{obs.probe}.json")
        verdicts: list[FixVerdict] = []
        if tuple(req.sides) == SIDES:
            verdicts = judge_all(fixes, all_obs, {k: source_label(v) for k, v in sources.items()})
            exit_code = 0 if all(v.passed for v in verdicts) else 1
        else:  # one side of a CI fan-out: verdicts come from `difflab merge`
            exit_code = 0 if all(o.status != "error" for o in all_obs) else 1
        if req.selfcheck:
            from difflab.workflows.selfcheck import run_selfcheck, write_selfcheck

            heads = {
                fid: src
                for (fid, side), src in sources.items()
                if side == "head" and isinstance(src, MaterialisedSource)
            }
            checks = run_selfcheck(fixes, heads, runner, work, reporter.track, req.timeout_s)
            write_selfcheck(work, checks)
            if not all(c.passed for c in checks):
                exit_code = 1
        finished = dt.datetime.now(dt.UTC)
        _write_run_files(work, req, matrix, fixes, sources, env, runner, started, finished, exit_code)
        if verdicts:
            write_reports(work, verdicts)
        if req.source_kind == "git" and tuple(req.sides) == SIDES and req.runner != "docker":
            from difflab.upstream_tests import replay_run

            replay_run(work, fixes, sources, env, say)
        if req.bundle:
            from difflab.bundle import seal

            seal(work, key=req.key)
    if verdicts:
        reporter.table(verdicts, out)
    else:
        say(f"observations: {out}")
    return RunOutcome(out_dir=out, exit_code=exit_code, verdicts=verdicts)


def judge_all(
    fixes: list[Fix], observations: list[Observation], labels: dict[tuple[str, str], dict[str, Any]]
) -> list[FixVerdict]:
    """Verdict per fix from a flat list of observations (from one run or merged CI cells)."""
    by_key = {(o.fix, o.side, o.probe): o for o in observations}
    verdicts = []
    for fix in fixes:
        per_side = {
            side: {
                spec.name: by_key[(fix.id, side, spec.name)]
                for spec in fix.probes
                if (fix.id, side, spec.name) in by_key
            }
            for side in SIDES
        }
        verdicts.append(
            judge_fix(
                fix,
                per_side["base"],
                per_side["head"],
                labels.get((fix.id, "base"), {"label": "missing"}),
                labels.get((fix.id, "head"), {"label": "missing"}),
            )
        )
    return verdicts


def write_reports(folder: Path, verdicts: list[FixVerdict]) -> None:
    write_diff_json(folder / "diff.json", verdicts)
    write_junit(folder / "junit.xml", verdicts)
    write_summary(folder / "summary.md", verdicts)


def _write_run_files(
    work: Path,
    req: RunRequest,
    matrix: Matrix,
    fixes: list[Fix],
    sources: dict[tuple[str, str], MaterialisedSource | str],
    env: SharedEnvironment,
    runner: Runner,
    started: dt.datetime,
    finished: dt.datetime,
    exit_code: int,
) -> None:
    shutil.copyfile(matrix.path, work / "matrix.toml")
    by_label = {s.label: s.identity for s in sources.values() if not isinstance(s, str)}
    run = {
        "schema": SCHEMA_VERSION,
        "tool": "sglang-difflab",
        "tool_version": __version__,
        "command": "run" if tuple(req.sides) == SIDES else "observe",
        "sides": list(req.sides),
        "argv": req.argv,
        "started_at": started.isoformat(timespec="seconds").replace("+00:00", "Z"),
        "finished_at": finished.isoformat(timespec="seconds").replace("+00:00", "Z"),
        "matrix": {
            "path": os.path.relpath(matrix.path, repo_root()) if matrix.path.is_absolute() else str(matrix.path),
            "sha256": matrix.sha256,
        },
        "fixes": [f.id for f in fixes],
        "source_kind": req.source_kind,
        "repo": req.repo,
        "runner": runner.describe(),
        "sources": by_label,
        "environment_digest": env.digest,
        "exit_code": exit_code,
    }
    (work / "run.json").write_text(json.dumps(run, indent=2, sort_keys=True) + "\n")
    env_doc = env.describe() if env.ready else {"digest": env.digest, "note": "environment not built locally"}
    (work / "environment.json").write_text(json.dumps(env_doc, indent=2, sort_keys=True) + "\n")
