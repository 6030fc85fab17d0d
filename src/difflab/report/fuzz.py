"""``fuzz.json``: what a ``difflab fuzz`` search was asked, what ran, its rate and the leaks it found.

The search's chunks each report their events (:mod:`difflab.workflows.fuzz`); this module is the
one writer of the document they add up to.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from difflab.files.atomic import write_atomic

SCHEMA = 1
NAME = "fuzz.json"


@dataclass(frozen=True)
class SearchAsked:
    """What the search was asked to do, and on which build and back end."""

    source: str
    source_identity: dict[str, Any]
    sglang_version: str | None
    transfer_backend: str
    runner: str
    seed: int
    schedules: int


def _rate(runs: int, seconds: float) -> float | None:
    return round(runs / seconds, 1) if seconds else None


def document(asked: SearchAsked, events: list[dict[str, Any]], leaks: list[dict[str, Any]]) -> dict[str, Any]:
    """The document: the request, every chunk's seed and outcome, the rates and the shrunk leaks."""
    runs = sum(int(e["runs"]) for e in events)
    seconds = sum(float(e["seconds"]) for e in events)
    cpu_seconds = sum(float(e.get("cpu_seconds", e["seconds"])) for e in events)
    chunks = [
        {"chunk": e["chunk"], "seed": asked.seed * 1000 + e["chunk"], "runs": e["runs"], "leaked": bool(e["leak"])}
        for e in events
    ]
    return {
        "schema": SCHEMA,
        **asdict(asked),
        "chunks": chunks,
        "runs": runs,
        "seconds": round(seconds, 3),
        "cpu_seconds": round(cpu_seconds, 3),
        # per core: schedules per CPU second of the searching processes (wall time on a shared
        # machine also counts the time other processes held the core)
        "schedules_per_second_per_core": _rate(runs, cpu_seconds),
        "schedules_per_wall_second": _rate(runs, seconds),
        "acks_failed_send": events[0].get("acks_failed_send"),
        # how the build's own start-up built each side the schedules ran on (scheduler, KV manager,
        # sender and receiver classes)
        "servers": events[0].get("servers", {}),
        "assumptions": events[0].get("assumptions", []),
        "leaks": leaks,
    }


def write_fuzz(folder: Path, doc: dict[str, Any]) -> Path:
    """``fuzz.json`` in the run folder, written atomically."""
    path = folder / NAME
    write_atomic(path, json.dumps(doc, indent=2, sort_keys=True) + "\n")
    return path
