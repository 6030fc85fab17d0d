"""What one probe saw on one side: the unit of evidence.

Plain dataclasses serialised to JSON with a schema version, so bundles
written today stay readable when fields are added later.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

SCHEMA_VERSION = 2
"""2: a release source's identity names its unpacked tree (``tree_sha256``); 1 observations lack it."""

Status = Literal["ok", "error", "unavailable", "n/a"]
SIDES = ("base", "head")
"""The two sides of a fix: the base shows the bug, the head the fix."""


@dataclass
class Observation:
    """The fields a probe observed on one source, plus everything needed to doubt it."""

    fix: str
    probe: str
    side: str
    source: dict[str, Any]
    status: Status
    fields: dict[str, Any] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    error: str | None = None
    defaults: list[dict[str, Any]] = field(default_factory=list)
    """Attributes harness-built objects took from this build's own constructor code."""
    forced: list[dict[str, Any]] = field(default_factory=list)
    """Switches the probe forced on this build, each with the build's own default."""
    fallbacks: list[dict[str, Any]] = field(default_factory=list)
    """Reads that fell back (AttributeError) because the real object lacks the attribute too."""
    sglang_version: str | None = None
    duration_s: float = 0.0
    runner: str = ""
    runner_fallback: str | None = None
    """Set when the chosen back end could not run the probe and a fresh process ran it instead: which, and why."""
    cached: bool = False
    schema: int = SCHEMA_VERSION

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Observation:
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})

    @classmethod
    def unavailable(cls, fix: str, probe: str, side: str, reason: str) -> Observation:
        return cls(fix=fix, probe=probe, side=side, source={}, status="unavailable", error=reason)

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")

    @classmethod
    def read(cls, path: Path) -> Observation:
        return cls.from_dict(json.loads(path.read_text()))
