"""Warm probe server: import once, fork a fresh child per probe.

``python -m difflab.probe.hub [--preload MOD,...] [--pycache DIR]``

Runs inside the shared environment (standard library only, like
:mod:`difflab.probe.child`). Importing SGLang costs seconds and ~500 MB per
process, and ~90 % of that is its third-party dependencies (torch,
transformers, ...), which are the same for every SGLang version. So the
process tree is::

    hub           (stdin/stdout: JSON lines to the lab) stubs + third-party modules
     └ server     one per SGLang source, forked from the hub: imports that source's SGLang
        └ probe   one per probe, forked from its server: runs observe(kit), writes JSON, _exit

Fork gives every probe a private copy of the imported state, so a probe's
monkeypatching never reaches the next one. Forking is only safe while the
forking process has a single thread, so hub and server never start one and
check before every fork; a server that finds threads says so (``unsafe``)
and the lab runs those probes in fresh processes instead.

Lab → hub, one JSON object per line:

- ``{"op": "open", "server": S, "root": DIR, "preload": [...], "log": FILE, "timeout_s": T}``
- ``{"op": "run", "server": S, "job": N, "probe": FILE, "out": FILE, "log": FILE, "timeout_s": T}``
- ``{"op": "close", "server": S}``; end of input stops everything.

Hub → lab: ``hub-ready``, ``ready`` / ``server-failed`` (per server),
``started`` and ``done`` (per job: exit code, signal, ``timed_out``,
``unsafe``), ``closed``. The probe's stdout and stderr go to its log file,
after a copy of what its server printed while importing (so a warm log reads
like a fresh process's log).
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import os
import select
import signal
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from difflab.probe import stubs
from difflab.probe.child import run_probe, write_atomic

SERVER_PRELOAD = (
    "sglang.srt.managers.schedule_batch",
    "sglang.srt.managers.scheduler",
    "sglang.srt.disaggregation.prefill",
    "sglang.srt.disaggregation.decode",
    "sglang.srt.disaggregation.utils",
    "sglang.srt.disaggregation.mooncake.conn",
)
"""What a per-source server imports by default: the modules every probe drives."""

HUB_PRELOAD = ("torch", "numpy", "transformers", "openai", "compressed_tensors", "aiohttp", "fastapi")
"""Third-party packages SGLang imports first thing; ~90 % of its import time, identical for all versions."""

EXIT_CRASH = 70
"""A forked process ended by an exception in this module (not the probe's: that is a result)."""


# -- small pieces --------------------------------------------------------------
def thread_count() -> int:
    """Native threads of this process (a thread started by a C extension counts too)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        import threading

        return threading.active_count()


def write_line(fd: int, message: dict[str, Any]) -> None:
    data = (json.dumps(message, sort_keys=True) + "\n").encode()
    while data:
        data = data[os.write(fd, data) :]


class Lines:
    """Splits what arrives on a non-blocking pipe into JSON messages."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buffer = b""
        self.eof = False
        os.set_blocking(fd, False)

    def read(self) -> list[dict[str, Any]]:
        try:
            chunk = os.read(self.fd, 1 << 16)
        except BlockingIOError:
            return []
        if not chunk:
            self.eof = True
            return []
        self.buffer += chunk
        *lines, self.buffer = self.buffer.split(b"\n")
        return [json.loads(line) for line in lines if line.strip()]


class ChildWatch:
    """SIGCHLD through a self-pipe, so one ``select`` waits for input and exits alike."""

    def __init__(self) -> None:
        self.rfd, self.wfd = os.pipe()
        os.set_blocking(self.rfd, False)
        os.set_blocking(self.wfd, False)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.set_wakeup_fd(self.wfd, warn_on_full_buffer=False)

    def drain(self) -> None:
        try:
            while os.read(self.rfd, 4096):
                pass
        except BlockingIOError:
            pass

    def close(self) -> None:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.close(self.rfd)
        os.close(self.wfd)


def exited(before_reap: Any = None) -> list[tuple[int, int]]:
    """(pid, wait status) of every child that has ended, each reaped exactly once.

    ``before_reap(pid)`` runs while the child is still a zombie, so its pid (and
    process group id) cannot have been reused by an unrelated process yet.
    """
    out = []
    while True:
        try:
            if before_reap is not None and hasattr(os, "waitid"):
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
                if info is None or not info.si_pid:
                    break
                before_reap(info.si_pid)
                pid, status = os.waitpid(info.si_pid, 0)
            else:
                pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            break
        out.append((pid, status))
    return out


def kill_group(pid: int) -> None:
    """The process and anything it started (a probe runs in its own process group)."""
    for kill in (os.killpg, os.kill):
        try:
            kill(pid, signal.SIGKILL)
            return
        except (ProcessLookupError, PermissionError):
            continue


def redirect_output(path: str) -> None:
    """fd 1 and 2 to ``path`` (fresh), fd 0 from /dev/null."""
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)


