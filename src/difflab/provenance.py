"""Which lab ran: its version and the digest of the probes it ran (run.json's ``probes``).

A bundle re-run by another installation of the lab is only comparable when the probes are
the same code; ``difflab reproduce`` reads this record and says what differs and what to
install (:func:`mismatches`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from difflab import __version__
from difflab.paths import PROBES_ENV, checkout_root, probes_dir, shipped_probes

PACKAGE = "sglang-difflab"


def probe_files(folder: Path) -> list[Path]:
    """Every file of a probes folder the probes can read (caches left out), in a stable order."""
    files = (p for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc")
    return sorted(files, key=lambda p: p.relative_to(folder).as_posix())


def probes_digest(folder: Path) -> str:
    """sha256 over every probe file's relative path and content: the same for a checkout and its wheel."""
    h = hashlib.sha256()
    for path in probe_files(folder):
        h.update(path.relative_to(folder).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def probes_record(folder: Path | None = None) -> dict[str, Any]:
    """run.json's ``probes``: where the probes came from and their digest."""
    folder = (folder or probes_dir()).resolve()
    own = folder != shipped_probes()
    origin = PROBES_ENV if own else ("checkout" if checkout_root() else "package")
    return {"origin": origin, "path": str(folder), "sha256": probes_digest(folder)}


def mismatches(run: Mapping[str, Any], folder: Path | None = None) -> list[str]:
    """What differs between the lab that recorded ``run`` (a run.json) and this one, with what to install.

    Empty when the version and the probes digest match (or the recording names neither).
    """
    found: list[str] = []
    recorded = run.get("tool_version")
    install = f"pipx install '{PACKAGE}=={recorded}' (or pip install '{PACKAGE}=={recorded}')"
    if isinstance(recorded, str) and recorded != __version__:
        found.append(f"recorded with {PACKAGE} {recorded}, re-run with {__version__}; to re-run as recorded: {install}")
    probes = run.get("probes")
    if isinstance(probes, dict) and isinstance(probes.get("sha256"), str):
        now = probes_record(folder)
        if probes["sha256"] != now["sha256"]:
            where = "its own probes folder" if probes.get("origin") == PROBES_ENV else f"the probes of {recorded}"
            hint = f"set {PROBES_ENV} to that folder" if probes.get("origin") == PROBES_ENV else install
            found.append(
                f"probes differ: recorded sha256 {probes['sha256'][:16]} ({where}), "
                f"now {now['sha256'][:16]} ({now['path']}); to re-run the recorded probes: {hint}"
            )
    return found
