"""``--backend warm``: import SGLang once per source, fork a fresh process per probe.

A fresh interpreter per probe pays ~5-9 s of imports and ~1.5 s of teardown
for a probe that itself runs in well under a second. Here one hub process of
the shared environment imports SGLang's third-party dependencies once, forks
one server per SGLang source that imports that source's SGLang once, and each
server forks a child per probe (see :mod:`difflab.probe.hub`). A fork is a
private copy, so probes stay as isolated as separate processes; a crash or a
hang (killed at ``job.timeout_s``) is an ``error`` observation with the log.

Scheduling: at most ``workers`` servers live at once (~500 MB each, of which
the hub's share is copy-on-write), jobs grouped by source so each source is
imported once, and at most ``parallel`` probe processes at once (the cores).
Whatever the warm path cannot run (the hub or a server fails to start, or a
server has threads and cannot fork safely) runs in fresh processes through
:class:`~difflab.runner.subprocess.SubprocessRunner` instead, recorded as such.
"""

from __future__ import annotations

import atexit
import json
import os
import selectors
import shutil
import subprocess
import tempfile
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, ClassVar

from difflab.environment.shared import SharedEnvironment
from difflab.files.atomic import write_atomic
from difflab.observation import Observation
from difflab.paths import cache_root
from difflab.probe.hub import HUB_PRELOAD
from difflab.probe.source_server import SERVER_PRELOAD
from difflab.runner import box, childlib
from difflab.runner.base import (
    ProbeJob,
    Progress,
    collect_result,
    death_cause,
    error_observation,
    tail,
    write_log,
)
from difflab.runner.subprocess import SubprocessRunner, default_workers

START_TIMEOUT_S = 600.0
"""Hub or server import: seconds normally, minutes on a cold disk; anything near this is a hang."""


class WarmUnavailable(Exception):  # noqa: N818 - a condition the runner recovers from
    """The hub could not be started or died; its jobs run in fresh processes."""


@dataclass
class _Hub:
    """The lab's end of one hub process (stdin/stdout JSON lines)."""

    proc: subprocess.Popen[bytes]
    folder: Path
    log: IO[bytes]
    child_digest: str
    preload_file: Path | None = None
    """The learned list this hub was started with (forgotten if the hub cannot serve with it)."""
    info: dict[str, Any] = field(default_factory=dict)
    buffer: bytes = b""

    @classmethod
    def start(
        cls,
        python: Path,
        child_root: Path,
        preload: Sequence[str],
        preload_file: Path | None,
        pycache: Path | None,
        cache: Path | None = None,
    ) -> _Hub:
        folder = Path(tempfile.mkdtemp(prefix="difflab-warm-"))
        log = (folder / "hub.log").open("wb")
        env = box.environment(None, child_root, folder / "home", cache)
        cmd = box.command(
            python,
            "difflab.probe.hub",
            "--preload",
            ",".join(preload),
            "--preload-file",
            str(preload_file or ""),
            "--pycache",
            str(pycache or ""),
        )
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, env=env, cwd=folder)
        hub = cls(proc=proc, folder=folder, log=log, child_digest=childlib.child_digest(), preload_file=preload_file)
        os.set_blocking(proc.stdout.fileno(), False)  # type: ignore[union-attr]
        atexit.register(hub.close)
        return hub

    @property
    def ready(self) -> bool:
        return bool(self.info)

    def wait_ready(self) -> _Hub:
        """Block until the hub has imported its modules; raises :class:`WarmUnavailable` if it cannot serve."""
        if self.ready:
            return self
        try:
            ready = self.next_event(START_TIMEOUT_S)
        except WarmUnavailable:
            self.close()
            raise
        if ready.get("event") != "hub-ready" or int(ready.get("threads", 1)) > 1:
            self.close()
            raise WarmUnavailable(f"hub not usable: {ready}")
        self.info = ready
        return self

    def send(self, message: dict[str, Any]) -> None:
        try:
            self.proc.stdin.write((json.dumps(message) + "\n").encode())  # type: ignore[union-attr]
            self.proc.stdin.flush()  # type: ignore[union-attr]
        except (BrokenPipeError, ValueError, OSError) as exc:
            raise WarmUnavailable(f"hub is gone: {exc}\n{self.log_tail()}") from None

    def next_event(self, timeout_s: float) -> dict[str, Any]:
        """The hub's next message; raises :class:`WarmUnavailable` if it died or went silent."""
        deadline = time.monotonic() + timeout_s
        fd = self.proc.stdout.fileno()  # type: ignore[union-attr]
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while b"\n" not in self.buffer:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise WarmUnavailable(f"hub silent for {timeout_s:.0f} s\n{self.log_tail()}")
                if not sel.select(left):
                    continue
                try:
                    chunk = os.read(fd, 1 << 16)
                except BlockingIOError:
                    continue
                if not chunk:
                    raise WarmUnavailable(f"hub exited ({self.proc.poll()})\n{self.log_tail()}")
                self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return json.loads(line)

    def log_tail(self) -> str:
        try:
            self.log.flush()
            return tail((self.folder / "hub.log").read_text(errors="replace"), 20)
        except OSError:
            return ""

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        """End of input stops the hub, which stops its servers and their probes.

        A hub still importing reads no input yet and has forked nothing: it is killed.
        """
        atexit.unregister(self.close)
        if not self.ready and self.proc.poll() is None:
            self.proc.kill()
        try:
            if self.proc.stdin:
                self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout:
            self.proc.stdout.close()
        self.log.close()
        shutil.rmtree(self.folder, ignore_errors=True)


