"""Nothing a probe starts outlives it, on either local back end, and both tell the same end in the same words.

Toy probes on toy sources with this interpreter standing in for the shared environment (as in
test_warm_runner), so the real supervisor, hub, server and fork machinery runs in seconds.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from difflab.runner.subprocess import SubprocessRunner
from test_warm_runner import HostEnvironment, job, lab, runner, toy_source  # noqa: F401 - lab is a fixture

DAEMON = """
import os, time
from pathlib import Path

def observe(kit):
    pidfile = Path({pidfile!r})
    first = os.fork()
    if first == 0:  # the classic daemon: a new session, then fork again and let the middle one go
        os.setsid()
        if os.fork() == 0:
            pidfile.write_text(str(os.getpid()))
            time.sleep(300)
        os._exit(0)
    os.waitpid(first, 0)
    for _ in range(500):
        if pidfile.exists() and pidfile.read_text():
            break
        time.sleep(0.01)
    return {{"daemon.started": pidfile.exists()}}
"""

BACKGROUND = """
import subprocess
from pathlib import Path

def observe(kit):
    child = subprocess.Popen(["sleep", "300"])  # inherits stdout and stderr, and is never waited for
    Path({pidfile!r}).write_text(str(child.pid))
    return {{"background.started": True}}
"""

HANG_WITH_CHILD = """
import subprocess, time
from pathlib import Path

def observe(kit):
    child = subprocess.Popen(["sleep", "300"])
    Path({pidfile!r}).write_text(str(child.pid))
    time.sleep(300)
"""

SEGFAULT = """
import os, signal

def observe(kit):
    print("about to crash", flush=True)
    os.kill(os.getpid(), signal.SIGSEGV)
"""


def alive(pid: int) -> bool:
    """Running, and not a zombie waiting to be reaped."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def gone_soon(pid: int, within_s: float = 3.0) -> bool:
    deadline = time.monotonic() + within_s
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not alive(pid)


def subprocess_runner() -> SubprocessRunner:
    return SubprocessRunner(environment=HostEnvironment(), workers=1)  # type: ignore[arg-type]


def probe(lab: Path, name: str, text: str, **values: str) -> None:  # noqa: F811
    (lab / "probes" / f"{name}.py").write_text(text.format(**values))


@pytest.mark.parametrize("backend", ["subprocess", "warm"])
def test_a_daemonised_child_does_not_survive_the_run(lab: Path, backend: str) -> None:  # noqa: F811
    pidfile = lab / f"daemon-{backend}.pid"
    probe(lab, "toy_daemon", DAEMON, pidfile=str(pidfile))
    src = toy_source(lab, "a")
    if backend == "warm":
        with runner() as r:
            (obs,) = r.run([job(lab, "toy_daemon", src, timeout_s=20)])
    else:
        (obs,) = subprocess_runner().run([job(lab, "toy_daemon", src, timeout_s=20)])
    assert obs.status == "ok" and obs.fields == {"daemon.started": True}, obs.error
    daemon = int(pidfile.read_text())
    try:
        assert gone_soon(daemon), f"the probe's daemon {daemon} outlived the run ({backend})"
    finally:
        if alive(daemon):
            os.kill(daemon, 9)


def test_a_background_child_does_not_keep_the_subprocess_backend_waiting(lab: Path) -> None:  # noqa: F811
    pidfile = lab / "background.pid"
    probe(lab, "toy_background", BACKGROUND, pidfile=str(pidfile))
    (obs,) = subprocess_runner().run([job(lab, "toy_background", toy_source(lab, "a"), timeout_s=20)])
    assert obs.status == "ok", obs.error  # not "probe hung: killed after 20 s"
    child = int(pidfile.read_text())
    try:
        assert gone_soon(child)
    finally:
        if alive(child):
            os.kill(child, 9)


@pytest.mark.parametrize("backend", ["subprocess", "warm"])
def test_a_hung_probe_is_killed_at_its_timeout_with_its_children(lab: Path, backend: str) -> None:  # noqa: F811
    pidfile = lab / f"hang-{backend}.pid"
    probe(lab, "toy_hang_child", HANG_WITH_CHILD, pidfile=str(pidfile))
    jobs = [job(lab, "toy_hang_child", toy_source(lab, "a"), timeout_s=2)]
    if backend == "warm":
        with runner() as r:
            (obs,) = r.run(jobs)
    else:
        (obs,) = subprocess_runner().run(jobs)
    assert obs.status == "error" and (obs.error or "").startswith("probe hung: killed after 2 s"), obs.error
    child = int(pidfile.read_text())
    try:
        assert gone_soon(child)
    finally:
        if alive(child):
            os.kill(child, 9)


def test_the_same_crash_reads_the_same_on_both_backends(lab: Path) -> None:  # noqa: F811
    probe(lab, "toy_segfault", SEGFAULT)
    src = toy_source(lab, "a")
    (fresh,) = subprocess_runner().run([job(lab, "toy_segfault", src)])
    with runner() as r:
        (warm,) = r.run([job(lab, "toy_segfault", src, 1)])
    cause = "probe process died (killed by signal 11 (SIGSEGV)) without a result"
    assert (fresh.error or "").startswith(cause), fresh.error
    assert (warm.error or "").startswith(cause), warm.error


def test_an_observation_from_a_fallback_rerun_says_so(lab: Path) -> None:  # noqa: F811
    threaded = (
        "import threading, time\nVALUE = 'threaded'\nCALLS = []\n"
        "threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"
    )
    with runner() as r:
        (obs,) = r.run([job(lab, "toy_patch", toy_source(lab, "t", threaded))])
    assert obs.status == "ok" and obs.runner == "subprocess"
    assert obs.runner_fallback is not None and obs.runner_fallback.startswith("warm: server s1: ")
    assert "threads" in obs.runner_fallback
    assert obs.to_dict()["runner_fallback"] == obs.runner_fallback  # written with the observation
