"""The throughput judgment's rules on rounds whose answers are known exactly.

Rounds are shaped like the bench's replies: ``rounds[r][workload][str(size)]`` = seconds per
item, eight rounds a side. Round ``r`` of a side takes ``(1 + r/100)`` times its base cost, so
every base round is faster than every head round when head is slower (Mann-Whitney's exact
two-sided p is then ``2 / C(16, 8) = 1/6435``) and each side's bootstrap means stay within
``[1.00, 1.07]`` times its cost, which bounds the interval.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from difflab.diff.throughput import ThroughputResult, judge_throughput

SIZES = (10, 100, 1000)
VALID, MIXED = "prefill_door.valid", "prefill_door.mixed"
DESCRIBED = [
    {"name": VALID, "unit": "requests", "what": "valid requests through PrefillBootstrapQueue.add"},
    {"name": MIXED, "unit": "requests", "what": "valid + 1 in 4 intake-rejected requests"},
]
SEPARATED_P = 1 / 6435  # 2 / C(16, 8): eight rounds a side, every base round below every head round
Rounds = list[dict[str, dict[str, float]]]


def side(cost: dict[str, float], sizes: tuple[int, ...] = SIZES, exponent: float = 0.0) -> Rounds:
    """Eight rounds; cell ``w``, ``s`` of round ``r``: ``cost[w] * (1 + r/100) * (s/10)**exponent`` µs."""
    return [
        {w: {str(s): c * (1 + r / 100) * 1e-6 * (s / 10) ** exponent for s in sizes} for w, c in cost.items()}
        for r in range(8)
    ]


def growing(exponent: float, sizes: tuple[int, ...] = SIZES) -> Rounds:
    """Eight rounds whose time per item grows as ``(s/10)**(exponent + r/100)`` in round ``r``."""
    return [
        {w["name"]: {str(s): 10e-6 * (s / 10) ** (exponent + r / 100) for s in sizes} for w in DESCRIBED}
        for r in range(8)
    ]


def fresh() -> ThroughputResult:
    """A result as the A/B plans it, before the rounds are judged."""
    return ThroughputResult(
        fix="38935",
        label="#38935",
        status="error",
        probe="pr38935_doors",
        base={"label": "v0.5.2", "sglang_version": "0.5.2"},
        head={"label": "v0.5.3", "sglang_version": "0.5.3"},
        settings={"rounds": 8, "sizes": [10, 100, 1000], "seed": 1},
    )


def one_slower() -> tuple[Rounds, Rounds]:
    """The valid-requests path 1.5x slower in head, the mixed one unchanged."""
    return side({VALID: 10.0, MIXED: 10.0}), side({VALID: 15.0, MIXED: 10.0})


def test_one_workload_slower_shows_in_its_own_mark_and_half_in_the_geometric_mean():
    base, head = one_slower()
    r = judge_throughput(fresh(), DESCRIBED, base, head, seed=1)
    assert r.ok and r.status == "ok" and r.mark == "+"
    assert r.ratio == pytest.approx(math.sqrt(1.5))  # one cell of two 1.5x slower: geometric mean
    assert math.sqrt(1.5) / 1.07 <= r.ci[0] < r.ratio < r.ci[1] <= math.sqrt(1.5) * 1.07
    assert r.comparison.p_value == pytest.approx(SEPARATED_P)
    assert r.comparison.metric == "seconds per item, geometric mean of every workload and size"
    assert r.comparison.higher_is_better is False  # time per item: lower is better
    valid, mixed = r.workloads
    assert (valid.name, valid.unit, valid.what) == (VALID, "requests", DESCRIBED[0]["what"])
    assert (mixed.name, mixed.unit, mixed.what) == (MIXED, "requests", DESCRIBED[1]["what"])
    assert valid.mark == "+" and valid.comparison.ratio == pytest.approx(1.5)
    assert valid.comparison.metric == "prefill_door.valid: seconds per item, geometric mean of sizes"
    assert mixed.mark == "~" and mixed.comparison.ratio == pytest.approx(1.0) and mixed.comparison.p_value == 1.0
    assert valid.sizes == {
        str(s): {"base": pytest.approx(10.35e-6), "head": pytest.approx(15.525e-6), "ratio": pytest.approx(1.5)}
        for s in SIZES
    }
    assert mixed.sizes["1000"] == {
        "base": pytest.approx(10.35e-6),
        "head": pytest.approx(10.35e-6),
        "ratio": pytest.approx(1.0),
    }


def test_diff_json_entry_of_a_judged_fix_names_every_field():
    base, head = one_slower()
    r = judge_throughput(fresh(), DESCRIBED, base, head, seed=1)
    r.wall_s, r.cpu_s = 41.5, 38.25
    doc = r.to_dict()
    assert set(doc) == {
        "status",
        "reason",
        "probe",
        "base",
        "head",
        "settings",
        "mark",
        "ratio",
        "ci",
        "confidence",
        "p_value",
        "alpha",
        "exponent",
        "workloads",
        "samples",
        "wall_s",
        "cpu_s",
        "wall_clock",
    }
    assert doc["status"] == "ok" and doc["reason"] == "" and doc["probe"] == "pr38935_doors"
    assert doc["base"] == {"label": "v0.5.2", "sglang_version": "0.5.2"}
    assert doc["head"] == {"label": "v0.5.3", "sglang_version": "0.5.3"}
    assert doc["settings"] == {"rounds": 8, "sizes": [10, 100, 1000], "seed": 1}
    assert doc["mark"] == "+" and doc["ratio"] == pytest.approx(1.2247449) and doc["alpha"] == 0.002
    low, high = doc["ci"]
    assert 1.14 < low < 1.2247 < high < 1.32
    assert doc["confidence"] == 0.95 and doc["p_value"] == pytest.approx(SEPARATED_P)
    assert set(doc["exponent"]) == {"base", "head", "p_value"} and doc["exponent"]["p_value"] > 0.002
    assert doc["exponent"]["base"] == pytest.approx(0.0, abs=1e-9) and doc["exponent"]["head"] == pytest.approx(
        0.0, abs=1e-9
    )
    assert doc["samples"] == {"base": base, "head": head}
    assert doc["wall_s"] == 41.5 and doc["cpu_s"] == 38.25 and doc["wall_clock"] is None
    valid = doc["workloads"][0]
    assert set(valid) == {"name", "unit", "what", "mark", "ratio", "ci", "p_value", "exponent", "sizes"}
    assert (valid["name"], valid["unit"], valid["what"], valid["mark"]) == (
        VALID,
        "requests",
        DESCRIBED[0]["what"],
        "+",
    )
    assert valid["ratio"] == pytest.approx(1.5) and valid["p_value"] == pytest.approx(SEPARATED_P)
    assert 1.5 / 1.07 <= valid["ci"][0] < 1.5 < valid["ci"][1] <= 1.5 * 1.07
    assert set(valid["exponent"]) == {"base", "head", "p_value"} and valid["exponent"]["head"] == pytest.approx(
        0.0, abs=1e-9
    )
    assert valid["sizes"]["100"] == {
        "base": pytest.approx(10.35e-6),
        "head": pytest.approx(15.525e-6),
        "ratio": pytest.approx(1.5),
    }
    assert doc["workloads"][1]["mark"] == "~" and doc["workloads"][1]["name"] == MIXED


def test_a_fix_without_a_measurement_writes_nulls_and_never_fails():
    r = ThroughputResult(
        fix="43719b",
        label="#43719b",
        status="unavailable",
        reason="the matrix declares no throughput probe for this fix",
    )
    assert not r.ok and r.mark == "!" and r.ratio is None and r.ci is None and not r.fails(1.0)
    assert r.to_dict() == {
        "status": "unavailable",
        "reason": "the matrix declares no throughput probe for this fix",
        "probe": None,
        "base": {},
        "head": {},
        "settings": {},
        "mark": None,
        "ratio": None,
        "ci": None,
        "confidence": None,
        "p_value": None,
        "alpha": 0.002,
        "exponent": None,
        "workloads": [],
        "samples": {},
        "wall_s": None,
        "cpu_s": None,
        "wall_clock": None,
    }


def test_a_wait_shows_in_wall_time_while_cpu_time_is_unchanged():
    cpu = side({VALID: 10.0, MIXED: 10.0})
    wall = {"base": side({VALID: 10.0, MIXED: 10.0}), "head": side({VALID: 30.0, MIXED: 30.0})}
    r = judge_throughput(fresh(), DESCRIBED, cpu, side({VALID: 10.0, MIXED: 10.0}), seed=1, wall=wall)
    assert r.mark == "~" and r.ratio == pytest.approx(1.0) and not r.fails(1.0)  # CPU time is what is judged
    assert r.wall is not None and r.wall.mark == "+" and r.wall.ratio == pytest.approx(3.0)
    assert r.wall.metric == "wall seconds per item, geometric mean"
    assert r.samples["wall"] == wall
    clock = r.to_dict()["wall_clock"]
    assert set(clock) == {"mark", "ratio", "ci", "p_value"}
    assert clock["mark"] == "+" and clock["ratio"] == pytest.approx(3.0)
    assert clock["p_value"] == pytest.approx(SEPARATED_P)
    assert 3.0 / 1.07 <= clock["ci"][0] < 3.0 < clock["ci"][1] <= 3.0 * 1.07


def test_wall_rounds_missing_on_one_side_are_not_compared():
    base, head = one_slower()
    r = judge_throughput(fresh(), DESCRIBED, base, head, seed=1, wall={"base": base, "head": []})
    assert r.wall is None and "wall" not in r.samples and r.to_dict()["wall_clock"] is None


def test_the_same_seed_gives_the_same_interval_and_another_seed_another():
    base, head = one_slower()
    wall = {"base": base, "head": head}
    first, again, other = (judge_throughput(fresh(), DESCRIBED, base, head, seed=s, wall=wall) for s in (1, 1, 2))
    assert first.ci == again.ci and first.wall.ci_low == again.wall.ci_low
    assert first.workloads[0].comparison.ci_low == again.workloads[0].comparison.ci_low
    assert first.ci != other.ci and first.wall.ci_low != other.wall.ci_low
    assert first.workloads[0].comparison.ci_low != other.workloads[0].comparison.ci_low


def test_a_growing_cost_shows_in_the_exponent_medians_and_their_rank_test():
    r = judge_throughput(fresh(), DESCRIBED, growing(0.0), growing(0.5), seed=1)
    assert r.exponent.base == pytest.approx(0.035) and r.exponent.head == pytest.approx(0.535)
    assert r.exponent.p_value == pytest.approx(SEPARATED_P)
    w = r.workloads[0]
    assert w.exponent.base == pytest.approx(0.035) and w.exponent.head == pytest.approx(0.535)
    assert w.exponent.p_value == pytest.approx(SEPARATED_P)
    assert w.sizes["10"]["ratio"] == pytest.approx(1.0)
    assert w.sizes["1000"]["ratio"] == pytest.approx((100**0.53 + 100**0.54) / (100**0.03 + 100**0.04))
    assert w.to_dict()["exponent"] == {
        "base": pytest.approx(0.035),
        "head": pytest.approx(0.535),
        "p_value": pytest.approx(SEPARATED_P),
    }


def test_two_sizes_are_enough_for_an_exponent():
    r = judge_throughput(fresh(), DESCRIBED, growing(0.0, (10, 300)), growing(1.0, (10, 300)), seed=1)
    assert r.exponent.base == pytest.approx(0.035) and r.exponent.head == pytest.approx(1.035)
    assert r.exponent.p_value == pytest.approx(SEPARATED_P)
    assert r.workloads[1].exponent.head == pytest.approx(1.035)


def test_one_size_has_no_exponent():
    base, head = side({VALID: 10.0, MIXED: 10.0}, (100,)), side({VALID: 15.0, MIXED: 15.0}, (100,))
    r = judge_throughput(fresh(), DESCRIBED, base, head, seed=1)
    assert r.mark == "+" and r.ratio == pytest.approx(1.5)
    for scaling in (r.exponent, r.workloads[0].exponent):
        assert math.isnan(scaling.base) and math.isnan(scaling.head) and scaling.p_value == 1.0


def test_one_described_workload_is_judged_on_its_own():
    described = [{"name": VALID, "unit": "requests"}]
    r = judge_throughput(fresh(), described, side({VALID: 10.0}), side({VALID: 15.0}), seed=1)
    assert r.mark == "+" and r.ratio == pytest.approx(1.5) and [w.name for w in r.workloads] == [VALID]
    assert r.workloads[0].what == ""


def test_a_workload_described_without_a_unit_counts_items():
    described: list[dict[str, Any]] = [{"name": VALID}, {"name": MIXED}]
    base, head = one_slower()
    r = judge_throughput(fresh(), described, base, head, seed=1)
    assert [(w.unit, w.what) for w in r.workloads] == [("items", ""), ("items", "")]
    assert r.to_dict()["workloads"][0]["unit"] == "items" and r.to_dict()["workloads"][0]["what"] == ""


def test_a_slowdown_exactly_at_the_factor_does_not_fail():
    base, head = one_slower()
    r = judge_throughput(fresh(), DESCRIBED, base, head, seed=1)
    assert not r.fails(r.ratio) and r.fails(r.ratio - 1e-9) and not r.fails(None)


def test_no_rounds_on_either_side_is_refused():
    base, head = one_slower()
    for b, h in (([], head), (base, []), ([], [])):
        with pytest.raises(ValueError, match=r"^no rounds to compare$"):
            judge_throughput(fresh(), DESCRIBED, b, h, seed=1)


def test_a_workload_missing_from_a_round_is_named():
    base, head = one_slower()
    head[3] = {VALID: head[3][VALID]}
    with pytest.raises(ValueError) as info:
        judge_throughput(fresh(), DESCRIBED, base, head, seed=1)
    assert str(info.value) == "workload(s) ['prefill_door.mixed'] missing from some round"


def test_a_single_round_a_side_is_refused_naming_the_metric():
    base, head = one_slower()
    with pytest.raises(ValueError) as info:
        judge_throughput(fresh(), DESCRIBED, base[:1], head[:1], seed=1)
    assert str(info.value) == (
        "seconds per item, geometric mean of every workload and size base: need at least two samples, got 1"
    )
