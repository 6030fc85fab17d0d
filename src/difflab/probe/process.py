"""Process plumbing for the warm back end, inside the shared environment (standard library only).

Non-blocking JSON lines over pipes, SIGCHLD through a self-pipe so one ``select`` waits for
input and exits alike, reaping, process-group kills, output redirection, preloading and a
fork that flushes first. The hub and the source servers are built from these pieces.
"""

from __future__ import annotations

import gc
import importlib
import json
import os
import signal
import sys
import traceback
from typing import Any

EXIT_CRASH = 70
"""A forked process ended by an exception in the lab's code (not the probe's: that is a result)."""


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

    def read_all(self) -> list[dict[str, Any]]:
        """Every message available now: until the writer is gone or nothing more is waiting."""
        out: list[dict[str, Any]] = []
        while not self.eof:
            try:
                chunk = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                break
            if not chunk:
                self.eof = True
                break
            self.buffer += chunk
            *lines, self.buffer = self.buffer.split(b"\n")
            out += [json.loads(line) for line in lines if line.strip()]
        return out


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
