"""One thing wrong with a bundle, always tied to the file (or archive member) it concerns."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, order=True)
class Problem:
    """A verification finding; ``path`` is relative to the bundle root so the user can find it."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"
