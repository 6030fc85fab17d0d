"""Process plumbing for the probe processes, inside the shared environment (standard library only).

Non-blocking JSON lines over pipes, SIGCHLD through a self-pipe so one ``select`` waits for
input and exits alike, reaping, process-group kills, output redirection, preloading and a
fork that flushes first. The hub and the source servers are built from these pieces.

Nothing a probe starts may outlive it. Every probe process runs in its own session (so its
process group can be killed as one), and every process that starts probes, and every probe, is
a *child subreaper* (Linux ``prctl(PR_SET_CHILD_SUBREAPER)``): a descendant that escapes into a
session of its own (``setsid``, a double fork) is re-parented to it when its parent ends
instead of to init, and :func:`end_strays` finds and kills it. Where subreapers are not
available only the process group is killed; the Docker back end remains the hermetic option.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import gc
import importlib
import json
import os
import select
import signal
import sys
import time
import traceback
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

from difflab.probe import sandbox

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
    """Splits what arrives on a pipe or socket into JSON messages.

    ``nonblocking=False`` leaves the descriptor as it is (a socket the process also writes to,
    whose writes must not fail half-way): :meth:`read` is then called only once it is readable.
    """

    def __init__(self, fd: int, nonblocking: bool = True) -> None:
        self.fd = fd
        self.buffer = b""
        self.eof = False
        if nonblocking:
            os.set_blocking(fd, False)

    def read(self) -> list[dict[str, Any]]:
        try:
            chunk = os.read(self.fd, 1 << 16)
        except BlockingIOError:
            return []
        except ConnectionResetError:  # a socket's far end left with our words unread: it is gone all the same
            chunk = b""
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
    """The process and anything it started in its group (a probe leads a session, and so a group, of its own).

    ``pid`` must not have been reaped yet (else it may name someone else by now); for a reaped
    session leader use :func:`kill_leftover_group`.
    """
    for kill in (os.killpg, os.kill):
        try:
            kill(pid, signal.SIGKILL)
            return
        except (ProcessLookupError, PermissionError):
            continue


def kill_leftover_group(pgid: int) -> None:
    """What is left of a group whose leader is gone: safe, since Linux reuses no id a live group still has."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36


def _prctl(option: int, value: int) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(option, value, 0, 0, 0)) == 0
    except (OSError, AttributeError):  # not Linux
        return False


def become_subreaper() -> bool:
    """Orphaned descendants come back to this process (not init), where :func:`end_strays` ends them."""
    return _prctl(PR_SET_CHILD_SUBREAPER, 1)


def enter_box() -> None:
    """First thing in every process that starts probes, before any build code is imported: lead a
    session of its own and be a subreaper (so nothing started below escapes it), give up reading the
    lab's secrets, and only then put the build's folder on ``sys.path``."""
    with contextlib.suppress(OSError):  # already a session leader (a container's first process)
        os.setsid()
    become_subreaper()
    sandbox.enter()
    sandbox.add_source()


def die_with_parent(sig: int = signal.SIGKILL) -> bool:
    """Receive ``sig`` when the process (thread) that started this one ends, however it ends."""
    return _prctl(PR_SET_PDEATHSIG, sig)


def children() -> list[int]:
    """The live (or zombie) children of this process, from /proc."""
    me = os.getpid()
    found: set[int] = set()
    try:
        tasks = os.listdir(f"/proc/{me}/task")
    except OSError:
        return []
    listed = False
    for tid in tasks:
        try:
            with open(f"/proc/{me}/task/{tid}/children") as fh:
                found.update(int(pid) for pid in fh.read().split())
            listed = True
        except (OSError, ValueError):
            continue
    if listed:
        return sorted(found)
    for entry in os.listdir("/proc"):  # kernels without /proc/<pid>/task/<tid>/children
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    fields = fh.read().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if int(fields[1]) == me:
                found.add(int(entry))
    return sorted(found)


def end_strays(keep: Collection[int] = (), deadline_s: float = 5.0) -> int:
    """Kill and reap every child of this process not in ``keep``, and whatever those leave behind.

    As a subreaper this process inherits the orphans of what it kills, so it keeps going until
    no stray is left (or ``deadline_s`` passes). Returns how many processes it ended.
    """
    ended = 0
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        strays = [pid for pid in children() if pid not in keep]
        if not strays:
            break
        for pid in strays:
            kill_group(pid)
        for pid in strays:
            while time.monotonic() < deadline:
                try:
                    done, _status = os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:  # reaped elsewhere, or never ours
                    break
                if done:
                    ended += 1
                    break
                time.sleep(0.005)
    return ended


@dataclasses.dataclass(frozen=True)
class Ended:
    """How a supervised probe process ended."""

    exit: int | None
    signal: int | None
    timed_out: bool
    strays: int

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def supervise(run: Callable[[], None], timeout_s: float | None) -> Ended:
    """Run ``run`` in a forked probe process of its own session; end it at ``timeout_s``; end what it left.

    The supervisor (this process) is a subreaper, so what the probe leaves in other sessions comes
    back here and dies with it. SIGTERM or SIGINT to the supervisor (the lab giving up, Ctrl-C)
    ends the probe and everything it started before the supervisor goes.
    """
    become_subreaper()
    watch = ChildWatch()
    stop = {"signal": 0}

    def stopping(signum: int, _frame: Any) -> None:
        stop["signal"] = signum

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, stopping)
    pid = fork_child()
    if pid == 0:
        code = EXIT_CRASH
        try:
            watch.close()
            for signum in (signal.SIGTERM, signal.SIGINT):
                signal.signal(signum, signal.SIG_DFL)
            os.setsid()
            die_with_parent()
            become_subreaper()
            run()
            code = 0
        except BaseException:  # noqa: B036 - report anything, then leave
            traceback.print_exc()
        finally:
            end_strays()
            with contextlib.suppress(Exception):
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(code)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    status, timed_out = None, False
    while status is None:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        with contextlib.suppress(InterruptedError):
            select.select([watch.rfd], [], [], left)
        watch.drain()
        done, wait_status = os.waitpid(pid, os.WNOHANG)
        if done:
            status = wait_status
        elif stop["signal"] or (deadline is not None and time.monotonic() >= deadline):
            timed_out = not stop["signal"]
            kill_group(pid)
            _, status = os.waitpid(pid, 0)
    kill_leftover_group(pid)  # the probe's session may outlive its leader
    strays = end_strays()
    watch.close()
    code = os.waitstatus_to_exitcode(status)
    return Ended(code if code >= 0 else None, -code if code < 0 else None, timed_out, strays)


def enter_forked_child(log: str, import_log: str | None, close_fds: list[int]) -> None:
    """What every child a source server forks (a probe, a throughput bench) does first: a session of its
    own (killed as one at its deadline), dying with its parent, reaping what it daemonises, the signal
    handling of a fresh interpreter, none of the server's pipes, and its output in ``log`` (after the
    server's import log, so the child's log says what was imported)."""
    os.setsid()
    die_with_parent()
    become_subreaper()
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for fd in close_fds:
        with contextlib.suppress(OSError):
            os.close(fd)
    redirect_output(log)
    if import_log:
        with contextlib.suppress(OSError):
            os.write(1, Path(import_log).read_bytes())


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
    # No collection first: the import's few MB of cyclic garbage cost ~0.5 s to find in the hub,
    # on the path every run waits on, and are worth less than that kept for the process's life.
    gc.freeze()
    gc.enable()
    return done, failed


def fork_child() -> int:
    """``os.fork`` with Python's buffers flushed first (else the child prints them again)."""
    sys.stdout.flush()
    sys.stderr.flush()
    return os.fork()
