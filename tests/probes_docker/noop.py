"""Does nothing: what is left of its run time is the runner's own cost per probe."""

from __future__ import annotations

from typing import Any


def observe(kit: Any) -> dict[str, Any]:
    return {"noop": True}