@dataclass
class _Server:
    """One source's server, from the lab's side."""

    name: str
    pending: deque[int]
    running: set[int] = field(default_factory=set)
    ready: bool = False
    import_s: float | None = None


@dataclass
class _Run:
    """One call of :meth:`WarmRunner.run`: its jobs, where their observations go, and its folder."""

    jobs: Sequence[ProbeJob]
    results: list[Observation | None]
    fallback: dict[int, str]
    """Job index -> why the warm path could not run it (each such job runs again in a fresh process)."""
    on_done: Progress | None
    work: Path


@dataclass
class _Schedule:
    """The lab's side of the warm protocol for one run: which servers are open, which probes run.

    One loop (:meth:`run`): open servers while fewer than ``workers`` are, send probes while
    fewer than ``parallel`` run, then wait for the hub's next event and apply it.
    """

    runner: WarmRunner
    hub: _Hub
    batch: _Run
    waiting: deque[tuple[str, deque[int]]] = field(default_factory=deque)
    servers: dict[str, _Server] = field(default_factory=dict)
    running: int = 0

    def __post_init__(self) -> None:
        by_source: dict[tuple[str, str], deque[int]] = {}
        for i, job in enumerate(self.batch.jobs):
            by_source.setdefault((str(job.source.root), job.source.digest), deque()).append(i)
        # The sources with the most probes first: the last server to open then has the least to do,
        # so the run does not end on one core while the other idles.
        self.waiting = deque((root, idx) for (root, _), idx in sorted(by_source.items(), key=lambda kv: -len(kv[1])))

    def run(self) -> None:
        watchdog = max(j.timeout_s for j in self.batch.jobs) + START_TIMEOUT_S
        while self.waiting or self.servers:
            self.open_servers()
            for server in list(self.servers.values()):
                self.feed(server)
            if self.servers:
                self.apply(self.hub.next_event(watchdog))

    def open_servers(self) -> None:
        while self.waiting and len(self.servers) < self.runner.workers:
            root, idx = self.waiting.popleft()
            server = _Server(name=self.runner.server_name(), pending=idx)
            self.servers[server.name] = server
            log = str(self.batch.work / f"{server.name}.log")
            preload = list(self.runner.server_preload)
            self.hub.send(
                {"op": "open", "server": server.name, "root": root, "preload": preload, "log": log}
                | {"timeout_s": START_TIMEOUT_S}
            )

    def feed(self, server: _Server) -> None:
        """Send a ready server's probes while cores are free; close it once it has nothing left."""
        if not server.ready:
            return
        while server.pending and self.running < self.runner.parallel:
            i = server.pending.popleft()
            self.hub.send(self.runner._run_request(server.name, i, self.batch.jobs[i], self.batch.work))
            server.running.add(i)
            self.running += 1
        if not server.pending and not server.running:
            self.hub.send({"op": "close", "server": server.name})
            self.servers.pop(server.name)

    def apply(self, event: dict[str, Any]) -> None:
        server = self.servers.get(event.get("server", ""))
        kind = event.get("event")
        if server is None:
            return
        if kind == "ready":
            server.ready = True
            server.import_s = event.get("import_s")
            self.runner._learn(list(event.get("imported") or []))
            keep = ("server", "import_s", "import_cpu_s", "failed")
            self.runner.stats["servers"].append({k: event.get(k) for k in keep})
        elif kind == "server-failed":
            self.give_up(server, f"{event.get('reason')}\n{event.get('log', '')}".strip())
        elif kind == "done":
            self.done(server, event)

    def done(self, server: _Server, event: dict[str, Any]) -> None:
        i = int(event["job"])
        if i not in server.running:
            return
        server.running.discard(i)
        self.running -= 1
        if event.get("unsafe"):
            self.runner._note_fallback(f"server {server.name}: {event['unsafe']}", [i], self.batch.fallback)
            return
        self.runner.stats["probe_wall_s"].append(event.get("wall_s"))
        obs = self.runner._observation(self.batch.jobs[i], event, self.batch.work / f"j{i}")
        self.batch.results[i] = obs
        if self.batch.on_done:
            self.batch.on_done(obs)

    def give_up(self, server: _Server, reason: str) -> None:
        """A server that failed: its probes, running or waiting, go to fresh processes."""
        self.running -= len(server.running)
        self.runner._note_fallback(
            f"server {server.name}: {reason}", [*server.running, *server.pending], self.batch.fallback
        )
        self.servers.pop(server.name, None)


