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
import contextlib
import json
import os
import selectors
import shutil
import signal
import socket
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
from difflab.runner import box, childlib, kept_hub
from difflab.runner.base import (
    ProbeJob,
    Progress,
    collect_result,
    death_cause,
    error_observation,
    tail,
    write_log,
)
from difflab.runner.kept_hub import Keeper
from difflab.runner.subprocess import SubprocessRunner, default_workers

START_TIMEOUT_S = 600.0
"""Hub or server import: seconds normally, minutes on a cold disk; anything near this is a hang."""


KEPT_GREETING_S = 30.0
"""How long a kept hub may take to greet: it has nothing left to import."""


class WarmUnavailable(Exception):  # noqa: N818 - a condition the runner recovers from
    """The hub could not be started or died; its jobs run in fresh processes."""


@dataclass
class _Hub:
    """The lab's end of one hub: a Unix socket carrying JSON lines.

    ``proc`` is set when this command started the hub; a kept hub another command started
    (:mod:`difflab.runner.kept_hub`) has only its pid. ``claim`` is this command's lock on a
    kept hub, held while it is connected.
    """

    sock: socket.socket
    pid: int
    folder: Path
    child_digest: str
    proc: subprocess.Popen[bytes] | None = None
    log: IO[bytes] | None = None
    preload_file: Path | None = None
    """The learned list this hub was started with (forgotten if the hub cannot serve with it)."""
    claim: int | None = None
    keeper: Keeper | None = None
    info: dict[str, Any] = field(default_factory=dict)
    buffer: bytes = b""
    counted: bool = False
    """In the runner's stats already (a hub serves every run of its runner)."""

    @classmethod
    def start(cls, spec: _HubSpec) -> _Hub:
        """Connect to the kept hub started this same way, or start one (kept, when ``spec.keep_s`` > 0
        and no other command holds the kept hub now; for this command only otherwise)."""
        folder = Path(tempfile.mkdtemp(prefix="difflab-warm-"))
        env = box.environment(None, spec.child_root, folder / "home", spec.cache)
        claim = spec.keeper.lock() if spec.keeper is not None and spec.keep_s > 0 else None
        keep_s = spec.keep_s if claim is not None else 0.0
        cmd = spec.command(keep_s)
        key = kept_hub.hub_key([*cmd, spec.child_digest], env, folder)
        found = spec.keeper.connect(key) if claim is not None and spec.keeper is not None else None
        hub = cls._greeted(spec, *found) if found is not None else None
        if hub is not None:
            shutil.rmtree(folder, ignore_errors=True)
        else:
            hub = cls._spawn(spec, cmd, env, folder, keep_s)
            if claim is not None and spec.keeper is not None:
                sock_path = str(folder / "hub.sock")
                pointer = kept_hub.Pointer(hub.pid, sock_path, str(folder), key, keep_s, time.time(), os.getpid())
                spec.keeper.remember(pointer)
        hub.claim, hub.keeper = claim, spec.keeper if claim is not None else None
        atexit.register(hub.close)
        return hub

    @classmethod
    def _greeted(cls, spec: _HubSpec, sock: socket.socket, pointer: kept_hub.Pointer) -> _Hub | None:
        """The kept hub, once it has greeted this command: it has imported already, so it greets at once
        unless someone else's connection holds it; then it is stopped and this command starts its own."""
        hub = cls(sock, pointer.pid, Path(pointer.folder), spec.child_digest, preload_file=spec.preload_file)
        try:
            hub.info = hub.next_event(KEPT_GREETING_S)
        except WarmUnavailable:
            hub.info = {}
        if hub.info.get("event") == "hub-ready" and int(hub.info.get("threads", 1)) <= 1:
            return hub
        sock.close()
        if spec.keeper is not None:
            spec.keeper.stop(pointer)
        return None

    @classmethod
    def _spawn(cls, spec: _HubSpec, cmd: list[str], env: dict[str, str], folder: Path, keep_s: float) -> _Hub:
        """Make the socket, connect to it, and hand its listening end to a new hub: nothing to wait for."""
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            kept_hub.unix_call(listener, "bind", folder / "hub.sock")
            listener.listen(8)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            kept_hub.unix_call(sock, "connect", folder / "hub.sock")  # queued until the hub accepts
            log = (folder / "hub.log").open("wb")
            proc = subprocess.Popen(
                [*cmd, "--listen-fd", str(listener.fileno()), "--folder", str(folder)],
                pass_fds=(listener.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log,
                env=env,
                cwd=folder,
                start_new_session=keep_s > 0,  # a kept hub outlives this command's terminal and group
            )
        finally:
            listener.close()
        return cls(sock, proc.pid, folder, spec.child_digest, proc=proc, log=log, preload_file=spec.preload_file)

    @property
    def ready(self) -> bool:
        return bool(self.info)

    @property
    def kept(self) -> bool:
        return self.claim is not None

    def wait_ready(self) -> _Hub:
        """Block until the hub has imported its modules; raises :class:`WarmUnavailable` if it cannot serve."""
        if self.ready:
            return self
        try:
            ready = self.next_event(START_TIMEOUT_S)
        except WarmUnavailable:
            self.close(forget=True)
            raise
        if ready.get("event") != "hub-ready" or int(ready.get("threads", 1)) > 1:
            self.close(forget=True)
            raise WarmUnavailable(f"hub not usable: {ready}")
        self.info = ready
        return self

    def send(self, message: dict[str, Any]) -> None:
        try:
            self.sock.sendall((json.dumps(message) + "\n").encode())
        except OSError as exc:
            raise WarmUnavailable(f"hub is gone: {exc}\n{self.log_tail()}") from None

    def next_event(self, timeout_s: float) -> dict[str, Any]:
        """The hub's next message; raises :class:`WarmUnavailable` if it died or went silent."""
        deadline = time.monotonic() + timeout_s
        with selectors.DefaultSelector() as sel:
            sel.register(self.sock, selectors.EVENT_READ)
            while b"\n" not in self.buffer:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise WarmUnavailable(f"hub silent for {timeout_s:.0f} s\n{self.log_tail()}")
                if not sel.select(left):
                    continue
                try:
                    chunk = self.sock.recv(1 << 16)
                except OSError as exc:
                    raise WarmUnavailable(f"hub connection lost: {exc}\n{self.log_tail()}") from None
                if not chunk:
                    raise WarmUnavailable(f"hub exited ({self._exit_code()})\n{self.log_tail()}")
                self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return json.loads(line)

    def _exit_code(self) -> int | str | None:
        return self.proc.poll() if self.proc is not None else "a kept hub"

    def log_tail(self) -> str:
        try:
            if self.log is not None:
                self.log.flush()
            return tail((self.folder / "hub.log").read_text(errors="replace"), 20)
        except OSError:
            return ""

    @property
    def alive(self) -> bool:
        if self.proc is not None:
            return self.proc.poll() is None
        try:
            os.kill(self.pid, 0)
        except OSError:
            return False
        return True

    def close(self, forget: bool = False) -> None:
        """End of this command's connection ends its servers and probes; a hub kept for the next command
        stays, any other hub leaves. A hub still importing has forked nothing: it is killed, and so is a
        kept one that could not serve (``forget``)."""
        atexit.unregister(self.close)
        if (not self.ready or forget) and self.alive:
            with contextlib.suppress(OSError):
                os.kill(self.pid, signal.SIGKILL)
            if self.keeper is not None:
                self.keeper.stop()
        with contextlib.suppress(OSError):
            self.sock.close()
        if self.claim is not None:
            os.close(self.claim)  # the next command may have the kept hub now
            self.claim = None
        if self.proc is not None and self.keeper is None:
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            shutil.rmtree(self.folder, ignore_errors=True)
        if self.log is not None:
            self.log.close()


@dataclass(frozen=True)
class _HubSpec:
    """How this command would start a hub; a kept hub is reused only if it was started exactly so."""

    python: Path
    child_root: Path
    child_digest: str
    preload: Sequence[str]
    preload_file: Path | None
    pycache: Path | None
    cache: Path | None
    keep_s: float
    keeper: Keeper | None

    def command(self, keep_s: float) -> list[str]:
        args = ["--preload", ",".join(self.preload), "--preload-file", str(self.preload_file or "")]
        args += ["--pycache", str(self.pycache or ""), "--idle-s", str(keep_s)]
        if keep_s > 0 and self.keeper is not None:
            args += ["--lock", str(self.keeper.lock_path)]
        return box.command(self.python, "difflab.probe.hub", *args)


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
    keep_s: float = field(default_factory=kept_hub.idle_seconds)
    """How long the hub waits for the next command once this one is done (``$DIFFLAB_HUB_IDLE_S``; 0: it does not)."""
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
            "keep_s": self.keep_s,
            "hubs": [{k: h.get(k) for k in ("import_s", "reused")} for h in self.stats["hubs"]],
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
        keeper = Keeper(self._cache / "warm", self.environment.digest)
        spec = _HubSpec(
            self.environment.python,
            child_root,
            childlib.child_digest(),
            self.hub_preload,
            use,
            self._pycache,
            self.cache,
            self.keep_s,
            keeper,
        )
        self._hub = _Hub.start(spec)
        return self._hub

    def _hub_for(self, child_root: Path) -> _Hub:
        hub = self._hub
        if hub is not None and (hub.child_digest != childlib.child_digest() or (hub.ready and not hub.alive)):
            self.close()  # a hub still importing that died says so in wait_ready, below
        hub = self._hub or self._spawn(child_root)
        if hub.counted:
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
        self.stats["hubs"].append({k: hub.info.get(k) for k in ("import_s", "import_cpu_s", "preloaded", "reused")})
        hub.counted = True
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
