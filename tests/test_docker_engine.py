"""A test run killed at any point leaves no Docker engine behind.

A real ``pytest`` run is started on a test that takes an own ``dockerd`` from
``docker_engine.acquire()`` and holds it; it is SIGKILLed (nothing in it can clean up) while
the daemon is starting, and while it is up. Then the daemon and every process under it
(``containerd``) must be gone. Needs root and ``dockerd`` (Debian ``docker.io``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.docker, pytest.mark.xdist_group("docker")]

TESTS = Path(__file__).resolve().parent
GONE_WITHIN_S = 60.0

HOLDER = """
import os, sys, time
sys.path.insert(0, {tests!r})
import docker_engine


def test_hold_an_engine(monkeypatch):
    monkeypatch.setattr(docker_engine, "existing", lambda: None)  # always an own daemon
    engine, reason = docker_engine.acquire()
    if engine is None:
        open({reason_file!r}, "w").write(reason)
        return
    open({pid_file!r} + ".part", "w").write(str(engine.process.pid))
    os.replace({pid_file!r} + ".part", {pid_file!r})
    time.sleep(600)
"""


def _stat(pid: int) -> tuple[str, int] | None:
    """A live process's state and parent, None if it is gone (or a zombie: it has exited)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] in "ZX" else (fields[0], int(fields[1]))


def _children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (st := _stat(int(entry.name))) is not None and st[1] == pid:
            out.append(int(entry.name))
    return out


def _tree(pid: int) -> set[int]:
    """``pid`` and every live process below it."""
    found, todo = set(), [pid]
    while todo:
        current = todo.pop()
        if current not in found and _stat(current) is not None:
            found.add(current)
            todo += _children(current)
    return found


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _dockerd_under(pid: int) -> int | None:
    return next((p for p in _tree(pid) if p != pid and "dockerd" in _cmdline(p).split(" ", 1)[0]), None)


def _wait_for(what, timeout_s: float):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if (found := what()) is not None:
            return found
        time.sleep(0.05)
    return None


@pytest.fixture
def needs_dockerd() -> str:
    dockerd = shutil.which("dockerd") or next(
        (p for p in ("/usr/sbin/dockerd", "/usr/bin/dockerd") if os.path.exists(p)), None
    )
    if dockerd is None:
        pytest.skip("dockerd is not installed (Debian: apt-get install docker.io)")
    if os.geteuid() != 0:
        pytest.skip(f"starting dockerd needs root (uid is {os.geteuid()})")
    return dockerd


@pytest.mark.parametrize("moment", ["starting", "up"])
def test_a_killed_test_run_leaves_no_engine_behind(needs_dockerd: str, tmp_path: Path, moment: str) -> None:
    pid_file, reason_file = tmp_path / "dockerd.pid", tmp_path / "reason"
    holder = tmp_path / "test_holder.py"
    holder.write_text(HOLDER.format(tests=str(TESTS), pid_file=str(pid_file), reason_file=str(reason_file)))
    env = {**os.environ, "DIFFLAB_DOCKERD_EPHEMERAL": "1", "DIFFLAB_CACHE": str(tmp_path / "cache")}
    env.pop("DOCKER_HOST", None)
    run = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", str(holder)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    left: set[int] = set()
    try:
        dockerd = _wait_for(lambda: _dockerd_under(run.pid), 120)
        assert dockerd is not None, "the test run never started dockerd"
        if moment == "up":
            up = _wait_for(lambda: pid_file.is_file() or reason_file.is_file() or None, 120)
            if reason_file.is_file():
                pytest.skip(f"dockerd could not start here: {reason_file.read_text()}")
            assert up and int(pid_file.read_text()) == dockerd
        left = _tree(dockerd)
        if moment == "up":
            assert any("containerd" in _cmdline(p) for p in left), [_cmdline(p) for p in left]
        run.send_signal(signal.SIGKILL)
        run.wait(timeout=30)
        gone = _wait_for(lambda: None if any(_stat(p) for p in left) else True, GONE_WITHIN_S)
        assert gone, [f"{p}: {_cmdline(p)}" for p in left if _stat(p)]
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
        for pid in {q for p in left for q in _tree(p)}:  # a failed check must not leave them running either
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
