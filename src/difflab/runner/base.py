"""What an execution back end must answer, and the pieces they share."""

from __future__ import annotations

import json
import signal
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol

from difflab.observation import Observation
from difflab.source.base import MaterialisedSource

DEFAULT_TIMEOUT_S = 180.0
"""Per probe: a cold SGLang import takes 5-10 s; anything near this is a hang."""


@dataclass(frozen=True)
class ProbeJob:
    """Run probe ``probe`` (a file in ``probes/``) for one side of one fix."""

    fix_id: str
    probe: str
    side: str
    source: MaterialisedSource
    probe_file: Path
    log_path: Path | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S


Progress = Callable[[Observation], None]


class Runner(Protocol):
    """Runs probe jobs; never raises for a probe's failure (that is an ``error`` observation).

    Registered by ``name`` in :data:`difflab.runner.RUNNERS`; the three class-level flags are what
    the workflows ask of a back end before they build it (:class:`difflab.workflows.session.Session`).
    """

    name: str
    """The ``--backend`` value that selects this back end (recorded in every observation)."""
    result_cache: ClassVar[bool]
    """Whether a cached observation may answer for this back end (no: its results depend on more
    than the source, environment and probe the cache keys on, e.g. a container image)."""
    local_environment: ClassVar[bool]
    """Whether probes run in the local shared environment, which the workflow then makes ready
    (``--upstream-tests`` and ``contains``/``selfcheck`` need it)."""
    hermetic: ClassVar[bool]
    """Whether it may run code nobody vouched for: no network, nothing of the host writable but its
    output (an unsigned bundle's re-run and a fork's code need it)."""

    def describe(self) -> dict[str, Any]:
        """Recorded in run.json (e.g. the Docker image digest)."""
        ...

    def run(self, jobs: Sequence[ProbeJob], on_done: Progress | None = None) -> list[Observation]:
        """One observation per job, in job order."""
        ...


def fan_out(
    jobs: Sequence[ProbeJob], run_one: Callable[[ProbeJob], Observation], workers: int, on_done: Progress | None
) -> list[Observation]:
    """``run_one`` over ``jobs``, ``workers`` at once, in job order; ``on_done`` as each one ends.

    Threads are enough: each one only waits on its own probe process or container.
    """

    def one(job: ProbeJob) -> Observation:
        obs = run_one(job)
        if on_done:
            on_done(obs)
        return obs

    if workers <= 1 or len(jobs) <= 1:
        return [one(j) for j in jobs]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(one, jobs))


def observation_from_raw(job: ProbeJob, raw: dict[str, Any], runner: str) -> Observation:
    """Turn the child's raw JSON into an :class:`Observation` for ``job``."""
    return Observation(
        fix=job.fix_id,
        probe=job.probe,
        side=job.side,
        source=dict(job.source.identity),
        status=raw.get("status") if raw.get("status") in ("ok", "n/a") else "error",
        fields=raw.get("fields") or {},
        events=raw.get("events") or [],
        problems=raw.get("problems") or [],
        error=raw.get("error"),
        defaults=raw.get("defaults") or [],
        forced=raw.get("forced") or [],
        fallbacks=raw.get("fallbacks") or [],
        sglang_version=raw.get("sglang_version"),
        duration_s=float(raw.get("duration_s") or 0.0),
        runner=runner,
    )


def error_observation(job: ProbeJob, runner: str, message: str, duration_s: float = 0.0) -> Observation:
    """A crash, hang or unreadable result: recorded, never raised."""
    return Observation(
        fix=job.fix_id,
        probe=job.probe,
        side=job.side,
        source=dict(job.source.identity),
        status="error",
        error=message,
        duration_s=duration_s,
        runner=runner,
    )


def read_raw(path: Path) -> dict[str, Any]:
    data = json.loads(path.read_text())
    if not isinstance(data, dict):
        raise ValueError("probe result is not a JSON object")
    return data


def tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def write_log(job: ProbeJob, log: str) -> None:
    """Keep the probe process's output beside its observation."""
    if job.log_path is not None:
        job.log_path.parent.mkdir(parents=True, exist_ok=True)
        job.log_path.write_text(log)


def death_cause(exit_code: int | None, signal_number: int | None = None) -> str:
    """How a probe process ended, in the same words whichever back end ran it.

    ``exit_code`` may be a subprocess return code (negative: killed by that signal).
    """
    if signal_number is None and exit_code is not None and exit_code < 0:
        signal_number = -exit_code
    if signal_number:
        try:
            name = signal.Signals(signal_number).name
        except ValueError:
            name = "unknown signal"
        return f"killed by signal {signal_number} ({name})"
    return f"exit {exit_code}"


def collect_result(job: ProbeJob, runner: str, out: Path, death: str, log: str, wall_s: float) -> Observation:
    """The child's result file as an observation; its absence (``death`` says how it ended) as an error."""
    if not out.exists():
        return error_observation(job, runner, f"{death} without a result\n{tail(log)}", wall_s)
    try:
        raw = read_raw(out)
    except ValueError as exc:
        return error_observation(job, runner, f"unreadable probe result: {exc}")
    return observation_from_raw(job, raw, runner)
