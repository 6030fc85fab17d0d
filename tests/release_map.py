"""The default matrix's release map (``matrices/release-map.toml``), read for the tests that need it.

The one place the tests learn which release carries which fix: everything else is derived
from the matrix itself, so adding a fix never means editing a test.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from packaging.version import Version

from difflab.paths import shipped

FILE = "release-map.toml"


@dataclass(frozen=True)
class Carried:
    """One fix: the first release that carries it (None: no pinned release), and its back ends' first releases.

    ``older``: the fix predates every pinned release (``first = "older"``), so every one carries it.
    """

    fix: str
    first: str | None
    backends: dict[str, str] = field(default_factory=dict)
    older: bool = False

    def carried_on(self, release: str) -> bool:
        return self.older or (self.first is not None and Version(release) >= Version(self.first))

    def backends_on(self, release: str) -> list[str]:
        """The back ends whose machinery this release has."""
        return [b for b, since in self.backends.items() if Version(release) >= Version(since)]


def load_release_map(path: Path | None = None) -> dict[str, Carried]:
    path = path or shipped("matrices") / FILE
    raw = tomllib.loads(path.read_text())
    assert raw.get("schema") == 1, f"{path}: schema = 1 expected"
    out = {}
    for fix, entry in raw["fixes"].items():
        unknown = set(entry) - {"first", "backends"}
        assert not unknown, f"{path}: fixes.{fix}: unknown key(s) {sorted(unknown)}"
        first = entry["first"]
        backends = dict(entry.get("backends", {}))
        out[fix] = Carried(fix, None if first in ("none", "older") else first, backends, older=first == "older")
    return out
