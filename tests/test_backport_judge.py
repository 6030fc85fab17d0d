"""Backport verdicts and git evidence wording, on synthetic observations (fast)."""

from __future__ import annotations

from pathlib import Path

import pytest

from difflab.backport.evidence import Evidence, disagreements
from difflab.diff.likeness import judge_backport
from difflab.matrix import load_matrix
from difflab.observation import Observation
from matrix_samples import RELEASES

MATRIX = (
    RELEASES
    + """
[[fixes]]
id = "38935"
pr = 38935
title = "t"
base = { release = "0.5.20" }
head = { release = "0.5.21" }
[[fixes.probes]]
name = "prefill"
[fixes.probes.expect]
"rejected.enqueued" = [true, false]
"rejected.retired" = [false, true]
[fixes.probes.controls]
"valid.enqueued" = true
[[fixes.probes]]
name = "decode"
[fixes.probes.expect]
"rejected.pending" = [true, false]
"""
)

HEAD = {
    "prefill": {"rejected.enqueued": False, "rejected.retired": True, "valid.enqueued": True},
    "decode": {"rejected.pending": False},
}
BASE = {
    "prefill": {"rejected.enqueued": True, "rejected.retired": False, "valid.enqueued": True},
    "decode": {"rejected.pending": True},
}


@pytest.fixture
def fix(tmp_path: Path):
    path = tmp_path / "m.toml"
    path.write_text(MATRIX)
    return load_matrix(path).fix("38935")


def _obs(probe: str, fields: dict, status: str = "ok", error: str | None = None) -> Observation:
    return Observation(fix="38935", probe=probe, side="fork", source={}, status=status, fields=fields, error=error)


def _judge(fix, prefill: dict, decode: dict, **kw):
    return judge_backport(fix, {"prefill": _obs("prefill", prefill, **kw), "decode": _obs("decode", decode)})


def test_present_absent_partial(fix) -> None:
    assert _judge(fix, HEAD["prefill"], HEAD["decode"]).verdict == "present"
    assert _judge(fix, BASE["prefill"], BASE["decode"]).verdict == "absent"
    partial = _judge(fix, BASE["prefill"], HEAD["decode"])
    assert partial.verdict == "partial" and partial.reason == "like head: decode; like base: prefill"
    doc = partial.to_dict()
    assert doc["head_like"] == ["decode"] and doc["base_like"] == ["prefill"] and not doc["passed"]
    mixed = _judge(fix, {**HEAD["prefill"], "rejected.retired": False}, HEAD["decode"])
    assert mixed.verdict == "partial" and "mixed within the probe: prefill" in mixed.reason


def test_untrustworthy_observations_are_errors(fix) -> None:
    drift = _judge(fix, {**HEAD["prefill"], "valid.enqueued": False}, HEAD["decode"])
    assert drift.verdict == "error" and "valid.enqueued" in drift.reason
    other = _judge(fix, {**HEAD["prefill"], "rejected.enqueued": "maybe"}, HEAD["decode"])
    assert other.verdict == "error" and "matches neither side" in other.reason
    crashed = _judge(fix, {}, HEAD["decode"], status="error", error="Traceback\nAttributeError: x")
    assert crashed.verdict == "error" and "AttributeError: x" in crashed.reason
    missing = judge_backport(fix, {"prefill": _obs("prefill", HEAD["prefill"])})
    assert missing.verdict == "error" and "decode: probe error: no observation" in missing.reason


def test_disagreements_between_evidence_and_behaviour() -> None:
    claims = Evidence(
        version="0.5.21",
        first_release_with_fix="0.5.21",
        version_claims_fix=True,
        ancestor=False,
        patch_equivalent=False,
    )
    assert any("version string 0.5.21" in d for d in disagreements("absent", claims))
    reverted = Evidence(fix_commit="c" * 40, ancestor=True, patch_equivalent=True)
    assert any("reverted" in d for d in disagreements("partial", reverted))
    assert disagreements("present", reverted) == []
    reimplemented = Evidence(ancestor=False, patch_equivalent=False)
    assert any("re-implemented" in d for d in disagreements("present", reimplemented))
