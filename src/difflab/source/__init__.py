"""Sources: turn a pin (release wheel, git commit) into a folder holding ``sglang/``.

Back ends sit side by side behind :class:`~difflab.source.base.SourceBackend`, each declaring
its ``kind`` (the ``--source`` value); :data:`SOURCES` lists them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from difflab.errors import ConfigError
from difflab.matrix.model import Fix, SidePin
from difflab.source.base import MaterialisedSource, SourceBackend
from difflab.source.git import GitSource
from difflab.source.release import ReleaseSource

SOURCES: dict[str, type[Any]] = {cls.kind: cls for cls in (ReleaseSource, GitSource)}
"""``--source KIND`` -> back end class."""


def source_class(kind: str) -> type[Any]:
    try:
        return SOURCES[kind]
    except KeyError:
        expected = " or ".join(repr(k) for k in SOURCES)
        raise ConfigError(f"unknown source kind {kind!r} (expected {expected})") from None


def backend_for(kind: str, **options: Any) -> SourceBackend:
    """The back end for ``--source KIND``."""
    return source_class(kind)(**options)


def side_pin(fix: Fix, side: str, kind: str, matrix_path: Path | None = None) -> SidePin:
    """The pin for one side under the chosen source kind (git uses the matrix's commits/lock)."""
    return source_class(kind).pin(fix, side, matrix_path)


__all__ = ["SOURCES", "MaterialisedSource", "SourceBackend", "backend_for", "side_pin", "source_class"]
