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
import shutil
from pathlib import Path

import difflab
from difflab import probe
from difflab.files.atomic import atomic_folder
from difflab.paths import cache_root

LAB = Path(difflab.__file__).resolve().parent
IN_ENVIRONMENT = Path(probe.__file__).resolve().parent


def child_files() -> list[str]:
    """What is staged, relative to the ``difflab`` folder: its ``__init__.py`` and every module of the package."""
    modules = (p for p in IN_ENVIRONMENT.rglob("*.py") if "__pycache__" not in p.parts)
    return ["__init__.py", *sorted(p.relative_to(LAB).as_posix() for p in modules)]


def child_digest() -> str:
    h = hashlib.sha256()
    for rel in child_files():
        h.update(rel.encode() + b"\0" + (LAB / rel).read_bytes() + b"\0")
    return h.hexdigest()


def stage(cache: Path | None = None) -> Path:
    """A folder to put on ``PYTHONPATH`` that provides ``difflab.probe`` (``$DIFFLAB_CACHE/childlib/<digest>``)."""
    target = (cache or cache_root()) / "childlib" / child_digest()[:16]
    if (target / "difflab" / "probe" / "child.py").exists():
        return target
    with atomic_folder(target, keep_existing=True) as tmp:  # another process may have staged it first
        for rel in child_files():
            dest = tmp / "difflab" / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(LAB / rel, dest)
    return target