def preload(modules: list[str] | tuple[str, ...]) -> tuple[list[str], dict[str, str]]:
    """Import what can be imported; a module a release lacks is left for the probe to trip over."""
    done, failed = [], {}
    # Imports only allocate: collecting during them finds nothing and costs ~20 % of the time.
    gc.disable()
    for name in modules:
        try:
            importlib.import_module(name)
            done.append(name)
        except BaseException as exc:  # noqa: B036 - a release's import may raise anything
            failed[name] = f"{type(exc).__name__}: {exc}"
            traceback.print_exc()
    sys.stdout.flush()
    sys.stderr.flush()
    # Imported objects never change again: keep the collector (and its writes) off their pages,
    # so forked children share them copy-on-write instead of copying them on the first collection.
    gc.enable()
    gc.collect()
    gc.freeze()
    return done, failed


def fork_child() -> int:
    """``os.fork`` with Python's buffers flushed first (else the child prints them again)."""
    sys.stdout.flush()
    sys.stderr.flush()
    return os.fork()


# -- the probe process -----------------------------------------------------------
def probe_main(req: dict[str, Any], import_log: str | None, close_fds: list[int]) -> None:
    """In the forked probe process: never returns."""
    code = EXIT_CRASH
    try:
        os.setpgid(0, 0)
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a fresh interpreter
        for fd in close_fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        redirect_output(req["log"])
        if import_log:
            with contextlib.suppress(OSError):
                os.write(1, Path(import_log).read_bytes())
        os.chdir(Path(req["out"]).parent)
        result = run_probe(Path(req["probe"]))
        write_atomic(Path(req["out"]), result)
        code = 0
    except BaseException:  # noqa: B036 - report anything, then leave
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


# -- per-source server -------------------------------------------------------------
@dataclass
class Running:
    """One probe process of a server."""

    job: Any
    pid: int
    deadline: float
    started: float
    timed_out: bool = False


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
        started, cpu = time.perf_counter(), time.process_time()
        sys.path.insert(1, self.root)
        child_path = os.environ.get("PYTHONPATH", "")
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (self.root, child_path) if p)
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
            readable, _, _ = select.select([inbox.fd, watch.rfd], [], [], timeout)
            if watch.rfd in readable:
                watch.drain()
            for pid, status in exited(before_reap=self.end_group):
                self.finished(pid, status)
            for msg in inbox.read() if inbox.fd in readable else []:
                if msg.get("op") == "run":
                    self.start(msg, watch)
                elif msg.get("op") == "close":
                    inbox.eof = True
            now = time.monotonic()
            for r in self.running.values():
                if not r.timed_out and now >= r.deadline:
                    r.timed_out = True
                    kill_group(r.pid)
            if inbox.eof:
                for r in self.running.values():
                    kill_group(r.pid)
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

    def start(self, req: dict[str, Any], watch: ChildWatch) -> None:
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
            return
        pid = fork_child()
        if pid == 0:
            probe_main(req, self.log, [self.inbox, self.outbox, watch.rfd, watch.wfd])
        with contextlib.suppress(OSError):  # the child does it too; whoever runs first wins the race
            os.setpgid(pid, pid)
        now = time.monotonic()
        self.running[pid] = Running(req["job"], pid, now + float(req.get("timeout_s") or 180.0), now)
        write_line(self.outbox, {"event": "started", "server": self.name, "job": req["job"], "pid": pid})

    def finished(self, pid: int, status: int) -> None:
        run = self.running.pop(pid, None)
        if run is None:
            return
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


# -- hub ---------------------------------------------------------------------------
@dataclass
class Handle:
    """The hub's view of one forked server."""

    name: str
    pid: int
    to_server: int
    lines: Lines
    deadline: float | None
    log: str
    probes: set[int] = field(default_factory=set)
    closing: bool = False


