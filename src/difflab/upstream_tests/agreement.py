"""Do SGLang's own tests agree with the probe's verdict? Said explicitly, beside the verdict, never instead of it.

``probe: confirmed; SGLang's tests: 1 fixed, 6 stale — they agree``. The tests the matrix
names as the fix's own judge the agreement when there are any, every test otherwise, and
only behaviour counts (``stale``, ``error`` and ``skipped`` have no say). A disagreement
names each test and what it did; the workflow adds it to the verdict's reason.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from difflab.upstream_tests.outcomes import CHANGES, OUTCOMES, count_text, counts

PAIR_SAYS_FIXED = ("confirmed",)
PAIR_SAYS_NOT = ("not-fixed", "not-reproduced")
HEAD_LIKE = ("present", "fixed")
BASE_LIKE = ("absent", "bug")


class RowLike(Protocol):
    id: str
    own: bool
    change: str | None

    def outcome(self, side: str) -> str | None: ...


@dataclass
class Agreement:
    probe: str
    text: str
    agrees: bool | None
    disagreements: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"probe": self.probe, "text": self.text, "agrees": self.agrees, "disagreements": self.disagreements}

    @property
    def flag(self) -> str:
        """What the verdict's reason gains: nothing, or the disagreement."""
        return f"SGLang's tests disagree: {'; '.join(self.disagreements)}" if self.disagreements else ""


def short(test_id: str) -> str:
    return test_id.split("::", 1)[1] if "::" in test_id else test_id


def _text(probe: str, summary: str, own: str | None, agrees: bool | None, disagreements: list[str]) -> str:
    text = f"probe: {probe}; SGLang's tests: {summary}"
    if own:
        text += f" (the fix's own: {own})"
    if disagreements:
        return text + " — they DISAGREE: " + "; ".join(disagreements)
    return text + {True: " — they agree", None: " — no say on behaviour"}.get(agrees, "")


def pair_agreement(probe: str, rows: Sequence[RowLike]) -> Agreement:
    """Base against head: the probe's verdict beside each test's change."""
    owned = [r for r in rows if r.own]
    changes = {r.id: r.change or "" for r in rows}
    disagreements: list[str] = []
    agrees: bool | None = None
    if probe in PAIR_SAYS_FIXED:
        disagreements, agrees = _against_fixed(rows, owned, changes)
    elif probe in PAIR_SAYS_NOT:
        disagreements, agrees = _against_not_fixed(probe, owned or list(rows), owned, changes)
    if disagreements:
        agrees = False
    summary = count_text(counts([r.change or "" for r in rows], CHANGES))
    own = count_text(counts([r.change or "" for r in owned], CHANGES)) if owned else None
    return Agreement(probe, _text(probe, summary, own, agrees, disagreements), agrees, disagreements)


_REGRESSED = {"regressed": "regressed (passes on the base, fails on the head)"}
_OWN_UNCHANGED = {"still-failing": "fails on both sides", "still-passing": "passes on the base too"}


def _against_fixed(
    rows: Sequence[RowLike], owned: list[RowLike], changes: dict[str, str]
) -> tuple[list[str], bool | None]:
    """The probe says fixed: any test that regressed, and any of the fix's own tests that did not change, disagree."""
    disagreements = [f"{short(r.id)} {_REGRESSED[changes[r.id]]}" for r in rows if changes[r.id] in _REGRESSED]
    disagreements += [
        f"{short(r.id)} {_OWN_UNCHANGED[changes[r.id]]}" for r in owned if changes[r.id] in _OWN_UNCHANGED
    ]
    judged = owned or list(rows)
    return disagreements, True if any(changes[r.id] == "fixed" for r in judged) else None


def _against_not_fixed(
    probe: str, judged: list[RowLike], owned: list[RowLike], changes: dict[str, str]
) -> tuple[list[str], bool | None]:
    """The probe says not fixed (or not broken): a test the head fixed disagrees."""
    disagreements = [
        f"{short(r.id)} fixed (fails on the base, passes on the head)" for r in judged if changes[r.id] == "fixed"
    ]
    seen = "still-failing" if probe == "not-fixed" else "still-passing"
    return disagreements, True if any(changes[r.id] == seen for r in owned) else None


def single_agreement(verdict: str, side: str, rows: Sequence[RowLike]) -> Agreement:
    """One source (a release, a fork): the verdict beside the fix's own tests' outcomes there."""
    owned = [r for r in rows if r.own]
    outcomes = {r.id: r.outcome(side) or "" for r in rows}
    disagreements: list[str] = []
    agrees: bool | None = None
    if verdict in HEAD_LIKE:
        disagreements = [f"{short(r.id)} fails here" for r in owned if outcomes[r.id] == "failed"]
        agrees = True if any(outcomes[r.id] == "passed" for r in owned) else None
    elif verdict in BASE_LIKE:
        disagreements = [f"{short(r.id)} passes here" for r in owned if outcomes[r.id] == "passed"]
        agrees = True if any(outcomes[r.id] == "failed" for r in owned) else None
    if disagreements:
        agrees = False
    ran = {tid: o for tid, o in outcomes.items() if o}  # a test not run on this side has nothing to count
    summary = count_text(counts(list(ran.values()), OUTCOMES))
    own = count_text(counts([ran[r.id] for r in owned if r.id in ran], OUTCOMES)) if owned else None
    return Agreement(verdict, _text(verdict, summary, own, agrees, disagreements), agrees, disagreements)
