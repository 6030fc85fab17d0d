"""Stage the few standard-library-only lab modules a probe process needs.

The probe process must see SGLang, its dependencies and *nothing else* from
the lab's own environment (whose packages could shadow the shared
environment's). So instead of putting the lab's site-packages on
``PYTHONPATH``, the child modules are copied into a small folder keyed by
their content digest.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

from difflab.files.atomic import atomic_folder
from difflab.paths import cache_root

CHILD_MODULES = (
    "__init__.py",
    "probe/__init__.py",
    "probe/kit.py",
    "probe/child.py",
    "probe/hub.py",
    "probe/upstream_child.py",
    "probe/stubs.py",
)


def _package_dir() -> Path:
    return Path(__file__).resolve().parents[1]


def child_digest() -> str:
    h = hashlib.sha256()
    for rel in CHILD_MODULES:
        h.update(rel.encode() + b"\0" + (_package_dir() / rel).read_bytes() + b"\0")
    return h.hexdigest()


def stage(cache: Path | None = None) -> Path:
    """A folder to put on ``PYTHONPATH`` that provides ``difflab.probe.child``."""
    root = (cache or cache_root()) / "childlib"
    target = root / child_digest()[:16]
    if (target / "difflab" / "probe" / "child.py").exists():
        return target
    with atomic_folder(target, keep_existing=True) as tmp:  # another process may have staged it first
        for rel in CHILD_MODULES:
            dest = tmp / "difflab" / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(_package_dir() / rel, dest)
    return target
