"""The process plumbing every probe runs on, driven in this process with real forks, pipes and signals.

A message cut or lost on its pipe, a child reaped twice or never, a probe left running past its
timeout or a stray that survives changes the observation (or the error) a verdict is built from.
These run here, not in a probe process, so each piece is seen as it is called; every test undoes
what it changes in this process (signal handlers, the subreaper and parent-death settings).
"""

from __future__ import annotations

import ctypes
import functools
import gc
import json
import os
import select
import signal
import socket
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NoReturn

import pytest

from difflab.probe import process
from difflab.probe.process import EXIT_CRASH, ChildWatch, Ended, Lines

PR_GET_PDEATHSIG = 2
PR_GET_CHILD_SUBREAPER = 37
GUARD_S = 10.0
"""How long a test waits for something that happens at once, before it calls it lost (never the result)."""


def prctl_get(option: int) -> int:
    value = ctypes.c_int(-1)
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.prctl(option, ctypes.byref(value), 0, 0, 0) == 0
    return value.value


@pytest.fixture
def restored() -> Iterator[None]:
    """This process as it was: its signal handlers, wake-up fd, subreaper and parent-death settings."""
    handlers = {s: signal.getsignal(s) for s in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT)}
    wakeup = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(wakeup)
    subreaper, deathsig = prctl_get(PR_GET_CHILD_SUBREAPER), prctl_get(PR_GET_PDEATHSIG)
    try:
        yield
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
        signal.set_wakeup_fd(wakeup)
        process._prctl(process.PR_SET_CHILD_SUBREAPER, subreaper)
        process._prctl(process.PR_SET_PDEATHSIG, deathsig)


def eof_within(fd: int) -> bool:
    """The pipe's every writer is gone (so every process holding it has ended)."""
    while select.select([fd], [], [], GUARD_S)[0]:
        if not os.read(fd, 4096):
            return True
    return False


def alone(test: Callable[..., None]) -> Callable[..., None]:
    """Run ``test`` in a process forked for it: a supervisor ends and counts *every* child of its process,
    and a test worker also holds what earlier tests in it left running (servers, their orphans once it
    is a subreaper), which would be counted -- or killed -- too. The fork starts with no children."""

    @functools.wraps(test)
    def run(*args: object, **kwargs: object) -> None:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            process.die_with_parent()  # a test run killed mid-test (a timeout) leaves no fork waiting behind
            code = 0
            try:
                test(*args, **kwargs)
            except BaseException:  # noqa: BLE001 - every failure goes back to the test
                os.write(w, traceback.format_exc().encode())
                code = 1
            os._exit(code)
        os.close(w)
        with os.fdopen(r, "rb") as fh:
            failure = fh.read().decode()
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0 and not failure, failure or f"status {status}"

    return run


def blocked_child(hold: int, own_session: bool = False) -> int:
    """A child that holds the write end ``hold`` and waits until it is killed."""
    pid = os.fork()
    if pid == 0:
        if own_session:
            os.setsid()
        wait_to_be_killed()
    return pid


def wait_to_be_killed() -> NoReturn:
    """Wait for SIGKILL; should a test fail to send it, hold none of this process's output (whose reader
    would wait for it) and go by itself after a minute."""
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    signal.alarm(60)
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM])
    while True:
        signal.pause()


def wait_exited(pid: int) -> None:
    """Until ``pid`` has ended, leaving it unreaped."""
    os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)


def state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().rsplit(")", 1)[1].split()[0]


# -- messages on pipes and sockets ------------------------------------------------------------------------


def test_a_message_is_one_sorted_json_line() -> None:
    r, w = os.pipe()
    try:
        process.write_line(w, {"b": 1, "a": ["x", None]})
        assert os.read(r, 4096) == b'{"a": ["x", null], "b": 1}\n'
    finally:
        os.close(r)
        os.close(w)


def test_lines_come_whole_however_they_arrive_and_the_end_is_seen() -> None:
    r, w = os.pipe()
    lines = Lines(r)
    try:
        assert not os.get_blocking(r)
        assert lines.read() == [] and lines.eof is False  # nothing yet: not the end
        os.write(w, b'{"a": 1}\n\n{"b": ')
        assert lines.read() == [{"a": 1}]
        os.write(w, b'2}\n{"c": 3}\n')
        assert lines.read() == [{"b": 2}, {"c": 3}]
        os.close(w)
        assert lines.read() == [] and lines.eof
    finally:
        os.close(r)


