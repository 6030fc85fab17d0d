"""Both sides of every selected fix, materialised, and how a side is named in verdicts and run.json."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from difflab.matrix.model import Fix
from difflab.observation import SIDES
from difflab.source.base import MaterialisedSource, SourceBackend

Say = Callable[[str], None]


def materialise_sides(
    fixes: list[Fix],
    backend: SourceBackend,
    say: Say,
    sides: tuple[str, ...] = SIDES,
    matrix_path: Path | None = None,
) -> dict[tuple[str, str], MaterialisedSource | str]:
    """Source per (fix, side), or the reason it is unavailable."""
    out: dict[tuple[str, str], MaterialisedSource | str] = {}
    for fix in fixes:
        for side in sides:
            pin = backend.pin(fix, side, matrix_path)
            if pin.unavailable:
                out[(fix.id, side)] = pin.unavailable
                continue
            say(f"source {fix.label} {side}: {pin.label}")
            out[(fix.id, side)] = backend.materialise(fix, side, pin)
    return out


def source_label(src: MaterialisedSource | str) -> dict[str, Any]:
    """A side as a verdict names it: its label and identity, or ``unavailable`` and why."""
    if isinstance(src, str):
        return {"label": "unavailable", "reason": src}
    return {"label": src.label, **src.identity}
