"""Where the lab keeps things: downloaded sources, environments and keys; what it ships; where results go.

The probes and the matrices ship inside the package as ``difflab.probes`` and
``difflab.matrices`` (setup.py maps them onto the checkout's top-level ``probes/`` and
``matrices/``). Installed, they are read through :mod:`importlib.resources`; in a checkout
(an editable install, or ``src/`` on ``PYTHONPATH``) they are the checkout's own folders, so
an edit is live.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

import platformdirs

from difflab import __version__
from difflab.errors import ConfigError

PROBES_ENV = "DIFFLAB_PROBES"
SHIPPED = ("probes", "matrices")
"""The folders that ship as ``difflab.<name>``."""

_LAB = Path(__file__).resolve().parent


def cache_root() -> Path:
    """``$DIFFLAB_CACHE``, else the user cache dir: never inside the repository."""
    env = os.environ.get("DIFFLAB_CACHE")
    root = Path(env).expanduser() if env else Path(platformdirs.user_cache_dir("sglang-difflab"))
    root.mkdir(parents=True, exist_ok=True)
    return root.resolve()


def config_root() -> Path:
    """``$DIFFLAB_CONFIG``, else the user config dir: the signing key and trusted-keys file live here.

    Not created here: it holds a private key, so :mod:`difflab.bundle.keys` creates it (mode 0700).
    """
    env = os.environ.get("DIFFLAB_CONFIG")
    root = Path(env).expanduser() if env else Path(platformdirs.user_config_dir("sglang-difflab"))
    return root.resolve()


def checkout_root() -> Path | None:
    """The checkout this package runs from, None when installed.

    A checkout is ``<root>/src/difflab`` with ``probes/`` and ``matrices/`` beside ``src/`` (a copy of
    that layout counts too, e.g. the mutation runs'); an installed package sits in site-packages.
    """
    root = _LAB.parents[1]
    if _LAB.parent.name == "src" and all((root / n).is_dir() for n in SHIPPED):
        return root
    return None


def repo_root() -> Path:
    """The checkout (for what only a checkout has: its tests, its published results); installed, there is none."""
    root = checkout_root()
    if root is None:
        raise ConfigError(f"{_LAB}: an installed package, not a checkout; this needs the lab's repository")
    return root


def installed_package() -> Path:
    """The folder of the running ``difflab`` package (in site-packages when installed): never a results folder."""
    return _LAB


def shipped(name: str) -> Path:
    """The folder of ``difflab.<name>`` (``probes``, ``matrices``) on the file system.

    A package imported from a zip (no folder to point at) is staged once into the cache,
    keyed by version and content, so probe processes and containers always get real files.
    """
    if name not in SHIPPED:
        raise ValueError(f"{name!r} does not ship with the lab; {SHIPPED} do")
    root = checkout_root()
    if root is not None:
        return root / name
    folder = resources.files(f"difflab.{name}")
    if isinstance(folder, Path):
        return folder.resolve()
    return _stage(folder, name)


def _files(folder: Traversable, prefix: str = "") -> list[tuple[str, Traversable]]:
    found: list[tuple[str, Traversable]] = []
    for entry in folder.iterdir():
        rel = f"{prefix}{entry.name}"
        if entry.name == "__pycache__" or entry.name.endswith(".pyc"):
            continue
        found += _files(entry, f"{rel}/") if entry.is_dir() else [(rel, entry)]
    return sorted(found, key=lambda item: item[0])


def _stage(folder: Traversable, name: str) -> Path:
    files = [(rel, entry.read_bytes()) for rel, entry in _files(folder)]
    digest = hashlib.sha256(b"".join(rel.encode() + b"\0" + data + b"\0" for rel, data in files)).hexdigest()
    target = cache_root() / "shipped" / f"{name}-{__version__}-{digest[:16]}"
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    for rel, data in files:
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        (work / rel).write_bytes(data)
    try:
        os.replace(work, target)
    except OSError:  # another process staged it first
        shutil.rmtree(work, ignore_errors=True)
    return target


def shipped_probes() -> Path:
    """The probes that ship with the lab (``$DIFFLAB_PROBES`` aside)."""
    return shipped("probes")


def probes_dir() -> Path:
    """``$DIFFLAB_PROBES`` (a folder of your own, laid out like ``probes/``), else the shipped probes."""
    env = os.environ.get(PROBES_ENV)
    return Path(env).expanduser().resolve() if env else shipped_probes()


def default_matrix() -> Path:
    return shipped("matrices") / "upstream.toml"


def default_release_lock() -> Path:
    return shipped("matrices") / "releases.lock"


def default_results() -> Path:
    """``results/`` under the working directory: where a run goes without ``--out`` (never site-packages)."""
    return Path.cwd() / "results"


def is_installed_data(path: Path) -> bool:
    """``path`` lies inside the installed package (not a checkout): the lab may read it, never write it."""
    return checkout_root() is None and path.resolve().is_relative_to(_LAB)


def refuse_installed(path: Path, option: str) -> Path:
    """``path`` unless it lies inside the installed package: shipped data is read, never rewritten (exit 2)."""
    if is_installed_data(path):
        raise ConfigError(
            f"{path}: ships inside the installed package and is never written there; "
            f"pass {option} with a path of your own (start from a copy of it to keep its pins)"
        )
    return path
