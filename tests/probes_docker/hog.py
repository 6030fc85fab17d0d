"""Allocates far more than its container may hold: the kernel's OOM killer ends it."""

from __future__ import annotations

from typing import Any


def observe(kit: Any) -> dict[str, Any]:
    print("difflab-test: allocating", flush=True)
    blocks = [b"x" * (64 * 1024 * 1024) for _ in range(32)]  # 2 GB, every page written
    return {"allocated": len(blocks)}