@dataclass
class WarmRunner:
    """``--backend warm``: one forking server per SGLang source (the default back end)."""

    environment: SharedEnvironment = field(default_factory=SharedEnvironment)
    workers: int = field(default_factory=default_workers)
    name: str = "warm"
    parallel: int = field(default_factory=lambda: os.cpu_count() or 1)
    """Probe processes at once, over all servers."""
    hub_preload: tuple[str, ...] = HUB_PRELOAD
    server_preload: tuple[str, ...] = SERVER_PRELOAD
    cache: Path | None = None
    """Where the staged child package, the bytecode and the learned preload list go (default ``$DIFFLAB_CACHE``)."""
    pycache: Path | None = None
    """Bytecode cache for the sources (default ``<cache>/pycache``); the sources stay untouched."""
    learn: bool = True
    """Remember which third-party modules the servers imported, so the next hub preloads them once for all."""
    stats: dict[str, Any] = field(
        default_factory=lambda: {"hubs": [], "servers": [], "fallbacks": [], "probe_wall_s": []}
    )
    """What the runs so far cost: hub and server imports, per-probe fork-to-exit wall time, fallbacks."""
    result_cache: ClassVar[bool] = True
    local_environment: ClassVar[bool] = True
    hermetic: ClassVar[bool] = False
    _hub: _Hub | None = field(default=None, init=False, repr=False)
    _names: int = field(default=0, init=False, repr=False)

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "workers": self.workers,
            "parallel": self.parallel,
            "environment": self.environment.digest,
            "hub_preload": list(self.hub_preload),
            "server_preload": list(self.server_preload),
            "fallbacks": len(self.stats["fallbacks"]),
        }

    def close(self) -> None:
        """Stop the hub now (otherwise at exit, or when this process's end closes its pipe)."""
        if self._hub is not None:
            self._hub.close()
            self._hub = None

    def __enter__(self) -> WarmRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- running -------------------------------------------------------------------
    def run(self, jobs: Sequence[ProbeJob], on_done: Progress | None = None) -> list[Observation]:
        results: list[Observation | None] = [None] * len(jobs)
        if not jobs:
            return []
        child_root = childlib.stage(self.cache)
        fallback: dict[int, str] = {}
        work = Path(tempfile.mkdtemp(prefix="difflab-warm-run-"))
        try:
            try:
                hub = self._hub_for(child_root)
                _Schedule(self, hub, _Run(jobs, results, fallback, on_done, work)).run()
            except WarmUnavailable as exc:
                self.close()
                left = [i for i, r in enumerate(results) if r is None and i not in fallback]
                self._note_fallback(f"warm runner unavailable: {exc}", left, fallback)
            except BaseException:
                self.close()  # servers of an interrupted run must not outlive it
                raise
            if fallback:
                self._run_fallback(jobs, fallback, results, on_done)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return [r for r in results if r is not None]

    def hub(self) -> _Hub:
        """The hub, started on first use; a throughput bench session shares it with probe runs."""
        return self._hub_for(childlib.stage(self.cache))

    def server_name(self) -> str:
        """A name no other server of this runner has had."""
        self._names += 1
        return f"s{self._names}"

    def start_early(self) -> None:
        """Start the hub's imports now, without waiting: the caller prepares its sources meanwhile.

        The hub's import is the one serial step of a warm run (seconds on one core); whatever the
        lab does before its first probe runs beside it instead of before it.
        """
        if self._hub is None and self.environment.ready:
            self._spawn(childlib.stage(self.cache))

    def _spawn(self, child_root: Path, learned: bool = True) -> _Hub:
        """Start a hub (not waited for); ``learned``: with the learned preload list, if there is one."""
        path = self._learned_file()
        use = path if learned and self.learn and path.exists() else None
        self._hub = _Hub.start(self.environment.python, child_root, self.hub_preload, use, self._pycache, self.cache)
        return self._hub

    def _hub_for(self, child_root: Path) -> _Hub:
        hub = self._hub
        if hub is not None and (hub.child_digest != childlib.child_digest() or (hub.ready and not hub.alive)):
            self.close()  # a hub still importing that died says so in wait_ready, below
        hub = self._hub or self._spawn(child_root)
        if hub.ready:
            return hub
        learned = hub.preload_file
        try:
            hub.wait_ready()
        except WarmUnavailable:
            self._hub = None
            if learned is None:
                raise
            # A learned module may have started a thread (the hub cannot fork then) or crashed:
            # forget the list rather than fall back to fresh processes from now on.
            learned.unlink(missing_ok=True)
            hub = self._spawn(child_root, learned=False).wait_ready()
        self.stats["hubs"].append({k: hub.info.get(k) for k in ("import_s", "import_cpu_s", "preloaded")})
        if learned is not None and hub.info.get("failed"):
            self._forget(set(hub.info["failed"]))  # e.g. a module a library made up at run time
        return hub

    @property
    def _pycache(self) -> Path:
        return self.pycache or self._cache / "pycache"

    @property
    def _cache(self) -> Path:
        return self.cache or cache_root()

    def _learned_file(self) -> Path:
        return self._cache / "warm" / f"hub-preload-{self.environment.digest[:16]}.txt"

    def _learn(self, imported: list[str]) -> None:
        """Add what a server imported from the environment to the next hub's preload list.

        Only speed depends on it: a module the hub did not preload is imported by the server.
        """
        if not self.learn or not imported:
            return
        path = self._learned_file()
        known = path.read_text().split() if path.exists() else []
        new = [m for m in imported if m not in set(known)]
        if new:
            self._write_learned(known + new)

    def _forget(self, modules: set[str]) -> None:
        path = self._learned_file()
        if path.exists():
            self._write_learned([m for m in path.read_text().split() if m not in modules])

    def _write_learned(self, modules: list[str]) -> None:
        write_atomic(self._learned_file(), "\n".join(modules) + "\n")

    def _run_request(self, server: str, i: int, job: ProbeJob, work: Path) -> dict[str, Any]:
        folder = work / f"j{i}"
        folder.mkdir()
        log = folder / "probe.log"  # in the run's temporary folder, where a probe process may write; kept below
        return {
            "op": "run",
            "server": server,
            "job": i,
            "probe": str(Path(job.probe_file).resolve()),
            "out": str(folder / "result.json"),
            "log": str(log),
            "timeout_s": job.timeout_s,
        }

    def _observation(self, job: ProbeJob, event: dict[str, Any], folder: Path) -> Observation:
        """The same outcomes, in the same words, as :class:`SubprocessRunner`."""
        try:
            text = (folder / "probe.log").read_text(errors="replace")
        except OSError:
            text = ""
        write_log(job, text)
        wall = float(event.get("wall_s") or 0.0)

        def log() -> str:
            return tail(text)

        if event.get("timed_out"):
            return error_observation(job, self.name, f"probe hung: killed after {job.timeout_s:.0f} s\n{log()}", wall)
        how = death_cause(event.get("exit"), event.get("signal"))
        return collect_result(job, self.name, folder / "result.json", f"probe process died ({how})", log(), wall)

    # -- the way out -----------------------------------------------------------------
    def _note_fallback(self, reason: str, idx: list[int], fallback: dict[int, str]) -> None:
        first = reason.splitlines()[0] if reason else "the warm path could not run it"
        if idx:
            self.stats["fallbacks"].append({"reason": first, "jobs": len(idx)})
        for i in idx:
            fallback.setdefault(i, first)

    def _run_fallback(
        self,
        jobs: Sequence[ProbeJob],
        fallback: dict[int, str],
        results: list[Observation | None],
        on_done: Progress | None,
    ) -> None:
        """Fresh processes for what the warm path could not run: ``runner = "subprocess"`` and the
        observation's ``runner_fallback`` say so, and why."""
        idx = sorted(fallback)
        runner = SubprocessRunner(environment=self.environment, workers=self.parallel, cache=self.cache)
        for i, obs in zip(idx, runner.run([jobs[i] for i in idx], on_done), strict=True):
            obs.runner_fallback = f"{self.name}: {fallback[i]}"
            results[i] = obs
