"""``difflab backport``: run each selected fix's probes on a fork's ref and judge them.

The matrix's declared base/head values are the reference, so only the fork
is run. The results folder is written in a temporary sibling and renamed
into place at the end (as ``difflab run`` does), with run.json,
environment.json, matrix.toml and observations/<fix>/fork/ beside
backport.json, junit.xml and summary.md, so it can be sealed as a bundle.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from difflab import __version__
from difflab.backport.evidence import DEFAULT_SCAN_LIMIT, disagreements, gather
from difflab.backport.report import write_backport_json, write_backport_junit, write_backport_summary
from difflab.diff.likeness import BackportVerdict, judge_backport
from difflab.environment.shared import SharedEnvironment
from difflab.files.atomic import atomic_folder
from difflab.matrix import Fix, load_matrix
from difflab.observation import SCHEMA_VERSION, Observation
from difflab.paths import default_matrix, probes_dir, repo_root
from difflab.runner import ProbeJob, Runner, build_runner
from difflab.runner.base import DEFAULT_TIMEOUT_S
from difflab.source.base import MaterialisedSource
from difflab.source.git import GitSource
from difflab.source.mirror import default_repo

SIDE = "fork"


@dataclass
class BackportRequest:
    """Everything that determines a backport check (recorded in run.json)."""

    repo: str
    ref: str
    matrix: Path = field(default_factory=default_matrix)
    fixes: list[str] | None = None
    out: Path | None = None
    upstream: str | None = None
    runner: str = "warm"
    bundle: bool = True
    key: Path | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    use_cache: bool = True
    scan_limit: int = DEFAULT_SCAN_LIMIT
    cache: Path | None = None
    argv: list[str] = field(default_factory=lambda: list(sys.argv))


@dataclass
class BackportOutcome:
    out_dir: Path
    exit_code: int
    verdicts: list[BackportVerdict]


def default_out() -> Path:
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    return repo_root() / "results" / f"backport-{stamp}"


def _stamp(when: dt.datetime) -> str:
    return when.isoformat(timespec="seconds").replace("+00:00", "Z")


def fork_jobs(
    fixes: list[Fix], src: MaterialisedSource, work: Path, timeout_s: float
) -> tuple[list[ProbeJob], list[Observation]]:
    """One job per fix x probe on the fork, plus errors for probe files that do not exist."""
    jobs, known = [], []
    for fix in fixes:
        for spec in fix.probes:
            probe_file = probes_dir() / f"{spec.name}.py"
            if not probe_file.exists():
                known.append(
                    Observation(
                        fix=fix.id,
                        probe=spec.name,
                        side=SIDE,
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
                    side=SIDE,
                    source=src,
                    probe_file=probe_file,
                    log_path=work / "observations" / fix.id / SIDE / f"{spec.name}.log",
                    timeout_s=timeout_s,
                )
            )
    return jobs, known


def execute(req: BackportRequest, say: Any = None) -> BackportOutcome:
    """Check the fork; raise :class:`DifflabError` on bad input (unknown fix, unreachable repo, bad ref)."""
    from difflab.progress import Reporter

    reporter = Reporter()
    say = say or reporter.say
    started = dt.datetime.now(dt.UTC)
    matrix = load_matrix(req.matrix)
    fixes = matrix.select(req.fixes)
    source = GitSource(repo=req.repo, cache=req.cache)
    say(f"fork {source.repo} at {req.ref}")
    fork = source.rev(req.ref, what=f"{req.ref!r}")
    say(f"fork commit {fork.identity['commit']} (tree {fork.identity['tree'][:12]})")
    upstream = req.upstream or default_repo()
    out = (req.out or default_out()).resolve()
    with atomic_folder(out) as work:
        env = SharedEnvironment()
        if req.runner != "docker":
            env.ensure(progress=say)
        runner = build_runner(req.runner, env, req.use_cache)
        jobs, known = fork_jobs(fixes, fork, work, req.timeout_s)
        observed = reporter.track(runner, jobs)
        by_key: dict[tuple[str, str], Observation] = {}
        for obs in known + observed:
            obs.write(work / "observations" / obs.fix / SIDE / f"{obs.probe}.json")
            by_key[(obs.fix, obs.probe)] = obs
        verdicts = []
        for fix in fixes:
            seen = {spec.name: by_key[(fix.id, spec.name)] for spec in fix.probes if (fix.id, spec.name) in by_key}
            verdict = judge_backport(fix, seen)
            version = next((o.sglang_version for o in seen.values() if o.sglang_version), None)
            evidence = gather(
                source.mirror,
                fork.identity["commit"],
                fix,
                upstream=upstream,
                matrix_path=matrix.path,
                version=version,
                scan_limit=req.scan_limit,
            )
            verdict.evidence = evidence.to_dict()
            verdict.disagreements = disagreements(verdict.verdict, evidence)
            verdicts.append(verdict)
        exit_code = 0 if all(v.passed for v in verdicts) else 1
        fork_doc = {**fork.identity, "ref": req.ref, "subject": fork.extra.get("subject"), "upstream": upstream}
        write_backport_json(work / "backport.json", fork_doc, verdicts)
        write_backport_junit(work / "junit.xml", verdicts)
        write_backport_summary(work / "summary.md", fork_doc, verdicts)
        _write_run_files(work, req, matrix.path, matrix.sha256, fixes, fork, env, runner, started, exit_code)
        if req.bundle:
            from difflab.bundle import seal

            seal(work, key=req.key)
    for v in verdicts:
        say(f"#{v.fix}{f'({v.part})' if v.part else ''}: {v.verdict} - {v.reason}")
    return BackportOutcome(out_dir=out, exit_code=exit_code, verdicts=verdicts)


def _write_run_files(
    work: Path,
    req: BackportRequest,
    matrix_path: Path,
    matrix_sha256: str,
    fixes: list[Fix],
    fork: MaterialisedSource,
    env: SharedEnvironment,
    runner: Runner,
    started: dt.datetime,
    exit_code: int,
) -> None:
    shutil.copyfile(matrix_path, work / "matrix.toml")
    run = {
        "schema": SCHEMA_VERSION,
        "tool": "sglang-difflab",
        "tool_version": __version__,
        "command": "backport",
        "argv": req.argv,
        "started_at": _stamp(started),
        "finished_at": _stamp(dt.datetime.now(dt.UTC)),
        "matrix": {
            "path": os.path.relpath(matrix_path, repo_root()) if matrix_path.is_absolute() else str(matrix_path),
            "sha256": matrix_sha256,
        },
        "fixes": [f.id for f in fixes],
        "sides": [SIDE],
        "source_kind": "git",
        "repo": fork.identity["repo"],
        "ref": req.ref,
        "runner": runner.describe(),
        "sources": {SIDE: fork.identity},
        "environment_digest": env.digest,
        "exit_code": exit_code,
    }
    (work / "run.json").write_text(json.dumps(run, indent=2, sort_keys=True) + "\n")
    env_doc = env.describe() if env.ready else {"digest": env.digest, "note": "environment not built locally"}
    (work / "environment.json").write_text(json.dumps(env_doc, indent=2, sort_keys=True) + "\n")