def test_a_message_longer_than_one_read_is_reassembled() -> None:
    r, w = os.pipe()
    big = {"payload": "x" * 300_000, "n": 1}
    writer = threading.Thread(target=lambda: (process.write_line(w, big), process.write_line(w, {"n": 2})))
    writer.start()
    lines, got = Lines(r), []
    try:
        while len(got) < 2 and select.select([r], [], [], GUARD_S)[0]:
            got += lines.read()
    finally:
        writer.join()
        os.close(r)
        os.close(w)
    assert got == [big, {"n": 2}]


def test_read_all_takes_what_is_there_and_stops_at_the_end(tmp_path: Path) -> None:
    r, w = os.pipe()
    lines = Lines(r)
    try:
        assert lines.read_all() == [] and not lines.eof
        os.write(w, b'{"a": 1}\n\n{"b": 2}\n{"c"')
        assert lines.read_all() == [{"a": 1}, {"b": 2}] and not lines.eof
        os.write(w, b": 3}\n")
        os.close(w)
        assert lines.read_all() == [{"c": 3}] and lines.eof
        assert lines.read_all() == []
    finally:
        os.close(r)
    path = tmp_path / "messages"
    path.write_text("".join(json.dumps({"i": i, "pad": "y" * 40_000}) + "\n" for i in range(4)))
    fd = os.open(path, os.O_RDONLY)
    try:
        whole = Lines(fd)
        assert [m["i"] for m in whole.read_all()] == [0, 1, 2, 3] and whole.eof
    finally:
        os.close(fd)


def test_a_socket_is_left_blocking_and_a_reset_reads_as_its_end() -> None:
    ours, theirs = socket.socketpair()
    try:
        lines = Lines(ours.fileno(), nonblocking=False)
        assert os.get_blocking(ours.fileno())
        theirs.sendall(b'{"a": 1}\n')
        assert lines.read() == [{"a": 1}] and not lines.eof
        ours.sendall(b"unread by them")
        theirs.close()  # gone with our words unread: a reset, not an error
        assert lines.read() == [] and lines.eof
    finally:
        ours.close()


# -- children: their ends, their groups, what they leave --------------------------------------------------


@alone
def test_a_child_ending_wakes_the_watch_and_closing_it_restores_the_signal(restored: None) -> None:
    watch = ChildWatch()
    assert not os.get_blocking(watch.rfd) and not os.get_blocking(watch.wfd)
    pid = os.fork()
    if pid == 0:
        os._exit(4)
    assert select.select([watch.rfd], [], [], GUARD_S)[0] == [watch.rfd]
    wait_exited(pid)
    watch.drain()
    assert select.select([watch.rfd], [], [], 0)[0] == []
    (ended,) = process.exited()
    assert ended[0] == pid and os.waitstatus_to_exitcode(ended[1]) == 4
    watch.close()
    assert signal.getsignal(signal.SIGCHLD) == signal.SIG_DFL
    assert signal.set_wakeup_fd(-1) == -1
    for fd in (watch.rfd, watch.wfd):
        with pytest.raises(OSError):
            os.fstat(fd)


@alone
def test_every_ended_child_is_reaped_once_and_seen_before_it_is() -> None:
    codes = {}
    for code in (3, 5):
        pid = os.fork()
        if pid == 0:
            os._exit(code)
        codes[pid] = code
    r, w = os.pipe()
    running = blocked_child(w)
    os.close(w)
    try:
        for pid in codes:
            wait_exited(pid)
        seen: list[tuple[int, str]] = []
        ended = process.exited(lambda pid: seen.append((pid, state(pid))))
        assert {pid: os.waitstatus_to_exitcode(s) for pid, s in ended} == codes
        assert sorted(seen) == sorted((pid, "Z") for pid in codes)  # still a zombie: its pid not reused
        assert process.exited(seen.append) == [] and process.exited() == []  # the running one is not ended
    finally:
        os.kill(running, signal.SIGKILL)
        os.waitpid(running, 0)
        os.close(r)
    assert process.exited() == []  # no children at all


