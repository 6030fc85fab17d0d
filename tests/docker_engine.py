"""A Docker engine for the docker tests: an existing one, or a private ``dockerd`` started as root.

Order: ``$DOCKER_HOST`` (or the default socket) if an engine answers there and does not store
images with ``vfs``; otherwise, when ``dockerd`` is installed (Debian package ``docker.io``)
and we are root, a private daemon with no iptables and no bridge, its socket and exec root in
a short /tmp folder. Storage: ``overlay2`` where the kernel allows it (a container starts in
<1 s), else ``vfs`` (every container first copies the whole 1.24 GB image: ~65 s measured);
an existing ``vfs`` engine is used only if no own ``overlay2`` daemon starts. The data root
persists under ``$DIFFLAB_CACHE/dockerd/<driver>`` so the probe image is built once, not per
test session (``DIFFLAB_DOCKERD_EPHEMERAL=1``: a throw-away data root instead); a second
concurrent session finds it locked and uses a throw-away one. Nothing is installed here: no
``dockerd`` means the tests are skipped with that reason.

An own daemon dies with the test process, however that dies: it runs in its own session (a
Ctrl-C in the terminal is the test run's to handle, not the daemon's) but is started with
``PR_SET_PDEATHSIG`` = SIGTERM, so a killed (even SIGKILLed) test run takes it down, and a
daemon that receives SIGTERM stops its containers and its ``containerd`` before it exits.
``tests/test_docker_engine.py`` kills test runs mid-way and checks that nothing is left.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from difflab.paths import cache_root
from difflab.probe.process import die_with_parent

DRIVERS = ("overlay2", "vfs")
START_TIMEOUT_S = 60.0


def dies_with(parent: int) -> Callable[[], None]:
    """A ``preexec_fn``: the child gets SIGTERM when ``parent`` dies, also if it died before this ran.

    The signal follows the *thread* that forked; the engine is started from the test run's
    main thread (fixtures run there), which lives as long as the run.
    """

    def arm() -> None:
        if not die_with_parent(signal.SIGTERM):
            os._exit(126)  # without the guarantee the daemon must not start at all
        if os.getppid() != parent:  # the parent died between fork and prctl
            os._exit(126)

    return arm


@dataclass
class Engine:
    """A reachable engine; ``stop()`` ends it only if this process started it."""

    host: str
    driver: str
    started: bool = False
    process: subprocess.Popen[bytes] | None = None
    folder: Path | None = None
    data_root: Path | None = None
    lock: FileLock | None = None
    notes: list[str] = field(default_factory=list)

    def client(self, timeout: int = 600) -> Any:
        import docker

        return docker.DockerClient(base_url=self.host, timeout=timeout)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        if self.lock is not None:
            self.lock.release()
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)


def _answers(host: str) -> str | None:
    """The storage driver of the engine at ``host``, or None if nothing answers."""
    try:
        import docker

        client = docker.DockerClient(base_url=host, timeout=10)
        try:
            return str(client.info().get("Driver") or "?")
        finally:
            client.close()
    except Exception:
        return None


def existing() -> Engine | None:
    host = os.environ.get("DOCKER_HOST") or (
        "unix:///var/run/docker.sock" if os.path.exists("/var/run/docker.sock") else None
    )
    if host is None:
        return None
    driver = _answers(host)
    return Engine(host=host, driver=driver) if driver else None


def _data_root(driver: str, folder: Path) -> tuple[Path, FileLock | None, str | None]:
    if os.environ.get("DIFFLAB_DOCKERD_EPHEMERAL"):
        return folder / "data", None, None
    root = cache_root() / "dockerd" / driver
    root.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(root) + ".lock")
    try:
        lock.acquire(timeout=0)
    except Timeout:
        return folder / "data", None, f"{root} is in use by another session: throw-away data root"
    orphan = _live_dockerd(Path(str(root) + ".pid"))
    if orphan:
        lock.release()
        return folder / "data", None, f"{root} is still used by dockerd pid {orphan} (a killed session's)"
    return root, lock, None


def _live_dockerd(pidfile: Path) -> int | None:
    """The pid recorded for a persistent data root, if that dockerd still runs."""
    try:
        pid = int(pidfile.read_text().strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError):
        return None
    return pid if b"dockerd" in cmdline else None


def _answered(proc: subprocess.Popen[bytes], sock: Path) -> str | None:
    """The storage driver the daemon on ``sock`` reports, once it answers (None: it died or never did)."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline and proc.poll() is None:
        if sock.exists():
            answered = _answers(f"unix://{sock}")
            if answered:
                return answered
        time.sleep(0.3)
    return None


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Terminate a daemon that did not come up, killing it if it ignores the request."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def start(dockerd: str, folder: Path, drivers: tuple[str, ...] = DRIVERS) -> tuple[Engine | None, list[str]]:
    """Try each storage driver in turn; the first daemon that answers wins."""
    notes: list[str] = []
    for driver in drivers:
        data_root, lock, note = _data_root(driver, folder)
        if note:
            notes.append(note)
        sock = folder / "d.sock"
        log_path = folder / f"dockerd-{driver}.log"
        cmd = [
            dockerd,
            "--iptables=false",
            "--ip6tables=false",
            "--bridge=none",
            f"--storage-driver={driver}",
            f"--host=unix://{sock}",
            f"--data-root={data_root}",
            f"--exec-root={folder / 'x'}",
            f"--pidfile={folder / 'd.pid'}",
        ]
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=dies_with(os.getpid())
            )
        if _answered(proc, sock) == driver:
            if lock is not None:
                Path(str(data_root) + ".pid").write_text(f"{proc.pid}\n")
            return Engine(
                host=f"unix://{sock}",
                driver=driver,
                started=True,
                process=proc,
                folder=folder,
                data_root=data_root,
                lock=lock,
                notes=notes,
            ), notes
        tail = log_path.read_text(errors="replace").strip().splitlines()[-3:]
        notes.append(f"dockerd --storage-driver={driver} did not come up: {' | '.join(tail)}")
        _stop(proc)
        if lock is not None:
            lock.release()
        for stale in (sock, folder / "d.pid"):
            stale.unlink(missing_ok=True)
    return None, notes


def acquire() -> tuple[Engine | None, str]:
    """An engine, or the precise reason there is none (the tests' skip message)."""
    found = existing()
    if found is not None and found.driver != "vfs":
        return found, ""
    # None, or a vfs engine (~1 min per probe container): an own overlay2 daemon is worth a try.
    tried = f"DOCKER_HOST={os.environ.get('DOCKER_HOST', '(unset)')} and /var/run/docker.sock do not answer"
    dockerd = shutil.which("dockerd") or next(
        (p for p in ("/usr/sbin/dockerd", "/usr/bin/dockerd") if os.path.exists(p)), None
    )
    if dockerd is None or os.geteuid() != 0:
        if found is not None:
            return found, ""
        if dockerd is None:
            return None, f"{tried}; dockerd is not installed (Debian: apt-get install docker.io)"
        return None, f"{tried}; dockerd is installed but starting it needs root (uid is {os.geteuid()})"
    folder = Path(tempfile.mkdtemp(prefix="dl-dockerd-", dir="/tmp"))  # short: unix socket paths <108 bytes
    engine, notes = start(dockerd, folder, ("overlay2",) if found is not None else DRIVERS)
    if engine is None:
        shutil.rmtree(folder, ignore_errors=True)
        if found is not None:
            return found, ""
        return None, f"{tried}; {dockerd} could not start: {'; '.join(notes)}"
    return engine, ""
