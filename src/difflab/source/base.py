"""What every source back end must answer."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from difflab.matrix.model import Fix, Matrix, SidePin


@dataclass(frozen=True)
class MaterialisedSource:
    """A folder on disk whose ``root`` holds the ``sglang`` package, and what it is.

    ``identity`` goes verbatim into results and attestations (wheel file and
    sha256, or repository, commit and tree). ``digest`` keys result caches.
    """

    label: str
    kind: str
    root: Path
    identity: dict[str, Any]
    digest: str
    tests_root: Path | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class SourceBackend(Protocol):
    """Materialises the pinned source of one side of a fix.

    Registered by ``kind`` (the ``--source`` value) in :data:`difflab.source.SOURCES`; a workflow
    gets one through :func:`difflab.source.for_matrix`, never by naming the class.
    """

    kind: str
    """The ``--source`` value that selects this back end."""

    @classmethod
    def for_matrix(cls, matrix: Matrix, repo: str | None = None) -> SourceBackend:
        """The back end a workflow uses for ``matrix``'s fixes (``repo``: ``--repo``, where it means something)."""
        ...

    def pin(self, fix: Fix, side: str, matrix_path: Path | None = None) -> SidePin:
        """The pin this back end materialises for one side (or the matrix's reason there is none)."""
        ...

    def materialise(self, fix: Fix, side: str, pin: SidePin) -> MaterialisedSource:
        """Return the source for ``pin``; raise :class:`~difflab.errors.SourceError` if it cannot."""
        ...
