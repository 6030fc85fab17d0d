"""One SGLang source, imported once, forking a fresh probe process per request (warm back end).

Forked from the hub (:mod:`difflab.probe.hub`) with its inbox and outbox pipes; imports the
source's SGLang (``SERVER_PRELOAD``), reports ``ready``, then forks one probe process per
``run`` request, kills it at its deadline and reports ``started`` and ``done``.

A ``bench`` request forks a throughput bench child instead (:mod:`difflab.probe.bench`),
which stays alive with a pipe of its own: ``round`` and ``end`` requests for its job are
passed on to it (each one moves its deadline), and whatever it answers is relayed with
this server's name and the job added. Standard library only, like the rest of
:mod:`difflab.probe`.
"""

from __future__ import annotations

import contextlib
import os
import select
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from difflab.probe import sandbox, stubs
from difflab.probe.bench import bench_main
from difflab.probe.child import run_probe, write_atomic
from difflab.probe.process import (
    EXIT_CRASH,
    ChildWatch,
    Lines,
    become_subreaper,
    end_strays,
    enter_forked_child,
    exited,
    fork_child,
    kill_group,
    preload,
    redirect_output,
    thread_count,
    write_line,
)

SERVER_PRELOAD = (
    "sglang.srt.managers.schedule_batch",
    "sglang.srt.managers.scheduler",
    "sglang.srt.disaggregation.prefill",
    "sglang.srt.disaggregation.decode",
    "sglang.srt.disaggregation.utils",
    "sglang.srt.disaggregation.mooncake.conn",
)
"""What a per-source server imports by default: the modules every probe drives."""


def probe_main(req: dict[str, Any], import_log: str | None, close_fds: list[int]) -> None:
    """In the forked probe process: never returns."""
    code = EXIT_CRASH
    try:
        enter_forked_child(req["log"], import_log, close_fds)
        os.chdir(Path(req["out"]).parent)
        result = run_probe(Path(req["probe"]))
        write_atomic(Path(req["out"]), result)
        code = 0
    except BaseException:  # noqa: B036 - report anything, then leave
        traceback.print_exc()
    finally:
        try:
            end_strays()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


@dataclass
class Running:
    """One probe process of a server."""

    job: Any
    pid: int
    deadline: float
    started: float
    timed_out: bool = False
    to_child: int | None = None
    """A bench child's inbox (the server writes its requests there)."""
    from_child: Lines | None = None
    """A bench child's outbox (the server relays what arrives)."""


