"""What every source back end must answer."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from difflab.matrix.model import Fix, SidePin


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
    """Materialises the pinned source of one side of a fix."""

    kind: str

    def pin(self, fix: Fix, side: str, matrix_path: Path | None = None) -> SidePin:
        """The pin this back end materialises for one side (or the matrix's reason there is none)."""
        ...

    def materialise(self, fix: Fix, side: str, pin: SidePin) -> MaterialisedSource:
        """Return the source for ``pin``; raise :class:`~difflab.errors.SourceError` if it cannot."""
        ...
