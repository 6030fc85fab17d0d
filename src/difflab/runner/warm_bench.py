"""Throughput bench children on the warm hub: both sides alive at once, driven one round at a time.

An A/B that runs every base round and then every head round charges any drift of the
machine (another job starting, the clock changing) to one side. Here each side's bench
child (:mod:`difflab.probe.bench`) is forked from its source's server and waits; the lab
asks base for a round, then head, then base again, so a drift lands on both. The session
opens one server per distinct source up front (their imports overlap) and keeps them
until it ends, so a source shared by several fixes is imported once.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from difflab.runner.base import DEFAULT_TIMEOUT_S, tail
from difflab.runner.warm import START_TIMEOUT_S, WarmRunner, WarmUnavailable
from difflab.source.base import MaterialisedSource


class BenchFailed(Exception):  # noqa: N818 - a condition the workflow reports per fix
    """A bench child could not start, died, or reported an error; the message says which and why."""


@dataclass(frozen=True)
class BenchJob:
    """One side's bench child: a throughput probe against one source."""

    fix_id: str
    side: str
    source: MaterialisedSource
    probe_file: Path
    log_path: Path
    timeout_s: float = DEFAULT_TIMEOUT_S
    """How long one round may take (its deadline moves with every round)."""


@dataclass
class BenchChild:
    """A started bench child, as the lab sees it."""

    job: BenchJob
    key: str
    server: str
    workloads: list[dict[str, Any]] = field(default_factory=list)
    sglang_version: str | None = None
    ended: bool = False


def _source_key(source: MaterialisedSource) -> tuple[str, str]:
    return (str(source.root), source.digest)


@dataclass
class _Served:
    name: str
    ready: bool = False
    failed: str | None = None


