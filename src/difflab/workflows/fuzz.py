"""``difflab fuzz``: a seeded search for schedules under which decode reads KV pages another request wrote.

The search runs inside the probe environment, on the build under test
(:mod:`harness.pd_search`, hypothesis's stateful testing and shrinking over a CPU
prefill/decode pair of the build's real KV memory and queues). The schedules are split
into chunks, one probe job each, so the jobs fan out over the back end's workers and
the progress bar moves per chunk; chunk ``i`` uses the seed ``seed * 1000 + i``, so the
same seed gives the same schedules and the same leaks. Each chunk stops at its first
leak and shrinks it. ``fuzz.json`` holds what was asked, what ran, the rate, what the
wire assumed, and every distinct leak (its shrunk schedule, victim, owner, pages).
Exit 1 when a leak was found, 0 when none; bad input is exit 2 before anything is written.
"""

from __future__ import annotations

import json
import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from difflab.errors import ConfigError, DifflabError
from difflab.matrix import Matrix
from difflab.observation import Observation
from difflab.paths import default_matrix, probes_dir, repo_root
from difflab.progress import Reporter
from difflab.report.fuzz import SearchAsked, document, write_fuzz
from difflab.report.record import folder_stamp, utc_now
from difflab.runner import DEFAULT
from difflab.runner.base import ProbeJob
from difflab.source import releases, repository
from difflab.source.base import MaterialisedSource
from difflab.workflows.session import ProbeOptions, Session

CHUNK = 25
"""Schedules per probe job."""
TRANSFER_BACKENDS = ("mooncake", "nixl", "mori")


class SearchFailed(DifflabError):
    """A chunk of the search could not run (a probe error): no verdict either way (exit 3)."""

    exit_code = 3


@dataclass(kw_only=True)
class FuzzRequest:
    out: Path | None = None
    force: bool = False
    release: str | None = None
    repo: str | None = None
    ref: str | None = None
    matrix: Path = field(default_factory=default_matrix)
    runner: str = DEFAULT
    transfer_backend: str = "mooncake"
    schedules: int = 200
    seed: int = 0
    timeout_s: float = 600.0
    argv: list[str] = field(default_factory=lambda: list(sys.argv))


@dataclass
class FuzzOutcome:
    out_dir: Path
    exit_code: int
    leaks: list[dict[str, Any]]
    runs: int
    seconds: float
    cpu_seconds: float = 0.0


def default_out() -> Path:
    return repo_root() / "results" / f"fuzz-{folder_stamp(utc_now())}"


def check(req: FuzzRequest) -> None:
    """Bad input named before anything runs (exit 2)."""
    if (req.release is None) == (req.ref is None):
        raise ConfigError("give either --release V or --repo R --ref REF (one source to search)")
    if req.repo is not None and req.ref is None:
        raise ConfigError("--repo needs --ref: which commit of the repository to search")
    if req.schedules < 1:
        raise ConfigError(f"--schedules must be at least 1, got {req.schedules}")
    if req.seed < 0:
        raise ConfigError(f"--seed must be a non-negative integer, got {req.seed}")
    if req.transfer_backend not in TRANSFER_BACKENDS:
        raise ConfigError(f"--transfer-backend {req.transfer_backend!r}: choose one of {', '.join(TRANSFER_BACKENDS)}")


def _source(req: FuzzRequest, matrix: Matrix) -> tuple[MaterialisedSource, str]:
    if req.release is not None:
        if req.release not in matrix.releases:
            raise ConfigError(f"--release {req.release}: not pinned in {req.matrix} [releases]")
        return releases(matrix.releases).release(req.release), req.release
    assert req.ref is not None
    return repository(req.repo).rev(req.ref, what=f"--ref {req.ref}"), req.ref


def _stub(folder: Path, index: int, schedules: int, req: FuzzRequest) -> Path:
    """The probe file of one chunk: the search with this chunk's arguments (kept in the run folder)."""
    path = folder / f"chunk-{index:03d}.py"
    path.write_text(
        '"""One chunk of `difflab fuzz` (written by the lab; see fuzz.json)."""\n\n'
        "import sys\n\n"
        f"sys.path.insert(0, {str(probes_dir())!r})\n\n"
        "from harness.pd_search import observe_chunk  # noqa: E402\n\n\n"
        "def observe(kit):\n"
        f"    return observe_chunk(kit, schedules={schedules}, seed={req.seed}, chunk={index}, "
        f"backend={req.transfer_backend!r})\n"
    )
    return path


def _chunks(total: int) -> list[int]:
    n = math.ceil(total / CHUNK)
    return [CHUNK] * (n - 1) + [total - CHUNK * (n - 1)]


def _search_event(obs: Observation) -> dict[str, Any]:
    for event in obs.events:
        if event.get("event") == "search":
            return event
    raise SearchFailed(f"chunk {obs.probe}: the search reported nothing")


def _leaks(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every distinct leak (by shrunk schedule, victim, owner and pages), in chunk order."""
    seen: set[str] = set()
    found = []
    for event in events:
        leak = event.get("leak")
        if not leak:
            continue
        key = json.dumps([leak["schedule"], leak["victim"], leak["owner"], leak["pages"]])
        if key in seen:
            continue
        seen.add(key)
        found.append({"chunk": event["chunk"], **leak})
    return found


def execute(req: FuzzRequest, reporter: Reporter) -> FuzzOutcome:
    check(req)
    options = ProbeOptions(
        matrix=req.matrix,
        out=req.out or default_out(),
        force=req.force,
        runner=req.runner,
        use_cache=False,  # a search is run, never answered from the cache
        timeout_s=req.timeout_s,
        bundle=False,
        argv=req.argv,
    )
    session = Session.open("fuzz", options, reporter, select=lambda _matrix: [], probe_files=False)
    source, label = _source(req, session.matrix)
    env = session.environment()
    runner = session.runner(env)
    record = session.record
    with session.folder() as work:
        stubs = work / "search"
        stubs.mkdir()
        jobs = [
            ProbeJob(
                fix_id="fuzz",
                probe=f"chunk-{i:03d}",
                side=label,
                source=source,
                probe_file=_stub(stubs, i, n, req),
                log_path=work / "logs" / f"chunk-{i:03d}.log",
                timeout_s=req.timeout_s,
            )
            for i, n in enumerate(_chunks(req.schedules))
        ]
        observed = reporter.track(runner, jobs)
        broken = [f"{o.probe}: {o.error}" for o in observed if not o.ok]
        if broken:
            raise SearchFailed("the search could not run: " + "; ".join(broken))
        events = [_search_event(o) for o in observed]
        leaks = _leaks(events)
        asked = SearchAsked(
            source=label,
            source_identity=source.identity,
            sglang_version=observed[0].sglang_version,
            transfer_backend=req.transfer_backend,
            runner=runner.name,
            seed=req.seed,
            schedules=req.schedules,
        )
        doc = document(asked, events, leaks)
        write_fuzz(work, doc)
        runs, seconds, cpu_seconds = doc["runs"], doc["seconds"], doc["cpu_seconds"]
        exit_code = 1 if leaks else 0
        record.details |= {"source": label, "runner": runner.name, "cpus": os.cpu_count()}
        session.finish(work, exit_code, environment=env.document())
    return FuzzOutcome(session.out, exit_code, leaks, runs, seconds, cpu_seconds)
