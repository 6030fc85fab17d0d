"""Stage the in-environment package, :mod:`difflab.probe`, for the processes of the shared environment.

The probe process must see SGLang, its dependencies and *nothing else* from the lab's own
environment (whose packages could shadow the shared environment's). So instead of putting
the lab's site-packages on ``PYTHONPATH``, the package that runs in there (standard library
only) is copied as a unit, with the import-free ``difflab/__init__.py`` above it, into a
folder keyed by its content digest. A module added to :mod:`difflab.probe` is staged with
the rest; there is no list to keep.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import threading
from collections.abc import Iterable
from pathlib import Path

import difflab
from difflab import probe
from difflab.errors import EnvironmentSetupError
from difflab.files.atomic import atomic_folder
from difflab.paths import cache_root

LAB = Path(difflab.__file__).resolve().parent
_staging = threading.Lock()
"""One staging at a time in this process (a subprocess run's threads may all find a rewritten copy)."""
IN_ENVIRONMENT = Path(probe.__file__).resolve().parent


def child_files() -> list[str]:
    """What is staged, relative to the ``difflab`` folder: its ``__init__.py`` and every module of the package."""
    modules = (p for p in IN_ENVIRONMENT.rglob("*.py") if "__pycache__" not in p.parts)
    return ["__init__.py", *sorted(p.relative_to(LAB).as_posix() for p in modules)]


def child_digest() -> str:
    """The lab's own copy of what is staged, by relative path and content."""
    return _digest((rel, (LAB / rel).read_bytes()) for rel in child_files())


def _digest(files: Iterable[tuple[str, bytes]]) -> str:
    h = hashlib.sha256()
    for rel, data in files:
        h.update(rel.encode() + b"\0" + data + b"\0")
    return h.hexdigest()


def staged_digest(target: Path) -> str | None:
    """The digest of what is staged in ``target`` itself; None unless it holds exactly the staged files.

    A probe process runs as the same user as the lab and may have rewritten the staged copy, added a
    module or a ``__pycache__`` beside it: whatever it holds is read, not assumed.
    """
    root = target / "difflab"
    found: list[str] = []
    for folder, dirs, files in os.walk(target):
        for name in dirs + files:
            path = Path(folder) / name
            if path.is_symlink() or not (path.is_dir() or path.is_file()):
                return None
        found += [(Path(folder) / name).relative_to(root).as_posix() for name in files if Path(folder) != target]
        if Path(folder) == target and (files or dirs != ["difflab"]):
            return None
    expected = child_files()
    if sorted(found) != sorted(expected):
        return None
    try:
        return _digest((rel, (root / rel).read_bytes()) for rel in expected)
    except OSError:
        return None


def stage(cache: Path | None = None) -> Path:
    """A folder to put on ``PYTHONPATH`` that provides ``difflab.probe`` (``$DIFFLAB_CACHE/childlib/<digest>``).

    Checked by content on every call, before every use: a copy that differs from the lab's in any
    way (a file changed, added or removed) is replaced, never used.
    """
    digest = child_digest()
    target = (cache or cache_root()) / "childlib" / digest[:16]
    if target.is_dir() and staged_digest(target) == digest:
        return target
    with _staging, atomic_folder(target) as tmp:  # replaces a copy that is not the lab's
        for rel in child_files():
            dest = tmp / "difflab" / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(LAB / rel, dest)
    if staged_digest(target) != digest:
        raise EnvironmentSetupError(f"{target}: the staged lab package changed while it was being staged")
    return target
