"""Verdict logic on hand-made observations: every verdict is reachable and precise."""

from __future__ import annotations

import pytest

from difflab.diff import Match, classify, judge_fix, same
from difflab.matrix.model import Fix, ProbeSpec, SidePin
from difflab.observation import Observation

SPEC = ProbeSpec(
    name="p",
    expect={"rejected.enqueued": (True, False), "rejected.retired": (0, 1)},
    controls={"valid.enqueued": True},
)
FIX = Fix(id="1", pr=1, title="t", base=SidePin(release="a"), head=SidePin(release="b"), probes=(SPEC,))
BUG = {"rejected.enqueued": True, "rejected.retired": 0, "valid.enqueued": True}
FIXED = {"rejected.enqueued": False, "rejected.retired": 1, "valid.enqueued": True}


def obs(fields: dict, status: str = "ok", side: str = "base", error: str | None = None) -> Observation:
    return Observation(fix="1", probe="p", side=side, source={}, status=status, fields=fields, error=error)


def verdict(base: Observation, head: Observation, fix: Fix = FIX) -> str:
    return judge_fix(fix, {"p": base}, {"p": head}, {"label": "a"}, {"label": "b"}).verdict


def test_confirmed() -> None:
    v = judge_fix(FIX, {"p": obs(BUG)}, {"p": obs(FIXED, side="head")}, {"label": "a"}, {"label": "b"})
    assert v.verdict == "confirmed" and v.passed
    assert all(f.ok for f in v.probes[0].fields)


def test_head_vs_head_is_not_reproduced() -> None:
    assert verdict(obs(FIXED), obs(FIXED, side="head")) == "not-reproduced"


def test_base_vs_base_is_not_fixed() -> None:
    assert verdict(obs(BUG), obs(BUG, side="head")) == "not-fixed"


def test_half_fixed_head_is_not_fixed_and_names_the_field() -> None:
    half = dict(FIXED, **{"rejected.retired": 0})
    v = judge_fix(FIX, {"p": obs(BUG)}, {"p": obs(half, side="head")}, {}, {})
    assert v.verdict == "not-fixed"
    assert "rejected.retired=0 (expected 1)" in v.reason


def test_control_drift_beats_a_confirmed_looking_diff() -> None:
    drifted = dict(FIXED, **{"valid.enqueued": False})
    assert verdict(obs(BUG), obs(drifted, side="head")) == "control-drift"


def test_missing_control_field_is_drift() -> None:
    head = {k: v for k, v in FIXED.items() if k != "valid.enqueued"}
    assert verdict(obs(BUG), obs(head, side="head")) == "control-drift"


def test_error_on_either_side() -> None:
    assert verdict(obs({}, "error", error="boom"), obs(FIXED, side="head")) == "error"
    assert verdict(obs(BUG), obs({}, "error", side="head", error="x\nAttributeError: y")) == "error"


def test_missing_expected_field_is_error_not_a_verdict() -> None:
    assert verdict(obs({"valid.enqueued": True}), obs(FIXED, side="head")) == "error"


def test_unavailable_head_is_expected_when_declared() -> None:
    fix = Fix(
        id="1", pr=1, title="t", base=SidePin(release="a"), head=SidePin(unavailable="no release"), probes=(SPEC,)
    )
    head = Observation.unavailable("1", "p", "head", "no release")
    v = judge_fix(fix, {"p": obs(BUG)}, {"p": head}, {}, {})
    assert v.verdict == "unavailable" and v.passed and "base shows the bug" in v.reason


def test_no_probes_is_an_error_that_says_so() -> None:
    fix = Fix(id="1", pr=1, title="t", base=SidePin(release="a"), head=SidePin(release="b"), probes=())
    v = judge_fix(fix, {}, {}, {}, {})
    assert v.verdict == "error" and "no probes" in v.reason and not v.passed


@pytest.mark.parametrize(
    ("a", "b", "equal"),
    [(True, 1, False), (1, 1.0, False), ([1, 2], [1, 2], True), (None, None, True), ("400", 400, False)],
)
def test_strict_equality(a, b, equal: bool) -> None:
    assert same(a, b) is equal


def test_classify_mixed_and_other() -> None:
    assert classify(obs(BUG), SPEC) is Match.BASE
    assert classify(obs(FIXED), SPEC) is Match.HEAD
    assert classify(obs(dict(BUG, **{"rejected.retired": 1})), SPEC) is Match.MIXED
    assert classify(obs(dict(BUG, **{"rejected.retired": 7})), SPEC) is Match.OTHER
    assert classify(None, SPEC) is Match.ERROR
