"""What a probe process may not read: the lab's secrets, hidden with Linux Landlock (standard library only).

A probe process runs a build's code, and that code runs as the same user as the lab: file
permissions alone cannot keep the signing key, or the key that authenticates the result
cache, out of its reach. Landlock lets an unprivileged process give up access for itself and
everything it starts, and a process so confined cannot trace or read the memory or
``/proc/<pid>/environ`` of the processes outside its box (the lab). Landlock only allows, so
"everything but the folder holding the keys" is written as: every entry beside each folder on
the way down to it may be read, the folder itself not.

The lab names what to hide in ``$DIFFLAB_HIDE`` (paths joined by ``os.pathsep``); the probe's
supervisor, the warm hub and the upstream-test child call :func:`enter` first thing, before any
build code is imported. Where the kernel lacks Landlock, :func:`available` says so and the lab
tells the user (the Docker back end never mounts the keys at all).
"""

from __future__ import annotations

import ctypes
import os
import stat
import sys
from collections.abc import Iterable
from pathlib import Path

HIDE_ENV = "DIFFLAB_HIDE"
"""The environment variable naming what a probe process may not read."""

SOURCE_ENV = "DIFFLAB_SOURCE_ROOT"
"""The build's folder: put on ``sys.path`` behind the lab's package once the box stands (:func:`add_source`)."""

_CREATE_RULESET, _ADD_RULE, _RESTRICT_SELF = 444, 445, 446  # the same numbers on every architecture
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
_READ_FILE, _READ_DIR = 1 << 2, 1 << 3
_PR_SET_NO_NEW_PRIVS = 38


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


def available() -> bool:
    """Whether this kernel lets a process hide files from itself (Landlock ABI 1 or later)."""
    libc = _libc()
    if libc is None or not hasattr(libc, "syscall"):
        return False
    return int(libc.syscall(_CREATE_RULESET, None, ctypes.c_size_t(0), _CREATE_RULESET_VERSION)) >= 1


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def readable_around(hidden: Iterable[Path]) -> list[Path]:
    """What to allow so that everything but ``hidden`` (and what lies in it) stays readable."""
    hide = [Path(os.path.abspath(p)) for p in hidden]
    hide = [p for p in hide if not any(q != p and _inside(p, q) for q in hide)]
    ancestors = {a for p in hide for a in p.parents}
    allowed: list[Path] = []
    for folder in sorted(ancestors):
        if any(_inside(folder, h) for h in hide):
            continue
        try:
            entries = sorted(os.listdir(folder))
        except OSError:
            continue
        for name in entries:
            entry = folder / name
            if entry in ancestors or any(_inside(entry, h) for h in hide):
                continue
            target = Path(os.path.realpath(entry))
            if any(_inside(target, h) or _inside(h, target) for h in hide):
                continue  # a link that leads to (or above) what is hidden
            allowed.append(entry)
    return allowed


def hide(paths: Iterable[Path]) -> bool:
    """Confine this process (and all it starts) to reading everything but ``paths``; False if it cannot."""
    paths = list(paths)
    libc = _libc()
    if not paths or libc is None or not available():
        return False
    attr = _RulesetAttr(_READ_FILE | _READ_DIR)
    ruleset = int(libc.syscall(_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)), 0))
    if ruleset < 0:
        return False
    try:
        for entry in readable_around(paths):
            try:
                fd = os.open(entry, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                access = _READ_FILE | (_READ_DIR if stat.S_ISDIR(os.fstat(fd).st_mode) else 0)
                rule = _PathBeneath(access, fd)
                libc.syscall(_ADD_RULE, ruleset, _RULE_PATH_BENEATH, ctypes.byref(rule), 0)
            finally:
                os.close(fd)
        if int(libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)) != 0:
            return False
        return int(libc.syscall(_RESTRICT_SELF, ruleset, 0)) == 0
    finally:
        os.close(ruleset)


def enter() -> bool:
    """Hide what ``$DIFFLAB_HIDE`` names from this process; the variable itself goes too."""
    named = os.environ.pop(HIDE_ENV, "")
    return hide(Path(p) for p in named.split(os.pathsep) if p)


def add_source() -> None:
    """The build's folder (``$DIFFLAB_SOURCE_ROOT``) on ``sys.path`` right behind the lab's package.

    Only now: had it been on ``PYTHONPATH`` at start, a ``sitecustomize.py`` of the build would have
    run before the supervisor led its own session and reaped what escapes it. Processes the probe
    starts find it on ``PYTHONPATH``, behind the lab's package too.
    """
    root = os.environ.pop(SOURCE_ENV, "")
    if not root:
        return
    sys.path.insert(1 if sys.path else 0, root)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH", ""), root) if p)