@dataclass
class SourceServer:
    """Holds one SGLang source imported; forks a probe process per ``run`` request."""

    name: str
    root: str
    modules: list[str]
    log: str
    inbox: int
    outbox: int
    pycache: str | None = None
    running: dict[int, Running] = field(default_factory=dict)

    def serve(self) -> None:
        redirect_output(self.log)
        become_subreaper()  # a probe's escaped descendants come back here when it ends
        sandbox.confine_to_build(self.root)  # before the build's first import: its writes narrowed to its own
        started, cpu = time.perf_counter(), time.process_time()
        sys.path.insert(1, self.root)
        child_path = os.environ.get("PYTHONPATH", "")
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (child_path, self.root) if p)
        if self.pycache:
            # Bytecode of the materialised source, kept outside it: it stays pristine, and a
            # mutated copy (another path) never reads the original's bytecode.
            sys.pycache_prefix = self.pycache
            sys.dont_write_bytecode = False
        before = set(sys.modules)
        done, failed = preload(self.modules)
        imported = [
            name for name, module in list(sys.modules.items()) if name not in before and not self.own(name, module)
        ]
        watch = ChildWatch()
        threads = thread_count()
        write_line(
            self.outbox,
            {
                "event": "ready",
                "server": self.name,
                "pid": os.getpid(),
                "preloaded": done,
                "failed": failed,
                "threads": threads,
                "import_s": round(time.perf_counter() - started, 3),
                "import_cpu_s": round(time.process_time() - cpu, 3),
                "imported": imported,
            },
        )
        inbox = Lines(self.inbox)
        while True:
            deadlines = [r.deadline for r in self.running.values() if not r.timed_out]
            timeout = max(0.0, min(deadlines) - time.monotonic()) if deadlines else None
            benches = {r.from_child.fd: r for r in self.running.values() if r.from_child and not r.from_child.eof}
            readable, _, _ = select.select([inbox.fd, watch.rfd, *benches], [], [], timeout)
            if watch.rfd in readable:
                watch.drain()
            for fd, run in benches.items():
                if fd in readable:
                    self.relay(run)
            ended = exited(before_reap=self.end_group)
            for pid, status in ended:
                self.finished(pid, status)
            if ended:
                end_strays(keep=self.running)  # what the probes that ended left behind
            for msg in inbox.read() if inbox.fd in readable else []:
                op = msg.get("op")
                if op == "run":
                    self.start(msg, watch)
                elif op == "bench":
                    self.start_bench(msg, watch)
                elif op in ("round", "end"):
                    self.pass_on(msg)
                elif op == "close":
                    inbox.eof = True
            now = time.monotonic()
            for r in self.running.values():
                if not r.timed_out and now >= r.deadline:
                    r.timed_out = True
                    kill_group(r.pid)
            if inbox.eof:
                for r in self.running.values():
                    kill_group(r.pid)
                end_strays()
                write_line(self.outbox, {"event": "closed", "server": self.name})
                os._exit(0)

    def own(self, name: str, module: Any) -> bool:
        """A module of this source (or the lab's): not for the hub to preload for every source."""
        if name.split(".", 1)[0] in ("sglang", "difflab", "__main__", *stubs.STUBBED):
            return True
        path = getattr(module, "__file__", None) or ""
        return path.startswith(self.root)

    def end_group(self, pid: int) -> None:
        """Anything a finished probe left running in its process group goes with it."""
        if pid in self.running:
            kill_group(pid)

    def refuse_unsafe(self, req: dict[str, Any]) -> bool:
        """Forking with threads is not safe: say so (the lab runs the job elsewhere or reports it)."""
        threads = thread_count()
        if threads > 1:
            write_line(
                self.outbox,
                {
                    "event": "done",
                    "server": self.name,
                    "job": req["job"],
                    "pid": None,
                    "unsafe": f"server has {threads} threads; forking it is not safe",
                },
            )
        return threads > 1

    def start(self, req: dict[str, Any], watch: ChildWatch) -> None:
        if self.refuse_unsafe(req):
            return
        pid = fork_child()
        if pid == 0:
            probe_main(req, self.log, [self.inbox, self.outbox, watch.rfd, watch.wfd, *self.bench_fds()])
        now = time.monotonic()
        self.running[pid] = Running(req["job"], pid, now + float(req.get("timeout_s") or 180.0), now)
        write_line(self.outbox, {"event": "started", "server": self.name, "job": req["job"], "pid": pid})

    def start_bench(self, req: dict[str, Any], watch: ChildWatch) -> None:
        """Fork a throughput bench child with a pipe each way; it waits for its first ``round``."""
        if self.refuse_unsafe(req):
            return
        to_r, to_w = os.pipe()
        from_r, from_w = os.pipe()
        pid = fork_child()
        if pid == 0:
            closing = [self.inbox, self.outbox, watch.rfd, watch.wfd, to_w, from_r, *self.bench_fds()]
            bench_main(req, self.log, closing, to_r, from_w)
        os.close(to_r)
        os.close(from_w)
        now = time.monotonic()
        deadline = now + float(req.get("timeout_s") or 180.0)
        self.running[pid] = Running(req["job"], pid, deadline, now, to_child=to_w, from_child=Lines(from_r))
        write_line(self.outbox, {"event": "started", "server": self.name, "job": req["job"], "pid": pid})

    def bench_fds(self) -> list[int]:
        """The server's ends of its bench children's pipes (a new child must not hold them)."""
        return [fd for r in self.running.values() if r.from_child for fd in (r.to_child, r.from_child.fd) if fd]

    def pass_on(self, req: dict[str, Any]) -> None:
        """A ``round`` or ``end`` for a bench child: written to its inbox, its deadline moved."""
        run = next((r for r in self.running.values() if r.job == req.get("job") and r.to_child), None)
        if run is None or run.timed_out:
            return  # it ended: its ``done`` event says how
        run.deadline = time.monotonic() + float(req.get("timeout_s") or 180.0)
        with contextlib.suppress(OSError):  # it died meanwhile; ``done`` follows
            write_line(run.to_child, {k: v for k, v in req.items() if k not in ("server", "job", "timeout_s")})

    def relay(self, run: Running) -> None:
        """What a bench child said, with this server and the job added."""
        assert run.from_child is not None
        for msg in run.from_child.read_all():
            write_line(self.outbox, {**msg, "server": self.name, "job": run.job})

    def finished(self, pid: int, status: int) -> None:
        run = self.running.pop(pid, None)
        if run is None:
            return
        if run.from_child is not None:
            self.relay(run)  # its last words come before its ``done``
            for fd in (run.to_child, run.from_child.fd):
                with contextlib.suppress(OSError):
                    os.close(fd)  # type: ignore[arg-type]
        code = os.waitstatus_to_exitcode(status)
        write_line(
            self.outbox,
            {
                "event": "done",
                "server": self.name,
                "job": run.job,
                "pid": pid,
                "exit": code if code >= 0 else None,
                "signal": -code if code < 0 else None,
                "timed_out": run.timed_out,
                "wall_s": round(time.monotonic() - run.started, 4),
            },
        )
