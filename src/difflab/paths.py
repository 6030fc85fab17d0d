"""Where the lab keeps downloaded sources, environments and keys."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs


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


def repo_root() -> Path:
    """The checkout this package runs from (probes/ and matrices/ live there)."""
    return Path(__file__).resolve().parents[2]


def probes_dir() -> Path:
    return Path(os.environ.get("DIFFLAB_PROBES", repo_root() / "probes")).resolve()


def default_matrix() -> Path:
    return repo_root() / "matrices" / "upstream.toml"


def default_release_lock() -> Path:
    return repo_root() / "matrices" / "releases.lock"
