"""One fresh process of the shared environment per probe.

The simplest back end and the reference the others are compared with: each
probe pays the full SGLang import (~5-9 s) but shares nothing with any other
probe. A crash, a hang (killed at the timeout) or an unreadable result
becomes an ``error`` observation with the log; the run goes on. The child
supervises its probe process (its own session, a subreaper, killed at the
timeout with everything it started: :func:`difflab.probe.process.supervise`).
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from difflab.environment.shared import SharedEnvironment
from difflab.observation import Observation
from difflab.probe.child import ended_path
from difflab.runner import box, childlib
from difflab.runner.base import (
    ProbeJob,
    Progress,
    collect_result,
    death_cause,
    error_observation,
    fan_out,
    tail,
    write_log,
)

PROCESS_MEMORY_BYTES = 700 * 1024 * 1024
"""Peak RSS of one probe process with SGLang imported (measured ~500 MB, with headroom)."""


def default_workers() -> int:
    """As many probe processes as cores, but never more than memory holds."""
    cores = os.cpu_count() or 1
    try:
        avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return cores
    return max(1, min(cores, int(avail // PROCESS_MEMORY_BYTES)))


@dataclass
class SubprocessRunner:
    """``--backend subprocess``: a new interpreter for every probe."""

    environment: SharedEnvironment = field(default_factory=SharedEnvironment)
    workers: int = field(default_factory=default_workers)
    cache: Path | None = None
    """Where the staged child package and the bytecode go (default ``$DIFFLAB_CACHE``)."""
    name: str = "subprocess"
    result_cache: ClassVar[bool] = True
    local_environment: ClassVar[bool] = True
    hermetic: ClassVar[bool] = False

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "workers": self.workers, "environment": self.environment.digest}

    def run(self, jobs: Sequence[ProbeJob], on_done: Progress | None = None) -> list[Observation]:
        return fan_out(jobs, self.run_one, self.workers, on_done)

    def run_one(self, job: ProbeJob) -> Observation:
        started = time.perf_counter()
        # Checked right before each use: an earlier probe of this run may have rewritten the staged copy.
        child_root = childlib.stage(self.cache)
        with tempfile.TemporaryDirectory(prefix="difflab-probe-") as tmp:
            out, log_file = Path(tmp) / "result.json", Path(tmp) / "probe.log"
            cmd = box.command(
                self.environment.python, "difflab.probe.child", str(job.probe_file), str(out), str(job.timeout_s)
            )
            # Output goes to a file, not a pipe: a background process holding the pipe open would
            # otherwise keep this wait going until the timeout.
            with log_file.open("wb") as log_handle:
                proc = subprocess.Popen(
                    cmd,
                    env=box.environment(job.source.root, child_root, Path(tmp) / "home", self.cache),
                    cwd=tmp,
                    stdin=subprocess.DEVNULL,
                    stdout=log_handle,
                    stderr=subprocess.STDOUT,
                )
                stuck = False
                try:
                    proc.wait(timeout=job.timeout_s + SUPERVISOR_GRACE_S)
                except subprocess.TimeoutExpired:  # the supervisor itself is stuck: end it and its probe
                    stuck = True
                    _stop(proc)
                except BaseException:
                    _stop(proc)
                    raise
            log = log_file.read_text(errors="replace")
            write_log(job, log)
            wall = time.perf_counter() - started
            ended = _ended(ended_path(out))
            if stuck or ended.get("timed_out"):
                hung = f"probe hung: killed after {job.timeout_s:.0f} s\n{tail(log)}"
                return error_observation(job, self.name, hung, wall)
            how = death_cause(ended.get("exit"), ended.get("signal")) if ended else death_cause(proc.returncode)
            return collect_result(job, self.name, out, f"probe process died ({how})", log, wall)


SUPERVISOR_GRACE_S = 15.0
"""The supervisor enforces the probe's timeout itself; this much later the lab stops waiting for it."""


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Ask the supervisor to end its probe (SIGTERM), then make sure it is gone."""
    proc.terminate()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _ended(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
