"""Sources: turn a pin (release wheel, git commit) into a folder holding ``sglang/``.

Back ends sit side by side behind :class:`~difflab.source.base.SourceBackend`, each declaring
its ``kind`` (the ``--source`` value); :data:`SOURCES` lists them. Code outside this package
gets a back end from here (:func:`for_matrix`, :func:`backend_for`, :func:`releases`,
:func:`repository`), never by constructing a back end class itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from difflab.errors import ConfigError
from difflab.matrix.model import Fix, Matrix, ReleasePin, SidePin
from difflab.source.base import MaterialisedSource, SourceBackend
from difflab.source.git import GitSource
from difflab.source.release import ReleaseSource

SOURCES: dict[str, type[SourceBackend]] = {cls.kind: cls for cls in (ReleaseSource, GitSource)}
"""``--source KIND`` -> back end class."""


def source_class(kind: str) -> type[SourceBackend]:
    try:
        return SOURCES[kind]
    except KeyError:
        expected = " or ".join(repr(k) for k in SOURCES)
        raise ConfigError(f"unknown source kind {kind!r} (expected {expected})") from None


def backend_for(kind: str, **options: Any) -> SourceBackend:
    """The back end for ``--source KIND``, built with ``options``."""
    return source_class(kind)(**options)


def for_matrix(kind: str, matrix: Matrix, repo: str | None = None) -> SourceBackend:
    """The back end ``--source KIND`` uses for ``matrix``'s fixes (``repo``: ``--repo``)."""
    return source_class(kind).for_matrix(matrix, repo)


def releases(pins: Mapping[str, ReleasePin]) -> ReleaseSource:
    """The release back end over exactly ``pins``: a release by version, not a fix's side (contains, fuzz)."""
    return ReleaseSource(dict(pins))


def repository(repo: str | None, *, cache: Path | None = None, with_tests: bool = False) -> GitSource:
    """The git back end of one repository: any revision of it (a fork's ref, bisect's endpoints)."""
    return GitSource(repo=repo, cache=cache, with_tests=with_tests)


def side_pin(fix: Fix, side: str, kind: str, matrix_path: Path | None = None) -> SidePin:
    """The pin for one side under the chosen source kind (git uses the matrix's commits/lock)."""
    return source_class(kind).pin(fix, side, matrix_path)


__all__ = [
    "SOURCES",
    "MaterialisedSource",
    "SourceBackend",
    "backend_for",
    "for_matrix",
    "releases",
    "repository",
    "side_pin",
    "source_class",
]
