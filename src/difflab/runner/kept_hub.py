"""A warm hub kept between commands: where it is, who may use it, and when it is the same hub.

The hub's third-party imports (torch, transformers, ...) cost seconds on every command, and they
are identical from one command to the next. So a hub outlives the command that started it by
``$DIFFLAB_HUB_IDLE_S`` seconds (default 300; ``0``: it ends with its command), and the next
command with the same environment connects to it instead of starting one. Every server and probe
a command starts ends with that command's connection; what the next command finds is the hub as
it was right after its imports.

Files, under ``<cache>/warm/`` (this module owns them):

- ``hub-<environment>.json``: the kept hub's pid, socket, folder and :func:`hub_key`;
- ``hub-<environment>.lock``: held by the one command using the hub (a second command at the
  same time starts a hub of its own for that command only), and taken by the hub itself before
  it leaves, so a command never connects to a hub on its way out.

A hub is reused only when it would have been started exactly the same way (same interpreter,
command line and environment variables, the lab's staged package included); otherwise the kept
one is stopped and a new one started.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import signal
import socket
import struct
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from difflab.errors import ConfigError
from difflab.files.atomic import write_atomic

IDLE_ENV = "DIFFLAB_HUB_IDLE_S"
DEFAULT_IDLE_S = 300.0
HUB_MODULE = "difflab.probe.hub"


def idle_seconds() -> float:
    """``$DIFFLAB_HUB_IDLE_S``: how long a hub waits for the next command (0 keeps none)."""
    raw = os.environ.get(IDLE_ENV, "").strip()
    if not raw:
        return DEFAULT_IDLE_S
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"${IDLE_ENV}={raw!r}: expected seconds (a number; 0 keeps no hub)") from None
    if value < 0 or value != value:  # noqa: PLR0124 - NaN
        raise ConfigError(f"${IDLE_ENV}={raw!r}: expected seconds >= 0")
    return value


def hub_key(command: list[str], env: dict[str, str], folder: Path) -> str:
    """What makes two hubs the same: the command and environment with this hub's own folder taken out.

    The learned preload list is named by its path, not its content: a server imports what its hub
    did not preload, so only speed depends on it, and a list that grows with every new probe
    would otherwise retire the kept hub after every command.
    """
    here = str(folder)
    shape = {
        "command": [a.replace(here, "<hub>") for a in command],
        "env": {k: v.replace(here, "<hub>") for k, v in sorted(env.items())},
    }
    return hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True)
class Pointer:
    """Where the kept hub of one environment is."""

    pid: int
    socket: str
    folder: str
    key: str
    idle_s: float
    started: float
    listener: int
    """The pid that made the listening socket (the command that started the hub): the only peer a
    connection to the real socket can show. A probe may write in the temporary folder, so it could put
    a socket of its own in the hub's place; its listener's pid would be its own."""

    @classmethod
    def read(cls, path: Path) -> Pointer | None:
        try:
            data = json.loads(path.read_text())
            return cls(**{k: data[k] for k in cls.__dataclass_fields__})
        except (OSError, ValueError, KeyError, TypeError):
            return None  # none, or half of one: as if there were no kept hub

    def write(self, path: Path) -> None:
        write_atomic(path, json.dumps(asdict(self), indent=2, sort_keys=True) + "\n")

    @property
    def alive(self) -> bool:
        """The pid is a hub still (not a process that got its number since)."""
        try:
            cmdline = Path(f"/proc/{self.pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            return False
        return HUB_MODULE.encode() in cmdline and Path(self.socket).exists()


@dataclass
class Keeper:
    """The kept hub of one environment, from a command's side: lock, pointer, connect, stop."""

    folder: Path
    """``<cache>/warm``."""
    environment: str

    @property
    def pointer_path(self) -> Path:
        return self.folder / f"hub-{self.environment[:16]}.json"

    @property
    def lock_path(self) -> Path:
        return self.folder / f"hub-{self.environment[:16]}.lock"

    def lock(self) -> int | None:
        """This command's claim on the kept hub, or None while another command (or the hub, leaving) has it."""
        self.folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        return fd

    def pointer(self) -> Pointer | None:
        return Pointer.read(self.pointer_path)

    def connect(self, key: str) -> tuple[socket.socket, Pointer] | None:
        """A connection to the kept hub, if there is one started the way this command would start it.

        A kept hub of another shape (the lab or the environment changed) is stopped. Call with the lock held.
        """
        found = self.pointer()
        if found is None:
            return None
        if found.key != key or not found.alive:
            self.stop(found)
            return None
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            unix_call(sock, "connect", found.socket)
        except OSError:
            sock.close()
            self.stop(found)
            return None
        if peer_pid(sock) != found.listener:
            sock.close()  # not the socket the hub was given: someone else's, in its place
            self.stop(found)
            return None
        return sock, found

    def remember(self, pointer: Pointer) -> None:
        pointer.write(self.pointer_path)

    def stop(self, found: Pointer | None = None) -> bool:
        """End the kept hub (if any) and forget it; True if one was running."""
        found = found or self.pointer()
        self.pointer_path.unlink(missing_ok=True)
        if found is None:
            return False
        running = found.alive
        if running:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(found.pid, signal.SIGTERM)
            deadline = time.monotonic() + 10
            while found.alive and time.monotonic() < deadline:
                time.sleep(0.02)
            if found.alive:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(found.pid, signal.SIGKILL)
        shutil.rmtree(found.folder, ignore_errors=True)
        return running

    def status(self) -> dict[str, Any] | None:
        found = self.pointer()
        if found is None:
            return None
        return asdict(found) | {"alive": found.alive, "age_s": round(time.time() - found.started, 1)}


SUN_PATH_MAX = 107
"""The longest path a Unix socket address holds (108 bytes with its NUL)."""


def unix_call(sock: socket.socket, verb: str, path: Path | str) -> None:
    """``sock.bind(path)`` or ``sock.connect(path)``, also for a path longer than an address holds (a
    long ``$TMPDIR``): then through the folder's descriptor, ``/proc/self/fd/N/name``."""
    path = Path(path)
    if len(os.fsencode(str(path))) <= SUN_PATH_MAX:
        getattr(sock, verb)(str(path))
        return
    fd = os.open(path.parent, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        getattr(sock, verb)(f"/proc/self/fd/{fd}/{path.name}")
    finally:
        os.close(fd)


def peer_pid(sock: socket.socket) -> int:
    """The pid a connected Unix socket's far end had when it listened (or connected)."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[0]


def keepers(cache: Path) -> list[Keeper]:
    """Every environment's keeper that has a pointer under ``cache``."""
    folder = cache / "warm"
    return [Keeper(folder, p.stem.removeprefix("hub-")) for p in sorted(folder.glob("hub-*.json"))]
