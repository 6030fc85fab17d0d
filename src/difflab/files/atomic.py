"""Write a folder or a file under a temporary sibling and move it into place only when complete.

Every command that writes results (run, merge, contains, selfcheck, backport, gpu) and every
cache entry (unpacked releases, mutated sources, mirrors, the environment, the staged child
package, lock files, stored observations) goes through here: a crashed or interrupted writer
never replaces a good folder or file, and nothing half-written is left behind.

A results folder (``--out``) is guarded on top of that (:func:`results_folder`): it never
replaces a folder of the user's own files, the working directory, the home folder, the
repository or the cache, and replaces a previous results folder only when asked (``--force``).

Each temporary sibling ``.<name>.partial-XXXX`` has a lock file ``.<name>.partial-XXXX.lock``
beside it, held (``flock``) while its writer lives. A writer killed outright cannot clean up,
so the next writer into the same parent removes every partial folder whose lock it can take:
only ours (the lock file says so) and only stale ones (nobody holds the lock).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from difflab.errors import ConfigError
from difflab.paths import cache_root, checkout_root, installed_package, is_installed_data

PARTIAL = ".partial-"
LOCK_SUFFIX = ".lock"
LOCK_OWNER = b"sglang-difflab partial folder\n"
"""What a partial folder's lock file holds: only folders whose lock says this are ever cleaned up."""

Guard = Callable[[Path], None]


def remove_tree(path: Path) -> None:
    """Remove a folder even where it was made read-only (materialised sources are); never raises."""
    if path.is_symlink() or path.is_file():
        with contextlib.suppress(OSError):
            path.unlink()
        return
    if not path.exists():
        return
    try:
        shutil.rmtree(path)
        return
    except OSError:  # a read-only folder: its entries cannot be unlinked until it is writable
        pass
    for folder, _dirs, _files in os.walk(path):
        with contextlib.suppress(OSError):
            os.chmod(folder, stat.S_IRWXU)
    shutil.rmtree(path, ignore_errors=True)


def _lock_path(work: Path) -> Path:
    return work.with_name(work.name + LOCK_SUFFIX)


def _hold_lock(work: Path) -> int:
    """Lock the partial folder's lock file (made under a temporary name, so nobody sees it unlocked)."""
    final = _lock_path(work)
    tmp = final.with_name(f"{final.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.write(fd, LOCK_OWNER)
        os.replace(tmp, final)
    except BaseException:
        os.close(fd)
        Path(tmp).unlink(missing_ok=True)
        raise
    return fd


def _release_lock(work: Path, fd: int) -> None:
    _lock_path(work).unlink(missing_ok=True)
    os.close(fd)


def clean_stale_partials(parent: Path) -> list[Path]:
    """Remove the partial folders in ``parent`` whose writer is gone; returns what was removed."""
    removed: list[Path] = []
    try:
        entries = list(parent.iterdir())
    except OSError:
        return removed
    for lock in entries:
        name = lock.name
        if not (name.startswith(".") and PARTIAL in name and name.endswith(LOCK_SUFFIX)):
            continue
        try:
            fd = os.open(lock, os.O_RDWR)
        except OSError:
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:  # its writer is alive
                continue
            if os.pread(fd, len(LOCK_OWNER), 0) != LOCK_OWNER:
                continue
            work = lock.with_name(name[: -len(LOCK_SUFFIX)])
            remove_tree(work)
            lock.unlink(missing_ok=True)
            removed.append(work)
        finally:
            os.close(fd)
    return removed


@contextmanager
def atomic_folder(out: Path, *, keep_existing: bool = False, guard: Guard | None = None) -> Iterator[Path]:
    """Yield a work folder; on success it becomes ``out``, on error it is removed.

    An existing ``out`` is replaced, unless ``keep_existing``: then whichever folder got there
    first stays and this one is discarded (content-addressed caches, which a concurrent process
    may be reading while this one finishes). ``guard(out)`` runs before the work folder is made
    and again just before it is moved into place; it raises to refuse ``out``.
    """
    out = out.resolve()
    if guard is not None:
        guard(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    clean_stale_partials(out.parent)
    work = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}{PARTIAL}"))
    try:
        lock = _hold_lock(work)
    except BaseException:
        remove_tree(work)
        raise
    try:
        try:
            yield work
            if guard is not None:
                guard(out)
        except BaseException:
            remove_tree(work)
            raise
        _move_into_place(work, out, keep_existing)
    finally:
        _release_lock(work, lock)


def _move_into_place(work: Path, out: Path, keep_existing: bool) -> None:
    if out.exists() and keep_existing:
        remove_tree(work)
    elif out.exists():
        if not out.is_dir():
            remove_tree(work)
            raise ConfigError(f"--out {out} exists and is not a folder")
        old = out.with_name(f".{out.name}.old-{os.getpid()}")
        os.replace(out, old)
        os.replace(work, out)
        remove_tree(old)
    else:
        try:
            os.replace(work, out)
        except OSError:  # another process put it there in the meantime
            remove_tree(work)
            if not (keep_existing and out.is_dir()):
                raise


# -- results folders (--out) ------------------------------------------------------------------------------


def _protected() -> list[tuple[str, Path]]:
    """Folders a results folder may never be, or contain: replacing it would delete them."""
    places = [("the installed package", installed_package()), ("the cache", cache_root())]
    checkout = checkout_root()
    if checkout is not None:
        places.insert(0, ("the repository root", checkout))
    with contextlib.suppress(RuntimeError):  # no home folder known
        places.insert(0, ("your home folder", Path.home()))
    with contextlib.suppress(OSError):  # the working directory was removed
        places.insert(0, ("the working directory", Path.cwd()))
    return [(what, path.resolve()) for what, path in places]


def check_out(out: Path, *, force: bool, ours: Callable[[Path], bool]) -> None:
    """Refuse an ``--out`` whose replacement could lose someone's files (exit 2, naming why).

    Allowed: a new path, an empty folder, and a previous results folder (``ours`` says so, by
    its run.json) when ``force`` is given. Never: a file, a folder of other files, the working
    directory, the home folder, the repository root, the cache, or a folder containing one.
    """
    out = out.resolve()
    if is_installed_data(out):
        raise ConfigError(f"--out {out}: is inside the installed package; choose a folder of its own for the results")
    for what, place in _protected():
        if out == place:
            raise ConfigError(f"--out {out}: is {what}; choose a folder of its own for the results")
        if place.is_relative_to(out):
            raise ConfigError(f"--out {out}: contains {what} ({place}); choose a folder of its own for the results")
    if not (out.exists() or out.is_symlink()):
        return
    if not out.is_dir():
        raise ConfigError(f"--out {out}: exists and is not a folder; nothing was written")
    if not any(out.iterdir()):
        return
    if not ours(out):
        raise ConfigError(
            f"--out {out}: exists and holds files that are not difflab results (no run.json written by "
            "sglang-difflab); nothing was changed; choose a new folder"
        )
    if not force:
        raise ConfigError(f"--out {out}: holds previous difflab results; pass --force to replace them")


def results_folder(out: Path, *, force: bool, ours: Callable[[Path], bool]) -> contextlib.AbstractContextManager[Path]:
    """:func:`atomic_folder` for a command's ``--out``, refused by the rules of :func:`check_out`."""
    return atomic_folder(out, guard=lambda path: check_out(path, force=force, ours=ours))


def write_atomic(path: Path, data: str | bytes) -> Path:
    """Write ``data`` to a temporary sibling and rename it over ``path``: a reader sees all or nothing."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}.part")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the umask decides, as for any file
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data.encode() if isinstance(data, str) else data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
