"""One thing wrong with a bundle, always tied to the file (or archive member) it concerns."""

from __future__ import annotations

from dataclasses import dataclass

from difflab.files.names import printable


@dataclass(frozen=True, order=True)
class Problem:
    """A verification finding; ``path`` is relative to the bundle root so the user can find it."""

    path: str
    message: str

    def __str__(self) -> str:
        """Escaped: names and key ids come from the bundle and must not reach the terminal raw."""
        return f"{printable(self.path)}: {printable(self.message)}"
