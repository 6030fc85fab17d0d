"""How a probe process of a local back end starts: its environment, its home, what it may not read.

A build's code runs in there, so nothing of the caller's is handed over by default: the
environment is built from an allow-list (a CI secret such as ``$DIFFLAB_SIGNING_KEY`` never
reaches it), ``HOME`` and the config and cache folders are a temporary folder of its own, the
interpreter starts without the user site and without the script's folder on ``sys.path``
(``-s -P``) with only the lab's staged package on ``PYTHONPATH`` (the source's folder is added
behind it by the supervisor, once it leads its own session and reaps what escapes), and the
lab's config folder (signing key, trusted keys, the result cache's key) is hidden from it with
Landlock (:mod:`difflab.probe.sandbox`), which also keeps it from changing anything outside the
temporary folder but its own build's bytecode.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from difflab.paths import cache_root, config_root
from difflab.probe.sandbox import HIDE_ENV, SOURCE_ENV, WRITE_ENV

PASSED = ("PATH", "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "LC_MESSAGES", "TZ", "TERM", "TMPDIR")
"""The only variables of the caller's environment a probe process sees."""

START_FLAGS = ("-s", "-P")
"""No user site-packages, no script folder or working folder on ``sys.path``."""


def command(python: Path, module: str, *args: str) -> list[str]:
    """``python -s -P -m module args``: how every probe process of a local back end starts."""
    return [str(python), *START_FLAGS, "-m", module, *args]


def secrets() -> list[Path]:
    """What no probe process may read: the config folder, and a signing key file named by the environment."""
    hidden = [config_root()]
    named = os.environ.get("DIFFLAB_SIGNING_KEY", "").strip()
    if named and not named.startswith("-----BEGIN"):
        hidden.append(Path(named).expanduser().resolve())
    return hidden


def writable() -> list[Path]:
    """The only folders a probe process may change: the temporary folder (its own folder, its home, its
    result and log live there) and ``/dev`` and ``/proc``; bytecode only for its own build's files. So it
    cannot rewrite the shared environment, the cached sources, the result cache or the lab's repository."""
    return [Path(tempfile.gettempdir()).resolve(), Path("/dev"), Path("/proc")]


def environment(source_root: Path | None, child_root: Path, home: Path, cache: Path | None = None) -> dict[str, str]:
    """The probe process's environment: the allow-list, a home of its own, the lab's package on the path."""
    for sub in (".config", ".cache"):
        (home / sub).mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k in PASSED}
    env.update(
        TMPDIR=str(writable()[0]),
        HOME=str(home),
        XDG_CONFIG_HOME=str(home / ".config"),
        XDG_CACHE_HOME=str(home / ".cache"),
        PYTHONPATH=str(child_root),
        PYTHONNOUSERSITE="1",
        PYTHONPYCACHEPREFIX=str((cache or cache_root()) / "pycache"),
        PYTHONHASHSEED="0",
        CUDA_VISIBLE_DEVICES="",
        TOKENIZERS_PARALLELISM="false",
        HF_HUB_OFFLINE="1",
        OMP_NUM_THREADS="1",
    )
    env[HIDE_ENV] = os.pathsep.join(str(p) for p in secrets())
    env[WRITE_ENV] = os.pathsep.join(str(p) for p in writable())
    if source_root is not None:
        env[SOURCE_ENV] = str(source_root)
    return env
