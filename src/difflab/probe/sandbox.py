"""What a probe process may not read or change, with Linux Landlock (standard library only).

A probe process runs a build's code, and that code runs as the same user as the lab: file
permissions alone cannot keep the signing key, or the key that authenticates the result
cache, out of its reach. Landlock lets an unprivileged process give up access for itself and
everything it starts, and a process so confined cannot trace or read the memory or
``/proc/<pid>/environ`` of the processes outside its box (the lab). Landlock only allows, so
"everything but the folder holding the keys" is written as: every entry beside each folder on
the way down to it may be read, the folder itself not.

It may change nothing but the folders the lab names in ``$DIFFLAB_WRITABLE`` (the temporary folder,
``/dev``, ``/proc``) and the bytecode of its own build: not the shared environment, the cached
sources, the result cache, the staged lab package, another build's bytecode or the lab's repository,
so nothing it writes reaches a later run.

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

WRITE_ENV = "DIFFLAB_WRITABLE"
"""The folders a probe process may change (the temporary folder, ``/dev``); bytecode is added per process."""

SOURCE_ENV = "DIFFLAB_SOURCE_ROOT"
"""The build's folder: put on ``sys.path`` behind the lab's package once the box stands (:func:`add_source`)."""

_CREATE_RULESET, _ADD_RULE, _RESTRICT_SELF = 444, 445, 446  # the same numbers on every architecture
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
_EXECUTE, _WRITE_FILE, _READ_FILE, _READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
_FILE_RIGHTS = _EXECUTE | _WRITE_FILE | _READ_FILE | (1 << 14)  # what a rule on a file (not a folder) may allow
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


def around(hidden: Iterable[Path], top: Path = Path("/")) -> list[Path]:
    """What to allow beneath ``top`` so that all of it but ``hidden`` (and what lies in it) is covered."""
    top = Path(os.path.abspath(top))
    hide = [Path(os.path.abspath(p)) for p in hidden]
    if any(_inside(top, h) for h in hide):
        return []
    hide = [p for p in hide if _inside(p, top) and not any(q != p and _inside(p, q) for q in hide)]
    if not hide:
        return [top]
    ancestors = {a for p in hide for a in p.parents if _inside(a, top)}
    allowed: list[Path] = []
    for folder in sorted(ancestors):
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


def _write_rights() -> int:
    """Every right to change the file system this kernel's Landlock knows (ABI 2 adds REFER, 3 TRUNCATE)."""
    libc = _libc()
    abi = int(libc.syscall(_CREATE_RULESET, None, ctypes.c_size_t(0), _CREATE_RULESET_VERSION)) if libc else 0
    rights = _WRITE_FILE | sum(1 << bit for bit in range(4, 13))
    if abi >= 2:
        rights |= 1 << 13
    if abi >= 3:
        rights |= 1 << 14
    return rights


def confine(hidden: Iterable[Path] = (), writable: Iterable[Path] | None = None) -> bool:
    """Confine this process (and all it starts): nothing in ``hidden`` can be read, and, with ``writable``,
    nothing outside those folders can be changed. False if the kernel cannot."""
    hidden, libc = list(hidden), _libc()
    folders = None if writable is None else [Path(p) for p in writable]
    if (not hidden and folders is None) or libc is None or not available():
        return False
    read = (_READ_FILE | _READ_DIR) if hidden else 0
    write = _write_rights() if folders is not None else 0
    attr = _RulesetAttr(read | write)
    ruleset = int(libc.syscall(_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)), 0))
    if ruleset < 0:
        return False
    try:
        rules = [(entry, read) for entry in (around(hidden) if read else [])]
        # Write rights only (reads come from the rules above), and not inside what is hidden either:
        # a probe must not replace the keys it cannot read.
        rules += [(entry, write) for folder in folders or [] for entry in around(hidden, folder)]
        for entry, access in rules:
            try:
                fd = os.open(entry, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                if not stat.S_ISDIR(os.fstat(fd).st_mode):
                    access &= _FILE_RIGHTS
                rule = _PathBeneath(access, fd)
                libc.syscall(_ADD_RULE, ruleset, _RULE_PATH_BENEATH, ctypes.byref(rule), 0)
            finally:
                os.close(fd)
        if int(libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)) != 0:
            return False
        return int(libc.syscall(_RESTRICT_SELF, ruleset, 0)) == 0
    finally:
        os.close(ruleset)


def bytecode_folder(source_root: str | None) -> Path | None:
    """Where this process may write bytecode: the whole cache for a process that runs no build code,
    else only the folder of that build's own files (so no probe writes another build's bytecode)."""
    prefix = sys.pycache_prefix
    if not prefix:
        return None
    folder = Path(prefix) / source_root.lstrip(os.sep) if source_root else Path(prefix)
    folder.mkdir(parents=True, exist_ok=True)
    if source_root:
        # The processes this one starts write their bytecode where this one may write too.
        os.environ["PYTHONPYCACHEPREFIX"] = str(folder)
        _build_folder[:] = [folder]
    return folder


_build_folder: list[Path] = []
"""The bytecode folder of the build this process imports, once :func:`bytecode_folder` named it."""


def build_cache_folder(name: str) -> Path | None:
    """A folder for ``name``'s cache of facts read from this build's source, beside the build's bytecode
    (the one place besides the temporary folder such a process may write); None where no build was named."""
    return _build_folder[0] / name if _build_folder else None


_writable: list[Path] = []
"""The folders this process may change besides bytecode (from ``$DIFFLAB_WRITABLE``), for a server's own layer."""


def enter() -> bool:
    """Confine this process as ``$DIFFLAB_HIDE`` and ``$DIFFLAB_WRITABLE`` say; the variables go too.

    With a build named (``$DIFFLAB_SOURCE_ROOT``), bytecode may be written only for that build's files.
    """
    hidden = [Path(p) for p in os.environ.pop(HIDE_ENV, "").split(os.pathsep) if p]
    named = os.environ.pop(WRITE_ENV, None)
    if named is None:
        return confine(hidden)
    _writable[:] = [Path(p) for p in named.split(os.pathsep) if p]
    code = bytecode_folder(os.environ.get(SOURCE_ENV))
    return confine(hidden, [*_writable, *([code] if code else [])])


def confine_to_build(source_root: str) -> bool:
    """One more layer, in a process about to import a build (a warm server): its writes narrowed to the
    folders the lab named and that build's bytecode."""
    if not _writable:
        return False
    code = bytecode_folder(source_root)
    return confine((), [*_writable, *([code] if code else [])])


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