@dataclass
class Hub:
    """Reads lab requests, forks one server per source, relays every event back."""

    out: int
    pycache: str | None = None
    servers: dict[str, Handle] = field(default_factory=dict)

    def serve(self) -> None:
        watch = ChildWatch()
        inbox = Lines(0)
        while True:
            fds = [inbox.fd, watch.rfd] + [h.lines.fd for h in self.servers.values() if not h.lines.eof]
            deadlines = [h.deadline for h in self.servers.values() if h.deadline is not None]
            timeout = max(0.0, min(deadlines) - time.monotonic()) if deadlines else None
            readable, _, _ = select.select(fds, [], [], timeout)
            if watch.rfd in readable:
                watch.drain()
            for handle in list(self.servers.values()):
                if handle.lines.fd in readable:
                    for msg in handle.lines.read():
                        self.relay(handle, msg)
            if inbox.fd in readable:
                for msg in inbox.read():
                    self.request(msg, watch)
            for pid, status in exited():
                self.server_ended(pid, status)
            now = time.monotonic()
            for handle in list(self.servers.values()):
                if handle.deadline is not None and now >= handle.deadline:
                    handle.deadline = None
                    kill_group(handle.pid)
                    self.fail(handle, "server did not finish importing in time; killed")
            if inbox.eof:
                for handle in self.servers.values():
                    self.kill_server(handle)
                os._exit(0)

    def request(self, msg: dict[str, Any], watch: ChildWatch) -> None:
        op, name = msg.get("op"), msg.get("server", "")
        if op == "open":
            self.open(name, msg, watch)
            return
        handle = self.servers.get(name)
        if handle is None:
            if op == "run":
                write_line(
                    self.out,
                    {
                        "event": "done",
                        "server": name,
                        "job": msg.get("job"),
                        "unsafe": f"no server {name!r} (failed or closed)",
                    },
                )
            return
        if op == "close":
            handle.closing = True
        with contextlib.suppress(OSError):  # it died; server_ended reports that
            write_line(handle.to_server, msg)

    def open(self, name: str, msg: dict[str, Any], watch: ChildWatch) -> None:
        threads = thread_count()
        if threads > 1:
            write_line(
                self.out,
                {
                    "event": "server-failed",
                    "server": name,
                    "unsafe": True,
                    "log": "",
                    "reason": f"hub has {threads} threads; forking it is not safe",
                },
            )
            return
        to_r, to_w = os.pipe()
        from_r, from_w = os.pipe()
        pid = fork_child()
        if pid == 0:
            try:
                os.setpgid(0, 0)
                inherited = [self.out, watch.rfd, watch.wfd, to_w, from_r]
                for h in self.servers.values():
                    inherited += [h.to_server, h.lines.fd]
                watch.close()
                for fd in inherited:
                    with contextlib.suppress(OSError):
                        os.close(fd)
                SourceServer(
                    name=name,
                    root=msg["root"],
                    modules=list(msg.get("preload", SERVER_PRELOAD)),
                    log=msg["log"],
                    inbox=to_r,
                    outbox=from_w,
                    pycache=self.pycache,
                ).serve()
            except BaseException:  # noqa: B036
                traceback.print_exc()
            finally:
                os._exit(EXIT_CRASH)
        os.close(to_r)
        os.close(from_w)
        timeout = float(msg.get("timeout_s") or 600.0)
        self.servers[name] = Handle(name, pid, to_w, Lines(from_r), time.monotonic() + timeout, msg["log"])

    def relay(self, handle: Handle, msg: dict[str, Any]) -> None:
        event = msg.get("event")
        if event == "ready":
            handle.deadline = None
        elif event == "started":
            handle.probes.add(int(msg["pid"]))
        elif event == "done" and msg.get("pid"):
            handle.probes.discard(int(msg["pid"]))
        write_line(self.out, msg)

    def server_ended(self, pid: int, status: int) -> None:
        handle = next((h for h in self.servers.values() if h.pid == pid), None)
        if handle is None:
            return
        for msg in handle.lines.read():  # anything it said before it went
            self.relay(handle, msg)
        for probe in handle.probes:
            kill_group(probe)
        self.close_handle(handle)
        if not handle.closing:
            code = os.waitstatus_to_exitcode(status)
            self.fail(handle, f"server exited ({'signal ' + str(-code) if code < 0 else 'exit ' + str(code)})")

    def fail(self, handle: Handle, reason: str) -> None:
        log = ""
        with contextlib.suppress(OSError):
            log = "\n".join(Path(handle.log).read_text(errors="replace").strip().splitlines()[-30:])
        write_line(self.out, {"event": "server-failed", "server": handle.name, "reason": reason, "log": log})
        self.close_handle(handle)

    def kill_server(self, handle: Handle) -> None:
        for probe in handle.probes:
            kill_group(probe)
        kill_group(handle.pid)

    def close_handle(self, handle: Handle) -> None:
        if self.servers.pop(handle.name, None) is None:
            return
        for fd in (handle.to_server, handle.lines.fd):
            with contextlib.suppress(OSError):
                os.close(fd)


def main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m difflab.probe.hub")
    parser.add_argument("--preload", default=",".join(HUB_PRELOAD), help="comma-separated modules for the hub")
    parser.add_argument("--preload-file", default="", help="more hub modules, one a line (learned from servers)")
    parser.add_argument("--pycache", default="", help="bytecode cache folder for the sources (sys.pycache_prefix)")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    # Ctrl-C reaches the lab and the hub alike; the lab then ends the hub by closing its input.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # The protocol gets its own descriptor; anything an import prints to stdout lands in the log.
    out = os.dup(1)
    os.dup2(2, 1)
    stubs.install()
    modules = [m for m in args.preload.split(",") if m]
    if args.preload_file:
        with contextlib.suppress(OSError):
            modules += Path(args.preload_file).read_text().split()
    done, failed = preload(list(dict.fromkeys(modules)))
    threads = thread_count()
    write_line(
        out,
        {
            "event": "hub-ready",
            "pid": os.getpid(),
            "preloaded": len(done),
            "failed": failed,
            "threads": threads,
            "import_s": round(time.perf_counter() - started, 3),
            "import_cpu_s": round(time.process_time(), 3),
        },
    )
    if threads > 1:
        print(f"hub has {threads} threads after its imports; servers would fork unsafely", file=sys.stderr)
    Hub(out=out, pycache=args.pycache or None).serve()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
