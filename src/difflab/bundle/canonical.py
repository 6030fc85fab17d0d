"""Deterministic JSON: the same data always gives the same bytes, so digests and signatures are stable."""

from __future__ import annotations

import json
from typing import Any


def dumps(value: Any) -> bytes:
    """Sorted keys, compact separators, UTF-8, no NaN (not JSON, and not comparable)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8")


def dump_file(value: Any) -> bytes:
    """As :func:`dumps`, plus a final newline so the file is a proper text file."""
    return dumps(value) + b"\n"
