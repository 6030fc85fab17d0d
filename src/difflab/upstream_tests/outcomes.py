"""One upstream test's outcome on one side, read from the test child's facts; and its change across two sides.

Outcomes: ``passed``; ``failed`` (an assertion, or the test needs a name the fix adds and
this side lacks: the side lacks the fix); ``stale`` (the test's own fakes or set-up do not
fit this code: an ``AttributeError`` / ``TypeError`` from a fake, from the set-up outside
SGLang's code, or binding a call the test makes; or a name that neither the fix nor this
side has); ``error`` (any other exception, and those types raised by SGLang's own code in
the set-up or by the test's own frame otherwise); ``skipped``.
A test's outcome is taken over its phases and its sub-tests: any failure fails it.

Changes from base to head: ``fixed`` (failed → passed), ``regressed`` (passed → failed),
``still-passing``, ``still-failing``, ``stale`` / ``error`` / ``skipped`` (either side
says nothing about behaviour), ``only-base`` / ``only-head`` (the test ran on one side).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from difflab.probe.upstream_facts import BINDING
from difflab.upstream_tests.symbols import SymbolIndex, symbol_name

OUTCOMES = ("passed", "failed", "error", "stale", "skipped")
CHANGES = (
    "fixed",
    "regressed",
    "still-passing",
    "still-failing",
    "stale",
    "error",
    "skipped",
    "only-base",
    "only-head",
)
RANK = ("failed", "error", "stale", "passed", "skipped")
"""Which part decides a test's outcome: the first of these any part has."""
SET_UP = ("setup", "import", "collect")


@dataclass(frozen=True)
class Reference:
    """The fix's base and head sources, to tell a name the fix adds from any other missing name."""

    base: SymbolIndex | None = None
    head: SymbolIndex | None = None

    def added_by_fix(self, missing: dict[str, Any]) -> bool:
        in_base = self.base is not None and self.base.has(missing)
        return self.head is not None and self.head.has(missing) and not in_base


@dataclass
class Part:
    """One phase or sub-test, as the lab reads it."""

    outcome: str
    name: str | None = None  # a sub-test's parameters, e.g. "(door='decode')"
    phase: str | None = None
    error_type: str | None = None
    message: str | None = None
    why: str | None = None


@dataclass
class Outcome:
    """One test on one side."""

    outcome: str
    message: str | None = None
    error_type: str | None = None
    why: str | None = None
    phase: str | None = None
    duration_s: float = 0.0
    subtests: list[Part] = field(default_factory=list)
    traceback: str | None = None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["subtests"] = [asdict(s) for s in self.subtests]
        data["duration_s"] = round(self.duration_s, 6)
        return data


def read_part(raw: dict[str, Any], ref: Reference) -> tuple[str, str | None]:
    """``(outcome, why)`` for one raw part of the test child."""
    outcome = raw.get("outcome", "error")
    if outcome != "error":
        return outcome, None
    missing, fake, etype = raw.get("missing"), raw.get("fake"), raw.get("error_type")
    if missing and ref.added_by_fix(missing):
        return "failed", f"lacks {symbol_name(missing)}, which the fix adds (its head has it, its base does not)"
    if fake and etype in ("AttributeError", "TypeError"):
        return "stale", f"the test's fake {fake} does not fit this code"
    if missing:
        return "stale", f"needs {symbol_name(missing)}, which this code lacks and the fix does not add"
    return _drift(raw, etype)


def _drift(raw: dict[str, Any], etype: str | None) -> tuple[str, str | None]:
    """A set-up or a call that does not fit this code is ``stale``; the same types raised otherwise are errors.

    Raised inside SGLang's own code, an AttributeError or TypeError in the set-up is that
    code failing, not the test drifting; and a TypeError in the test's own frame is drift
    only when it is the binding of a call (the test passing arguments the code does not
    take), not, say, ``len(None)`` of what the code returned.
    """
    if raw.get("phase") in SET_UP and etype in ("AttributeError", "TypeError") and raw.get("raised_in") != "sglang":
        return "stale", "the test's set-up does not fit this code"
    if etype == "TypeError" and raw.get("raised_in") == "test" and BINDING.match(str(raw.get("message") or "")):
        return "stale", "the test calls this code with arguments it does not take"
    return "error", None


def read_test(raw: dict[str, Any], ref: Reference) -> Outcome:
    """A test's outcome over its phases and sub-tests; the deciding part gives the message."""
    parts: list[tuple[Part, dict[str, Any]]] = []
    for p in raw.get("parts", []):
        outcome, why = read_part(p, ref)
        parts.append((Part(outcome, None, p.get("phase"), p.get("error_type"), p.get("message"), why), p))
    subtests = []
    for s in raw.get("subtests", []):
        outcome, why = read_part(s, ref)
        sub = Part(outcome, s.get("name"), "call", s.get("error_type"), s.get("message"), why)
        subtests.append(sub)
        parts.append((sub, s))
    if not parts:
        return Outcome("error", "the test left no result", duration_s=float(raw.get("duration_s") or 0.0))
    decided, raw_part = next((p, r) for rank in RANK for p, r in parts if p.outcome == rank)
    message = decided.message
    if decided.name:
        message = f"{decided.name}: {message}" if message else decided.name
    return Outcome(
        outcome=decided.outcome,
        message=message,
        error_type=decided.error_type,
        why=decided.why,
        phase=decided.phase,
        duration_s=float(raw.get("duration_s") or 0.0),
        subtests=subtests,
        traceback=raw_part.get("traceback"),
    )


def change(base: Outcome | None, head: Outcome | None) -> str:
    if base is None or head is None:
        return "only-head" if base is None else "only-base"
    pair = (base.outcome, head.outcome)
    for quiet in ("error", "stale", "skipped"):
        if quiet in pair:
            return quiet
    return {
        ("failed", "passed"): "fixed",
        ("passed", "failed"): "regressed",
        ("passed", "passed"): "still-passing",
        ("failed", "failed"): "still-failing",
    }[pair]


def counts(values: list[str], order: tuple[str, ...]) -> dict[str, int]:
    """How many of each value, in ``order`` (values not in it last), zeros left out."""
    found = {v: values.count(v) for v in dict.fromkeys(values)}
    return {k: found[k] for k in [*order, *sorted(set(found) - set(order))] if found.get(k)}


def count_text(found: dict[str, int]) -> str:
    return ", ".join(f"{n} {k}" for k, n in found.items()) or "none ran"
