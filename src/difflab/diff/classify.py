"""Does one observation look like the base (bug) or the head (fix)?

Shared by the base/head diff, the release-containment table, backport
checks and the causality self-check: all of them ask this same question.
"""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Any

from difflab.matrix.model import ProbeSpec
from difflab.observation import Observation


class Match(StrEnum):
    BASE = "base"  # every expected field has its base (bug) value
    HEAD = "head"  # every expected field has its head (fixed) value
    MIXED = "mixed"  # some fields base-like, some head-like
    OTHER = "other"  # some field matches neither side
    ERROR = "error"  # no trustworthy observation


def same(a: Any, b: Any) -> bool:
    """Strict JSON equality: ``True`` is not ``1``, ``1`` is not ``1.0``."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def field_side(value: Any, pair: tuple[Any, Any]) -> str:
    if same(value, pair[0]):
        return "base"
    if same(value, pair[1]):
        return "head"
    return "other"


def classify(obs: Observation | None, spec: ProbeSpec) -> Match:
    """Classify one observation against the probe's declared base/head values."""
    if obs is None or not obs.ok:
        return Match.ERROR
    if any(f not in obs.fields for f in spec.expect):
        return Match.ERROR
    sides = {field_side(obs.fields[f], pair) for f, pair in spec.expect.items()}
    if sides == {"base"}:
        return Match.BASE
    if sides == {"head"}:
        return Match.HEAD
    if "other" in sides:
        return Match.OTHER
    return Match.MIXED


def controls_hold(obs: Observation | None, spec: ProbeSpec) -> list[str]:
    """Control fields that are missing or differ from their declared value (empty = all hold)."""
    if obs is None or not obs.ok:
        return list(spec.controls)
    return [f for f, v in spec.controls.items() if f not in obs.fields or not same(obs.fields[f], v)]
