"""Warm probe server: import once, fork a fresh child per probe.

``python -m difflab.probe.hub --listen-fd N [--idle-s S] [--lock FILE] [--folder DIR] [--preload MOD,...]``
(and ``--preload-file FILE``, ``--pycache DIR``)

Runs inside the shared environment (standard library only, like
:mod:`difflab.probe.child`). Importing SGLang costs seconds and ~500 MB per
process, and ~90 % of that is its third-party dependencies (torch,
transformers, ...), which are the same for every SGLang version. So the
process tree is::

    hub           (a Unix socket: JSON lines to the lab) stubs + third-party modules
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
- ``{"op": "bench", "server": S, "job": N, "probe": FILE, "log": FILE, "timeout_s": T}`` (a throughput
  bench child, :mod:`difflab.probe.bench`), then ``round`` / ``end`` for its job, passed on to it
- ``{"op": "close", "server": S}``; end of input stops every server and probe of that lab.

The lab connects to a listening socket it made and handed over (``--listen-fd``); the hub
serves one connection at a time and greets each with ``hub-ready``. With ``--idle-s 0`` it
leaves when its first lab leaves; otherwise it waits that long for the next one (a kept hub:
the seconds of third-party imports are paid once, not per command), and leaves when the wait
runs out while no lab holds ``--lock`` (one that does is about to connect). What the hub
holds between labs is only what it imported before the first: every server and probe of a
lab ends with that lab's connection, so the next lab forks from the same state.

Hub → lab: ``hub-ready``, ``ready`` / ``server-failed`` (per server),
``started`` and ``done`` (per job: exit code, signal, ``timed_out``,
``unsafe``), ``closed``; a bench child's ``bench-ready``, ``bench-failed`` and
``round`` messages, with its server and job. The probe's stdout and stderr go to its log file,
after a copy of what its server printed while importing (so a warm log reads
like a fresh process's log).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import shutil
import signal
import socket
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from difflab.probe import process, stubs
from difflab.probe.loop import Loop
from difflab.probe.source_server import SERVER_PRELOAD, SourceServer

HUB_PRELOAD = ("torch", "numpy", "transformers", "openai", "compressed_tensors", "aiohttp", "fastapi")
"""Third-party packages SGLang imports first thing; ~90 % of its import time, identical for all versions."""


@dataclass
class Handle:
    """The hub's view of one forked server."""

    name: str
    pid: int
    to_server: int
    lines: process.Lines
    log: str
    probes: set[int] = field(default_factory=set)
    closing: bool = False


