"""Where things live in a sealed run folder, and how to list its files without following links."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from difflab.files.names import has_controls
from difflab.observation import SIDES

CHECKSUMS = "SHA256SUMS"
REPRODUCE = "REPRODUCE.md"
ATTESTATIONS = "attestations"
KEYS = "keys"
OBSERVATIONS = "observations"
RUN_JSON = "run.json"
ENVIRONMENT_JSON = "environment.json"
DIFF_JSON = "diff.json"
MATRIX = "matrix.toml"

ENVELOPE_SUFFIX = ".intoto.json"
RUN_ENVELOPE = f"{ATTESTATIONS}/run{ENVELOPE_SUFFIX}"
SIGSTORE_BUNDLE = f"{ATTESTATIONS}/run.sigstore.json"
CHECKSUMS_ENVELOPE = f"{ATTESTATIONS}/checksums{ENVELOPE_SUFFIX}"
"""Signed last (bundle format 2): a statement whose subject is SHA256SUMS, which lists everything else."""
PUBLIC_KEY = f"{KEYS}/signing-key.pub"
FINGERPRINT = f"{KEYS}/signing-key.fingerprint"

# What sealing adds; removed first when a folder is sealed again.
SEAL_OUTPUTS = (CHECKSUMS, REPRODUCE, ATTESTATIONS, KEYS)
# Written after the run statement is signed, so it cannot list them (format 2: the checksums statement covers them).
OUTSIDE_RUN_STATEMENT = frozenset({CHECKSUMS, RUN_ENVELOPE, SIGSTORE_BUNDLE, CHECKSUMS_ENVELOPE})
# Format 1 (bundles sealed before the checksums statement): only these two were outside the run statement.
OUTSIDE_RUN_STATEMENT_V1 = frozenset({CHECKSUMS, RUN_ENVELOPE})
# Not listed in SHA256SUMS: itself, and the statement that signs it.
OUTSIDE_CHECKSUMS = frozenset({CHECKSUMS, CHECKSUMS_ENVELOPE})


def fix_envelope(fix: str, side: str) -> str:
    """The envelope attesting one fix's observations on one side."""
    return f"{ATTESTATIONS}/{fix}/{side}{ENVELOPE_SUFFIX}"


def bytewise(names: Iterable[str]) -> list[str]:
    """Sort as ``LC_ALL=C sort`` would: by the UTF-8 bytes of the name."""
    return sorted(names, key=lambda n: n.encode("utf-8", "surrogateescape"))


def safe_relpath(name: str) -> bool:
    """A relative POSIX path that stays inside the folder (no absolute, ``..``, backslash or drive)."""
    if not name or name.startswith("/") or "\\" in name or has_controls(name):
        return False
    parts = PurePosixPath(name).parts
    if not parts or ":" in parts[0]:
        return False
    return all(part not in ("", ".", "..") for part in name.split("/"))


@dataclass(frozen=True)
class Listing:
    """Regular files (relative POSIX paths, bytewise sorted) and everything else found (links, fifos)."""

    files: list[str]
    odd: list[str]


def scan(root: Path) -> Listing:
    """Walk ``root`` without following links; links and special files are reported, never read."""
    files: list[str] = []
    odd: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        base = Path(dirpath)
        rel_dir = base.relative_to(root).as_posix()
        prefix = "" if rel_dir == "." else f"{rel_dir}/"
        for name in list(dirnames):
            if (base / name).is_symlink():
                odd.append(prefix + name)
                dirnames.remove(name)
        for name in filenames:
            mode = os.lstat(base / name).st_mode
            (files if stat.S_ISREG(mode) else odd).append(prefix + name)
    return Listing(files=bytewise(files), odd=bytewise(odd))


def observation_groups(files: Iterable[str]) -> dict[tuple[str, str], list[str]]:
    """``observations/<fix>/<side>/<probe>.json`` files grouped by (fix, side)."""
    groups: dict[tuple[str, str], list[str]] = {}
    for rel in files:
        parts = rel.split("/")
        if len(parts) == 4 and parts[0] == OBSERVATIONS and parts[2] in SIDES and parts[3].endswith(".json"):
            groups.setdefault((parts[1], parts[2]), []).append(rel)
    return {key: bytewise(value) for key, value in sorted(groups.items())}
