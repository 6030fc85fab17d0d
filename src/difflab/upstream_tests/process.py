"""Run test files against one source in a fresh process of the shared environment (:mod:`difflab.probe.upstream_child`).

Every file one source needs (across fixes) runs in one process, so SGLang is imported once
per source. The process gets what a probe gets (the source and the staged child package on
``PYTHONPATH``, from an empty folder) except ``CUDA_VISIBLE_DEVICES``, which SGLang's test
utilities index at import (an empty value breaks them; the environment's torch is CPU-only),
and pytest's plugin auto-loading, so only the lab's own pytest plugins run.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from difflab.environment.shared import SharedEnvironment
from difflab.probe import upstream_child
from difflab.runner import box, childlib
from difflab.runner.base import tail
from difflab.runner.subprocess import default_workers
from difflab.source.base import MaterialisedSource
from difflab.upstream_tests.files import TestFile
from difflab.upstream_tests.staging import stage_pytest

BASE_TIMEOUT_S = 300.0
PER_FILE_S = 120.0


def child_env(source: MaterialisedSource, cache: Path | None, home: Path) -> dict[str, str]:
    """A probe's environment (:mod:`difflab.runner.box`), with the source on ``PYTHONPATH`` behind the lab's
    package: a test file's own subprocesses import it from there."""
    child = childlib.stage(cache)
    env = box.environment(source.root, child, home, cache)  # names the build: its bytecode only
    env["PYTHONPATH"] = os.pathsep.join((str(child), str(source.root)))
    env.pop("CUDA_VISIBLE_DEVICES", None)
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    return env


@dataclass
class Job:
    """One process: one source, the files it runs; filled in when it has run."""

    source: MaterialisedSource
    files: list[TestFile]
    status: str = "pending"  # ok | error
    error: str | None = None
    tests: list[dict[str, Any]] = field(default_factory=list)
    runner: dict[str, Any] = field(default_factory=dict)
    log: str = ""
    duration_s: float = 0.0

    def takes(self, source: MaterialisedSource, file: TestFile) -> bool:
        """Same source, and no other file of this job under the same id."""
        clash = any(f.id == file.id and f.path != file.path for f in self.files)
        return self.source.digest == source.digest and self.source.root == source.root and not clash

    def add(self, file: TestFile) -> None:
        if file not in self.files:
            self.files.append(file)

    def records(self, file_id: str) -> list[dict[str, Any]]:
        return [t for t in self.tests if t.get("file") == file_id]

    def request(self, out: Path, pytest_path: Path | None) -> dict[str, Any]:
        """The request the test child reads (:func:`difflab.probe.upstream_child.run`): source, files, result."""
        return {
            "out": str(out),
            "source_root": str(self.source.root),
            "pytest_path": str(pytest_path) if pytest_path else None,
            "files": [f.request() for f in self.files],
        }

    def done(self, result: dict[str, Any]) -> None:
        """The child's result read back: every test record of every file, and how they ran."""
        self.status, self.tests, self.runner = "ok", result.get("tests", []), result.get("runner", {})


def plan(needs: Sequence[tuple[MaterialisedSource, TestFile]]) -> list[Job]:
    jobs: list[Job] = []
    for source, file in needs:
        job = next((j for j in jobs if j.takes(source, file)), None)
        if job is None:
            job = Job(source, [])
            jobs.append(job)
        job.add(file)
    return jobs


def _text(output: str | bytes | None) -> str:
    """What a killed process wrote: ``TimeoutExpired`` holds bytes even for a text-mode run."""
    return output.decode(errors="replace") if isinstance(output, bytes) else output or ""


def run_job(job: Job, env: SharedEnvironment, pytest_path: Path | None) -> Job:
    started = time.perf_counter()
    timeout = BASE_TIMEOUT_S + PER_FILE_S * len(job.files)
    with tempfile.TemporaryDirectory(prefix="difflab-upstream-") as tmp:
        out, request = Path(tmp) / "result.json", Path(tmp) / "request.json"
        request.write_text(json.dumps(job.request(out, pytest_path)))
        cmd = box.command(env.python, upstream_child.__name__, str(request))
        try:
            proc = subprocess.run(
                cmd,
                env=child_env(job.source, env.cache, Path(tmp) / "home"),
                cwd=tmp,
                capture_output=True,
                text=True,
                timeout=timeout,
            )
            job.log = (proc.stdout or "") + (proc.stderr or "")
            if out.exists():
                job.done(json.loads(out.read_text()))
            else:
                job.status, job.error = "error", f"test process died (exit {proc.returncode})\n{tail(job.log)}"
        except subprocess.TimeoutExpired as exc:
            job.log = _text(exc.stdout) + _text(exc.stderr)
            job.status, job.error = "error", f"upstream tests hung: killed after {timeout:.0f} s"
    job.duration_s = time.perf_counter() - started
    return job


def run_jobs(
    jobs: list[Job], env: SharedEnvironment, say: Callable[[str], None] | None = None, workers: int | None = None
) -> list[Job]:
    """Every job, a few at a time (each imports SGLang once)."""
    if not jobs:
        return jobs
    env.ensure(progress=say)
    pytest_path = stage_pytest(env.cache)
    with ThreadPoolExecutor(max_workers=max(1, min(len(jobs), workers or default_workers()))) as pool:
        done = list(pool.map(lambda j: run_job(j, env, pytest_path), jobs))
    if say:
        for job in done:
            say(f"upstream tests on {job.source.label}: {len(job.tests)} test(s) in {job.duration_s:.1f} s")
    return done