@dataclass
class Hub:
    """Serves one lab at a time on its socket: forks one server per source, relays every event back."""

    listener: socket.socket
    info: dict[str, Any]
    """The ``hub-ready`` greeting (what was imported, how long it took), sent to every lab."""
    idle_s: float = 0.0
    lock: str | None = None
    folder: str | None = None
    pycache: str | None = None
    out: int | None = None
    servers: dict[str, Handle] = field(default_factory=dict)
    loop: Loop = field(default_factory=Loop)
    watch: process.ChildWatch | None = None
    inbox: process.Lines | None = None
    conn: socket.socket | None = None
    served: int = 0

    def serve(self) -> None:
        """The hub's loop: a lab's requests, each server's events, ended children, deadlines."""
        process.become_subreaper()  # probes of a server that died come back here, and are ended
        self.watch = watch = process.ChildWatch()
        self.loop.read(watch.rfd, watch.drain)
        signal.signal(signal.SIGTERM, lambda *_: self.leave())
        self.listen()
        self.loop.run(self.after_wake)

    def listen(self) -> None:
        """Wait for the next lab: the first one at once (it made the socket), later ones for ``idle_s``."""
        self.loop.read(self.listener.fileno(), self.accept)
        wait = self.idle_s if self.served else max(self.idle_s, 60.0)
        self.loop.at("idle", time.monotonic() + wait, self.idle_out)

    def accept(self) -> None:
        conn, _ = self.listener.accept()
        self.loop.forget(self.listener.fileno())
        self.loop.cancel("idle")
        self.conn, self.out = conn, conn.fileno()
        self.inbox = inbox = process.Lines(conn.fileno(), nonblocking=False)
        self.emit({**self.info, "served": self.served, "reused": self.served > 0})
        self.served += 1
        assert self.watch is not None
        watch = self.watch
        self.loop.read(inbox.fd, lambda: [self.request(msg, watch) for msg in inbox.read()])

    def emit(self, message: dict[str, Any]) -> None:
        """To the lab now connected; a lab that has gone hears nothing (its end of input follows)."""
        if self.out is None:
            return
        with contextlib.suppress(OSError):
            process.write_line(self.out, message)

    def after_wake(self) -> None:
        """Reap what ended; at a lab's end of input, end its servers and probes and wait for the next."""
        ended = process.exited()
        for pid, status in ended:
            self.server_ended(pid, status)
        if ended:
            process.end_strays(keep={h.pid for h in self.servers.values()})
        if self.inbox is not None and self.inbox.eof:
            self.disconnect()

    def disconnect(self) -> None:
        for handle in list(self.servers.values()):
            self.kill_server(handle)
            self.close_handle(handle)
        process.end_strays()
        if self.inbox is not None:
            self.loop.forget(self.inbox.fd)
        if self.conn is not None:
            self.conn.close()
        self.conn = self.out = self.inbox = None
        if self.idle_s <= 0:
            self.leave()
        self.listen()

    def idle_out(self) -> None:
        """Nobody came for ``idle_s``: leave, unless a lab holds the lock (it is about to connect)."""
        if self.lock:
            try:
                fd = os.open(self.lock, os.O_RDONLY)
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held until this process is gone
            except BlockingIOError:
                self.loop.at("idle", time.monotonic() + max(self.idle_s, 1.0), self.idle_out)
                return
            except OSError:
                pass  # no lock file (the cache was removed): nobody can be coming
        self.leave()

    def leave(self) -> None:
        """End every server and probe, remove the socket's folder, exit."""
        for handle in list(self.servers.values()):
            self.kill_server(handle)
        process.end_strays()
        with contextlib.suppress(OSError):
            self.listener.close()
        if self.folder:
            shutil.rmtree(self.folder, ignore_errors=True)
        os._exit(0)

    def server_said(self, handle: Handle) -> None:
        for msg in handle.lines.read():
            self.relay(handle, msg)
        if handle.lines.eof:
            self.loop.forget(handle.lines.fd)

    def import_overdue(self, handle: Handle) -> None:
        process.kill_group(handle.pid)
        self.fail(handle, "server did not finish importing in time; killed")

    def request(self, msg: dict[str, Any], watch: process.ChildWatch) -> None:
        op, name = msg.get("op"), msg.get("server", "")
        if op == "open":
            self.open(name, msg, watch)
            return
        handle = self.servers.get(name)
        if handle is None:
            if op in ("run", "bench"):
                self.emit(
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
            process.write_line(handle.to_server, msg)

    def open(self, name: str, msg: dict[str, Any], watch: process.ChildWatch) -> None:
        threads = process.thread_count()
        if threads > 1:
            self.emit(
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
        pid = process.fork_child()
        if pid == 0:
            try:
                os.setpgid(0, 0)
                inherited = [self.listener.fileno(), watch.rfd, watch.wfd, to_w, from_r]
                inherited += [self.out] if self.out is not None else []
                for h in self.servers.values():
                    inherited += [h.to_server, h.lines.fd]
                self.loop.close()  # the server waits on a loop of its own
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
                os._exit(process.EXIT_CRASH)
        os.close(to_r)
        os.close(from_w)
        handle = Handle(name, pid, to_w, process.Lines(from_r), msg["log"])
        self.servers[name] = handle
        self.loop.read(from_r, lambda: self.server_said(handle))
        deadline = time.monotonic() + float(msg.get("timeout_s") or 600.0)
        self.loop.at(("import", name), deadline, lambda: self.import_overdue(handle))

    def relay(self, handle: Handle, msg: dict[str, Any]) -> None:
        event = msg.get("event")
        if event == "ready":
            self.loop.cancel(("import", handle.name))
        elif event == "started":
            handle.probes.add(int(msg["pid"]))
        elif event == "done" and msg.get("pid"):
            handle.probes.discard(int(msg["pid"]))
        self.emit(msg)

    def server_ended(self, pid: int, status: int) -> None:
        handle = next((h for h in self.servers.values() if h.pid == pid), None)
        if handle is None:
            return
        for msg in handle.lines.read():  # anything it said before it went
            self.relay(handle, msg)
        for probe in handle.probes:
            process.kill_group(probe)
        self.close_handle(handle)
        if not handle.closing:
            code = os.waitstatus_to_exitcode(status)
            self.fail(handle, f"server exited ({'signal ' + str(-code) if code < 0 else 'exit ' + str(code)})")

    def fail(self, handle: Handle, reason: str) -> None:
        log = ""
        with contextlib.suppress(OSError):
            log = "\n".join(Path(handle.log).read_text(errors="replace").strip().splitlines()[-30:])
        self.emit({"event": "server-failed", "server": handle.name, "reason": reason, "log": log})
        self.close_handle(handle)

    def kill_server(self, handle: Handle) -> None:
        for probe in handle.probes:
            process.kill_group(probe)
        process.kill_group(handle.pid)

    def close_handle(self, handle: Handle) -> None:
        if self.servers.pop(handle.name, None) is None:
            return
        self.loop.forget(handle.lines.fd)
        self.loop.cancel(("import", handle.name))
        for fd in (handle.to_server, handle.lines.fd):
            with contextlib.suppress(OSError):
                os.close(fd)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m difflab.probe.hub")
    parser.add_argument("--listen-fd", type=int, required=True, help="a listening Unix socket the lab handed over")
    parser.add_argument("--idle-s", type=float, default=0.0, help="wait this long for the next lab (0: leave)")
    parser.add_argument("--lock", default="", help="a lab holding this file's lock is about to connect")
    parser.add_argument("--folder", default="", help="the socket's folder, removed when the hub leaves")
    parser.add_argument("--preload", default=",".join(HUB_PRELOAD), help="comma-separated modules for the hub")
    parser.add_argument("--preload-file", default="", help="more hub modules, one a line (learned from servers)")
    parser.add_argument("--pycache", default="", help="bytecode cache folder for the sources (sys.pycache_prefix)")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    listener = socket.socket(fileno=args.listen_fd)
    process.enter_box()  # before the first import of a third-party module
    # Ctrl-C reaches the lab and the hub alike; the lab then ends its servers by closing its connection.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.dup2(2, 1)  # anything an import prints to stdout lands in the log
    stubs.install()
    modules = [m for m in args.preload.split(",") if m]
    if args.preload_file:
        with contextlib.suppress(OSError):
            modules += Path(args.preload_file).read_text().split()
    done, failed = process.preload(list(dict.fromkeys(modules)))
    threads = process.thread_count()
    info = {
        "event": "hub-ready",
        "pid": os.getpid(),
        "preloaded": len(done),
        "failed": failed,
        "threads": threads,
        "import_s": round(time.perf_counter() - started, 3),
        "import_cpu_s": round(time.process_time(), 3),
    }
    if threads > 1:
        print(f"hub has {threads} threads after its imports; servers would fork unsafely", file=sys.stderr)
    hub = Hub(listener, info, idle_s=args.idle_s, lock=args.lock or None, folder=args.folder or None)
    hub.pycache = args.pycache or None
    hub.serve()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