class WarmBench:
    """``with WarmBench(runner, sources) as bench: child = bench.start(job); bench.round(child, ...)``."""

    def __init__(self, runner: WarmRunner, sources: list[MaterialisedSource]) -> None:
        self.runner = runner
        self.sources = sources
        self.hub: Any = None
        self.servers: dict[tuple[str, str], _Served] = {}
        self.children: dict[str, BenchChild] = {}
        self.inbox: dict[str, deque[dict[str, Any]]] = {}
        self._jobs = 0

    # -- session -------------------------------------------------------------------
    def __enter__(self) -> WarmBench:
        try:
            self.hub = self.runner.hub()
            log_dir = self.hub.folder
            for source in self.sources:
                key = _source_key(source)
                if key in self.servers:
                    continue
                served = _Served(self.runner.server_name())
                self.servers[key] = served
                self.hub.send(
                    {
                        "op": "open",
                        "server": served.name,
                        "root": str(source.root),
                        "preload": list(self.runner.server_preload),
                        "log": str(log_dir / f"{served.name}.log"),
                        "timeout_s": START_TIMEOUT_S,
                    }
                )
            while any(not s.ready and s.failed is None for s in self.servers.values()):
                self._dispatch(self._next(START_TIMEOUT_S))
        except BaseException:
            self._close_servers()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        for child in list(self.children.values()):
            if not child.ended:
                self.end(child)
        self._close_servers()

    def _close_servers(self) -> None:
        if self.hub is None or not self.hub.alive:
            return
        for served in self.servers.values():
            if served.ready:
                try:
                    self.hub.send({"op": "close", "server": served.name})
                except WarmUnavailable:
                    return
            served.ready = False

    # -- one child -----------------------------------------------------------------
    def start(self, job: BenchJob) -> BenchChild:
        """Fork ``job``'s bench child on its source's server and wait until its workloads are built."""
        served = self.servers.get(_source_key(job.source))
        if served is None:
            raise BenchFailed(f"{job.source.label}: not a source of this bench session")
        if served.failed is not None:
            raise BenchFailed(f"{job.source.label}: its server did not start: {served.failed}")
        self._jobs += 1
        child = BenchChild(job=job, key=f"bench-{self._jobs}", server=served.name)
        self.children[child.key] = child
        self.inbox[child.key] = deque()
        job.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._send(
            child,
            {"op": "bench", "probe": str(job.probe_file.resolve()), "log": str(job.log_path)},
        )
        reply = self._reply(child, ("bench-ready", "bench-failed"))
        if reply["event"] == "bench-failed":
            self._wait_done(child)
            raise BenchFailed(f"{job.side} {job.source.label}: {reply.get('error')}")
        child.workloads = list(reply.get("workloads") or [])
        child.sglang_version = reply.get("sglang_version")
        return child

    def round(self, child: BenchChild, index: int, sizes: list[int], budget: dict[str, int]) -> dict[str, Any]:
        """One timed round of every workload at every size; ``samples[workload][size]`` = seconds per item.

        ``budget`` is what one sample times (``min_items``, ``min_runs``, ``max_items``:
        :class:`difflab.probe.bench.Budget`).
        """
        if child.ended:
            raise BenchFailed(f"{child.job.side}: the bench child has already ended")
        self._send(child, {"op": "round", "round": index, "sizes": sizes, **budget})
        reply = self._reply(child, ("round",))
        if reply.get("error"):
            self._wait_done(child)
            raise BenchFailed(f"{child.job.side} {child.job.source.label} round {index}: {reply['error']}")
        return reply

    def end(self, child: BenchChild) -> None:
        """Let the child leave and wait for it (a child that hangs is killed at its deadline)."""
        if child.ended:
            return
        try:
            self._send(child, {"op": "end"})
            self._wait_done(child)
        except (BenchFailed, WarmUnavailable):
            child.ended = True

    # -- plumbing ----------------------------------------------------------------
    def _send(self, child: BenchChild, message: dict[str, Any]) -> None:
        assert self.hub is not None
        try:
            self.hub.send({**message, "server": child.server, "job": child.key, "timeout_s": child.job.timeout_s})
        except WarmUnavailable as exc:
            child.ended = True
            raise BenchFailed(f"{child.job.side}: {exc}") from None

    def _next(self, timeout_s: float) -> dict[str, Any]:
        assert self.hub is not None
        return self.hub.next_event(timeout_s)

    def _dispatch(self, event: dict[str, Any]) -> None:
        server = event.get("server")
        served = next((s for s in self.servers.values() if s.name == server), None)
        kind = event.get("event")
        if served is not None and kind == "ready":
            served.ready = True
        elif served is not None and kind == "server-failed":
            served.failed = f"{event.get('reason')}\n{event.get('log', '')}".strip()
            for child in self.children.values():
                if child.server == served.name and not child.ended:
                    self.inbox[child.key].append({"event": "done", "server-failed": served.failed})
        job = event.get("job")
        if isinstance(job, str) and job in self.inbox:
            self.inbox[job].append(event)

    def _reply(self, child: BenchChild, kinds: tuple[str, ...]) -> dict[str, Any]:
        """The child's next message of ``kinds``; its end before one arrives is a failure with its log."""
        queue = self.inbox[child.key]
        while True:
            while queue:
                event = queue.popleft()
                if event.get("event") in kinds:
                    return event
                if event.get("event") == "done":
                    child.ended = True
                    raise BenchFailed(f"{child.job.side} {child.job.source.label}: {self._death(child, event)}")
            try:
                self._dispatch(self._next(child.job.timeout_s + 30.0))
            except WarmUnavailable as exc:
                child.ended = True
                raise BenchFailed(f"{child.job.side}: {exc}") from None

    def _wait_done(self, child: BenchChild) -> None:
        queue = self.inbox[child.key]
        while not child.ended:
            while queue:
                if queue.popleft().get("event") == "done":
                    child.ended = True
                    return
            try:
                self._dispatch(self._next(child.job.timeout_s + 30.0))
            except WarmUnavailable:
                child.ended = True

    def _death(self, child: BenchChild, event: dict[str, Any]) -> str:
        if event.get("server-failed"):
            how = f"its server failed: {event['server-failed']}"
        elif event.get("unsafe"):
            how = str(event["unsafe"])
        elif event.get("timed_out"):
            how = f"hung: killed after {child.job.timeout_s:.0f} s"
        elif event.get("signal"):
            how = f"bench process died (signal {event['signal']})"
        else:
            how = f"bench process ended (exit {event.get('exit')})"
        try:
            log = tail(child.job.log_path.read_text(errors="replace"), 20)
        except OSError:
            log = ""
        return f"{how}\n{log}".strip()