@alone
def test_killing_a_group_ends_what_its_leader_started() -> None:
    r, w = os.pipe()
    ready_r, ready_w = os.pipe()
    leader = os.fork()
    if leader == 0:
        os.setsid()
        blocked_child(w)
        os.write(ready_w, b"x")
        wait_to_be_killed()
    os.close(w)
    os.close(ready_w)
    try:
        assert os.read(ready_r, 1) == b"x"  # it leads its group, and its child is in it
        process.kill_group(leader)
        assert eof_within(r)
    finally:
        os.close(r)
        os.close(ready_r)
    _, status = os.waitpid(leader, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL


@alone
def test_killing_a_child_that_leads_no_group_kills_it_alone() -> None:
    r, w = os.pipe()
    child = blocked_child(w)
    os.close(w)
    try:
        process.kill_group(child)
        assert eof_within(r)
    finally:
        os.close(r)
    _, status = os.waitpid(child, 0)
    assert os.WTERMSIG(status) == signal.SIGKILL
    process.kill_group(child)  # reaped: nothing to kill, nothing raised
    process.kill_leftover_group(child)


@alone
def test_a_group_whose_leader_is_gone_is_killed_as_a_leftover() -> None:
    r, w = os.pipe()
    leader = os.fork()
    if leader == 0:
        os.setsid()
        blocked_child(w)
        os._exit(0)
    os.close(w)
    os.waitpid(leader, 0)
    try:
        process.kill_leftover_group(leader)
        assert eof_within(r)
    finally:
        os.close(r)


def test_subreaper_and_parent_death_signal_are_set_as_asked(restored: None) -> None:
    assert process.become_subreaper() is True and prctl_get(PR_GET_CHILD_SUBREAPER) == 1
    assert process.die_with_parent(signal.SIGTERM) is True and prctl_get(PR_GET_PDEATHSIG) == signal.SIGTERM
    assert process.die_with_parent() is True and prctl_get(PR_GET_PDEATHSIG) == signal.SIGKILL
    assert process._prctl(-1, 0) is False  # the kernel refused: not reported as done


def test_without_prctl_nothing_is_claimed(monkeypatch: pytest.MonkeyPatch) -> None:
    def not_linux(*args: object, **kwargs: object) -> None:
        raise OSError("no C library to load")

    monkeypatch.setattr(process.ctypes, "CDLL", not_linux)
    assert process.become_subreaper() is False and process.die_with_parent() is False


@alone
def test_children_are_listed_from_proc_with_or_without_the_children_files(monkeypatch: pytest.MonkeyPatch) -> None:
    """A process's name may hold ``)`` and spaces; a process may be gone before its stat is read."""
    r, w = os.pipe()
    ready_r, ready_w = os.pipe()
    kids = [blocked_child(w) for _ in range(2)]
    odd = os.fork()
    if odd == 0:
        ctypes.CDLL(None).prctl(15, b"x) 1 2", 0, 0, 0)  # PR_SET_NAME: /proc/<pid>/stat reads "(x) 1 2)"
        os.write(ready_w, b"x")
        wait_to_be_killed()
    kids = sorted([*kids, odd])
    os.close(w)
    os.close(ready_w)
    try:
        assert os.read(ready_r, 1) == b"x"
        listed = process.children()
        assert set(kids) <= set(listed) and listed == sorted(listed)
        real_open = open

        def no_children_files(path: str, *args: object, **kwargs: object) -> object:
            if str(path).endswith("/children"):
                raise FileNotFoundError(path)
            name = str(path).split("/")
            if name[-1] == "stat" and name[2].isdigit() and int(name[2]) not in listed:
                raise FileNotFoundError(path)  # ended since /proc was listed
            return real_open(path, *args, **kwargs)  # type: ignore[call-overload]

        monkeypatch.setattr(process, "open", no_children_files, raising=False)
        assert process.children() == listed
    finally:
        for pid in kids:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        os.close(r)
        os.close(ready_r)


@alone
def test_the_threads_of_this_process_are_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    release = threading.Event()
    before = process.thread_count()
    extra = threading.Thread(target=release.wait)
    extra.start()
    try:
        assert process.thread_count() == before + 1 == len(os.listdir("/proc/self/task"))

        def no_proc(path: str) -> list[str]:
            raise FileNotFoundError(path)

        monkeypatch.setattr(process.os, "listdir", no_proc)
        assert process.thread_count() == threading.active_count()
    finally:
        release.set()
        extra.join()


@alone
def test_strays_and_what_they_leave_behind_are_ended_and_counted(restored: None) -> None:
    """A subreaper inherits the orphans of what it kills, in sessions of their own too, and ends them as well."""
    process.become_subreaper()
    r, w = os.pipe()
    ready_r, ready_w = os.pipe()
    keep = blocked_child(w)
    stray = os.fork()
    if stray == 0:  # a child, and in a session of its own a grandchild its group kill cannot reach
        blocked_child(w, own_session=True)
        os.write(ready_w, b"x")
        wait_to_be_killed()
    os.close(w)
    os.close(ready_w)
    try:
        assert os.read(ready_r, 1) == b"x"
        os.close(ready_r)
        assert process.end_strays(keep={keep, stray}) == 0
        assert process.end_strays(keep={keep}, deadline_s=0) == 0
        assert process.end_strays(keep={keep}) == 2
        assert process.children() == [keep] and state(keep) != "Z"
    finally:
        os.kill(keep, signal.SIGKILL)
        os.waitpid(keep, 0)
        assert eof_within(r)
        os.close(r)


# -- a supervised probe process ----------------------------------------------------------------------------


def test_how_a_probe_ended_reads_back_as_its_fields() -> None:
    assert Ended(None, 9, True, 2).to_dict() == {"exit": None, "signal": 9, "timed_out": True, "strays": 2}


@alone
def test_a_probe_runs_in_a_session_of_its_own_that_ends_with_it(restored: None, tmp_path: Path) -> None:
    facts, tester = tmp_path / "facts.json", os.getpid()

    def run() -> None:
        if os.getpid() == tester:  # the supervisor ran it itself and would leave with its status: fail the run
            os._exit(1)
        facts.write_text(
            json.dumps(
                {
                    "session_leader": os.getsid(0) == os.getpid(),
                    "deathsig": prctl_get(PR_GET_PDEATHSIG),
                    "subreaper": prctl_get(PR_GET_CHILD_SUBREAPER),
                    "term": signal.getsignal(signal.SIGTERM) == signal.SIG_DFL,
                    "int": signal.getsignal(signal.SIGINT) == signal.SIG_DFL,
                    "wakeup": signal.set_wakeup_fd(-1),
                }
            )
        )

    assert process.supervise(run, timeout_s=GUARD_S) == Ended(0, None, False, 0)
    assert json.loads(facts.read_text()) == {
        "session_leader": True,
        "deathsig": signal.SIGKILL,
        "subreaper": 1,
        "term": True,
        "int": True,
        "wakeup": -1,
    }
    assert prctl_get(PR_GET_CHILD_SUBREAPER) == 1  # the supervisor too, for what the probe leaves
    assert signal.getsignal(signal.SIGCHLD) == signal.SIG_DFL


@alone
def test_a_probe_that_raises_ends_as_a_crash_with_its_traceback(restored: None, capfd: pytest.CaptureFixture) -> None:
    def run() -> None:
        sys.stdout.write("half a line")
        raise LookupError("the lab's own bug")

    assert process.supervise(run, None) == Ended(EXIT_CRASH, None, False, 0)
    out, err = capfd.readouterr()
    assert "half a line" in out
    assert "Traceback (most recent call last):" in err and "LookupError: the lab's own bug" in err


@alone
def test_a_probe_killed_by_a_signal_reads_as_that_signal(restored: None) -> None:
    assert process.supervise(lambda: os.kill(os.getpid(), signal.SIGUSR1), GUARD_S) == Ended(
        None, signal.SIGUSR1, False, 0
    )


@alone
def test_a_probe_past_its_timeout_is_killed_with_what_escaped_its_session(restored: None) -> None:
    r, w = os.pipe()

    def run() -> None:
        escaped = os.fork()
        if escaped == 0:
            os.setsid()
            blocked_child(w)  # in a session of its own: the probe's group kill misses it
            os._exit(0)
        os.waitpid(escaped, 0)
        wait_to_be_killed()

    ended = process.supervise(run, timeout_s=0.5)
    os.close(w)
    try:
        assert ended == Ended(None, signal.SIGKILL, True, 1)
        assert eof_within(r)
    finally:
        os.close(r)


@alone
def test_a_supervisor_without_a_timeout_waits_through_other_childrens_ends(restored: None) -> None:
    r, w = os.pipe()
    other = blocked_child(w)
    os.close(w)

    def run() -> None:
        os.kill(other, signal.SIGKILL)  # the supervisor wakes for it, and must wait on
        while state(other) != "Z":
            select.select([], [], [], 0.01)
        select.select([], [], [], 0.1)

    try:
        assert process.supervise(run, None) == Ended(0, None, False, 1)  # the other child is a stray now
    finally:
        os.close(r)


@alone
def test_a_supervisor_told_to_stop_ends_the_probe_without_calling_it_a_timeout(restored: None) -> None:
    def run() -> None:
        os.kill(os.getppid(), signal.SIGTERM)  # the lab giving up
        wait_to_be_killed()

    assert process.supervise(run, GUARD_S) == Ended(None, signal.SIGKILL, False, 0)


# -- starting a forked child -------------------------------------------------------------------------------


@pytest.fixture
def saved_fds() -> Iterator[None]:
    """fd 0, 1 and 2 as they were: a test redirects this process's own."""
    saved = [os.dup(fd) for fd in (0, 1, 2)]
    try:
        yield
    finally:
        for fd, copy in enumerate(saved):
            os.dup2(copy, fd)
            os.close(copy)


@pytest.mark.usefixtures("saved_fds")
def test_output_goes_to_a_fresh_log_and_input_comes_from_nothing(tmp_path: Path) -> None:
    log = tmp_path / "probe.log"
    log.write_text("an earlier run's log, longer than this one\n")
    process.redirect_output(str(log))
    os.write(1, b"out\n")
    os.write(2, b"err\n")
    assert os.read(0, 10) == b""
    assert log.read_text() == "out\nerr\n"
    fresh = tmp_path / "fresh.log"
    process.redirect_output(str(fresh))
    assert fresh.stat().st_mode & 0o777 == 0o644 & ~current_umask()


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@pytest.mark.usefixtures("saved_fds")
def test_a_forked_child_starts_in_a_clean_state_with_its_log_after_the_import_log(
    restored: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As a source server's child: here in this process, whose session must stay (its ``setsid`` is recorded)."""
    sessions: list[int] = []
    monkeypatch.setattr(os, "setsid", lambda: sessions.append(os.getpid()))
    imports, log = tmp_path / "import.log", tmp_path / "child.log"
    imports.write_text("imported sglang.srt\n")
    server_pipe = os.pipe()
    server = ChildWatch()  # the server's watch: its wake-up fd and SIGCHLD handler must not reach the child
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    process.enter_forked_child(str(log), str(imports), list(server_pipe))
    os.write(1, b"probe output\n")
    assert sessions == [os.getpid()]
    assert prctl_get(PR_GET_PDEATHSIG) == signal.SIGKILL and prctl_get(PR_GET_CHILD_SUBREAPER) == 1
    assert signal.set_wakeup_fd(-1) == -1 and signal.getsignal(signal.SIGCHLD) == signal.SIG_DFL
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    for fd in server_pipe:
        with pytest.raises(OSError):
            os.fstat(fd)
    assert log.read_text() == "imported sglang.srt\nprobe output\n"
    process.enter_forked_child(str(log), None, [1_000_000])  # no import log; a closed fd is no error
    assert log.read_text() == ""
    os.close(server.rfd)
    os.close(server.wfd)


def test_preloading_imports_what_it_can_and_keeps_the_collector_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture
) -> None:
    (tmp_path / "difflab_exits_on_import.py").write_text("raise SystemExit('no GPU here')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        done, failed = process.preload(["json", "difflab_no_such_module", "difflab_exits_on_import"])
    finally:
        gc.unfreeze()
    assert done == ["json"]
    assert failed == {
        "difflab_no_such_module": "ModuleNotFoundError: No module named 'difflab_no_such_module'",
        "difflab_exits_on_import": "SystemExit: no GPU here",
    }
    assert gc.isenabled()
    assert "ModuleNotFoundError" in capfd.readouterr().err


def test_a_fork_does_not_print_what_was_buffered_before_it_twice(capfd: pytest.CaptureFixture) -> None:
    sys.stdout.write("buffered once")
    pid = process.fork_child()
    if pid == 0:
        sys.stdout.flush()
        os._exit(0)
    os.waitpid(pid, 0)
    assert capfd.readouterr().out == "buffered once"
