"""Stage the few standard-library-only lab modules a probe process needs.

The probe process must see SGLang, its dependencies and *nothing else* from
the lab's own environment (whose packages could shadow the shared
environment's). So instead of putting the lab's site-packages on
``PYTHONPATH``, the child modules are copied into a small folder keyed by
their content digest.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

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
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=".stage-"))
    for rel in CHILD_MODULES:
        dest = tmp / "difflab" / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(_package_dir() / rel, dest)
    try:
        os.replace(tmp, target)
    except OSError:  # another process staged it first
        shutil.rmtree(tmp, ignore_errors=True)
    return target
