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
- ``{"op": "bench", "server": S, "job": N, "probe": FILE, "log": FILE, "timeout_s": T}`` (a throughput
  bench child, :mod:`difflab.probe.bench`), then ``round`` / ``end`` for its job, passed on to it
- ``{"op": "close", "server": S}``; end of input stops everything.

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
import os
import signal
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
    """Reads lab requests, forks one server per source, relays every event back."""

    out: int
    pycache: str | None = None
    servers: dict[str, Handle] = field(default_factory=dict)
    loop: Loop = field(default_factory=Loop)
    watch: process.ChildWatch | None = None
    inbox: process.Lines | None = None

    def serve(self) -> None:
        """The hub's loop: requests on stdin, each server's events, ended children, import deadlines."""
        process.become_subreaper()  # probes of a server that died come back here, and are ended
        self.watch = watch = process.ChildWatch()
        self.inbox = inbox = process.Lines(0)
        self.loop.read(watch.rfd, watch.drain)
        self.loop.read(inbox.fd, lambda: [self.request(msg, watch) for msg in inbox.read()])
        self.loop.run(self.after_wake)

    def after_wake(self) -> None:
        """Reap what ended; at end of input, end every server and leave."""
        ended = process.exited()
        for pid, status in ended:
            self.server_ended(pid, status)
        if ended:
            process.end_strays(keep={h.pid for h in self.servers.values()})
        if self.inbox is not None and self.inbox.eof:
            for handle in self.servers.values():
                self.kill_server(handle)
            process.end_strays()
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
                process.write_line(
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
            process.write_line(handle.to_server, msg)

    def open(self, name: str, msg: dict[str, Any], watch: process.ChildWatch) -> None:
        threads = process.thread_count()
        if threads > 1:
            process.write_line(
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
        pid = process.fork_child()
        if pid == 0:
            try:
                os.setpgid(0, 0)
                inherited = [self.out, watch.rfd, watch.wfd, to_w, from_r]
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
        process.write_line(self.out, msg)

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
        process.write_line(self.out, {"event": "server-failed", "server": handle.name, "reason": reason, "log": log})
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
    parser.add_argument("--preload", default=",".join(HUB_PRELOAD), help="comma-separated modules for the hub")
    parser.add_argument("--preload-file", default="", help="more hub modules, one a line (learned from servers)")
    parser.add_argument("--pycache", default="", help="bytecode cache folder for the sources (sys.pycache_prefix)")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    process.enter_box()  # before the first import of a third-party module
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
    done, failed = process.preload(list(dict.fromkeys(modules)))
    threads = process.thread_count()
    process.write_line(
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
