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
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from difflab.probe import sandbox, stubs
from difflab.probe.bench import bench_main
from difflab.probe.child import run_probe, write_atomic
from difflab.probe.loop import Loop
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

    loop: Loop = field(default_factory=Loop)
    watch: ChildWatch | None = None
    inbox_lines: Lines | None = None

    def serve(self) -> None:
        """Import the source, say ``ready``, then serve requests until ``close`` or end of input."""
        redirect_output(self.log)
        become_subreaper()  # a probe's escaped descendants come back here when it ends
        sandbox.confine_to_build(self.root)  # before the build's first import: its writes narrowed to its own
        ready = self.import_source()
        self.watch = watch = ChildWatch()
        write_line(self.outbox, ready | {"threads": thread_count()})
        self.inbox_lines = inbox = Lines(self.inbox)
        self.loop.read(watch.rfd, watch.drain)
        self.loop.read(inbox.fd, lambda: [self.request(msg) for msg in inbox.read()])
        self.loop.run(self.after_wake)

    def import_source(self) -> dict[str, Any]:
        """The source's SGLang imported once, for every probe forked from here; the ``ready`` event."""
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
        return {
            "event": "ready",
            "server": self.name,
            "pid": os.getpid(),
            "preloaded": done,
            "failed": failed,
            "import_s": round(time.perf_counter() - started, 3),
            "import_cpu_s": round(time.process_time() - cpu, 3),
            "imported": imported,
        }

    def request(self, msg: dict[str, Any]) -> None:
        op = msg.get("op")
        if op == "run":
            self.start(msg)
        elif op == "bench":
            self.start_bench(msg)
        elif op in ("round", "end"):
            self.pass_on(msg)
        elif op == "close" and self.inbox_lines is not None:
            self.inbox_lines.eof = True

    def after_wake(self) -> None:
        """Reap the probes that ended (each reported ``done``); at ``close`` or end of input, end all and leave."""
        ended = exited(before_reap=self.end_group)
        for pid, status in ended:
            self.finished(pid, status)
        if ended:
            end_strays(keep=self.running)  # what the probes that ended left behind
        if self.inbox_lines is not None and self.inbox_lines.eof:
            for r in self.running.values():
                kill_group(r.pid)
            end_strays()
            write_line(self.outbox, {"event": "closed", "server": self.name})
            os._exit(0)

    def overdue(self, run: Running) -> None:
        run.timed_out = True
        kill_group(run.pid)

    def watch_until(self, run: Running, deadline: float) -> None:
        run.deadline = deadline
        self.loop.at(("probe", run.pid), deadline, lambda: self.overdue(run))

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

    def start(self, req: dict[str, Any]) -> None:
        if self.refuse_unsafe(req):
            return
        pid = fork_child()
        if pid == 0:
            probe_main(req, self.log, self.forked_child_closes())
        now = time.monotonic()
        run = self.running[pid] = Running(req["job"], pid, 0.0, now)
        self.watch_until(run, now + float(req.get("timeout_s") or 180.0))
        write_line(self.outbox, {"event": "started", "server": self.name, "job": req["job"], "pid": pid})

    def start_bench(self, req: dict[str, Any]) -> None:
        """Fork a throughput bench child with a pipe each way; it waits for its first ``round``."""
        if self.refuse_unsafe(req):
            return
        to_r, to_w = os.pipe()
        from_r, from_w = os.pipe()
        pid = fork_child()
        if pid == 0:
            bench_main(req, self.log, [*self.forked_child_closes(), to_w, from_r], to_r, from_w)
        os.close(to_r)
        os.close(from_w)
        now = time.monotonic()
        run = self.running[pid] = Running(req["job"], pid, 0.0, now, to_child=to_w, from_child=Lines(from_r))
        self.watch_until(run, now + float(req.get("timeout_s") or 180.0))
        self.loop.read(from_r, lambda: self.relay(run))
        write_line(self.outbox, {"event": "started", "server": self.name, "job": req["job"], "pid": pid})

    def forked_child_closes(self) -> list[int]:
        """What a new probe process must not hold: the server's pipes, its loop and its bench children's pipes."""
        assert self.watch is not None
        own = [self.inbox, self.outbox, self.watch.rfd, self.watch.wfd, self.loop.fileno()]
        return own + [fd for r in self.running.values() if r.from_child for fd in (r.to_child, r.from_child.fd) if fd]

    def pass_on(self, req: dict[str, Any]) -> None:
        """A ``round`` or ``end`` for a bench child: written to its inbox, its deadline moved."""
        run = next((r for r in self.running.values() if r.job == req.get("job") and r.to_child), None)
        if run is None or run.timed_out:
            return  # it ended: its ``done`` event says how
        self.watch_until(run, time.monotonic() + float(req.get("timeout_s") or 180.0))
        with contextlib.suppress(OSError):  # it died meanwhile; ``done`` follows
            write_line(run.to_child, {k: v for k, v in req.items() if k not in ("server", "job", "timeout_s")})

    def relay(self, run: Running) -> None:
        """What a bench child said, with this server and the job added."""
        assert run.from_child is not None
        for msg in run.from_child.read_all():
            write_line(self.outbox, {**msg, "server": self.name, "job": run.job})
        if run.from_child.eof:
            self.loop.forget(run.from_child.fd)

    def finished(self, pid: int, status: int) -> None:
        run = self.running.pop(pid, None)
        if run is None:
            return
        self.loop.cancel(("probe", pid))
        if run.from_child is not None:
            self.relay(run)  # its last words come before its ``done``
            self.loop.forget(run.from_child.fd)
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
