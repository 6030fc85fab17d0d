"""The throughput judgment's rules on rounds whose answers are known exactly.

Rounds are shaped like the bench's replies: ``rounds[r][workload][str(size)]`` = seconds per
item, twelve rounds a side. Round ``r`` of a side takes ``(1 + r/100)`` times its cost (a
machine drifting 11 % over the A/B, on both sides alike), so round ``r`` of head against
round ``r`` of base -- a pair -- is exactly the cost ratio: every pair says head is slower
(the exact Wilcoxon two-sided p is then ``2 / 2**12 = 1/2048``), the median of the paired
ratios is the ratio and its bootstrap interval is that one point.
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
SEPARATED_P = 1 / 2048  # 2 / 2**12: twelve pairs, every one head slower
ROUNDS = 12
Rounds = list[dict[str, dict[str, float]]]


def side(cost: dict[str, float], sizes: tuple[int, ...] = SIZES, exponent: float = 0.0) -> Rounds:
    """Twelve rounds; cell ``w``, ``s`` of round ``r``: ``cost[w] * (1 + r/100) * (s/10)**exponent`` µs."""
    return [
        {w: {str(s): c * (1 + r / 100) * 1e-6 * (s / 10) ** exponent for s in sizes} for w, c in cost.items()}
        for r in range(ROUNDS)
    ]


def growing(exponent: float, sizes: tuple[int, ...] = SIZES) -> Rounds:
    """Twelve rounds whose time per item grows as ``(s/10)**(exponent + r/100)`` in round ``r``."""
    return [
        {w["name"]: {str(s): 10e-6 * (s / 10) ** (exponent + r / 100) for s in sizes} for w in DESCRIBED}
        for r in range(ROUNDS)
    ]


def jittered(factor: float, shuffle: int = 1, noise: float = 0.01, rounds: int = ROUNDS) -> Rounds:
    """Both workloads at ``10 * factor`` µs, round ``r`` off by ``noise * ((shuffle * r) % rounds)``."""
    return [
        {w["name"]: {str(s): 10e-6 * factor * (1 + noise * ((shuffle * r) % rounds)) for s in SIZES} for w in DESCRIBED}
        for r in range(rounds)
    ]


def pairs(log_ratios: list[float]) -> tuple[Rounds, Rounds]:
    """Base drifting as ``side`` does, head = base * exp(d_r) in every cell of round ``r``."""
    base = side({VALID: 10.0, MIXED: 10.0})[: len(log_ratios)]
    head = [
        {w: {s: v * math.exp(d) for s, v in cells.items()} for w, cells in r.items()}
        for r, d in zip(base, log_ratios, strict=True)
    ]
    return base, head


def fresh() -> ThroughputResult:
    """A result as the A/B plans it, before the rounds are judged."""
    return ThroughputResult(
        fix="38935",
        label="#38935",
        status="error",
        probe="pr38935_doors",
        base={"label": "v0.5.2", "sglang_version": "0.5.2"},
        head={"label": "v0.5.3", "sglang_version": "0.5.3"},
        settings={"rounds": 12, "sizes": [10, 100, 1000], "seed": 1},
    )


def one_slower() -> tuple[Rounds, Rounds]:
    """The valid-requests path 1.5x slower in head, the mixed one unchanged."""
    return side({VALID: 10.0, MIXED: 10.0}), side({VALID: 15.0, MIXED: 10.0})


def test_one_workload_slower_shows_in_its_own_mark_and_half_in_the_geometric_mean():
    base, head = one_slower()
    r = judge_throughput(fresh(), DESCRIBED, base, head, seed=1)
    assert r.ok and r.status == "ok" and r.mark == "+"
    assert r.ratio == pytest.approx(math.sqrt(1.5))  # one cell of two 1.5x slower: geometric mean
    assert r.ci == pytest.approx((math.sqrt(1.5), math.sqrt(1.5)))  # every pair says the same: a point
    assert r.comparison.p_value == pytest.approx(SEPARATED_P) and r.comparison.spread == pytest.approx(0.0)
    assert r.outcome == "slower" and r.comparison.regression
    assert r.comparison.metric == "seconds per item, geometric mean of every workload and size"
    valid, mixed = r.workloads
    assert (valid.name, valid.unit, valid.what) == (VALID, "requests", DESCRIBED[0]["what"])
    assert (mixed.name, mixed.unit, mixed.what) == (MIXED, "requests", DESCRIBED[1]["what"])
    assert valid.mark == "+" and valid.comparison.ratio == pytest.approx(1.5)
    assert valid.comparison.metric == "prefill_door.valid: seconds per item, geometric mean of sizes"
    assert mixed.mark == "~" and mixed.comparison.ratio == pytest.approx(1.0) and mixed.comparison.p_value == 1.0
    assert valid.sizes == {
        str(s): {"base": pytest.approx(10.55e-6), "head": pytest.approx(15.825e-6), "ratio": pytest.approx(1.5)}
        for s in SIZES
    }
    assert mixed.sizes["1000"] == {
        "base": pytest.approx(10.55e-6),
        "head": pytest.approx(10.55e-6),
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
        "outcome",
        "ratio",
        "ci",
        "spread",
        "confidence",
        "p_value",
        "alpha",
        "min_effect",
        "max_spread",
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
    assert doc["settings"] == {"rounds": 12, "sizes": [10, 100, 1000], "seed": 1}
    assert doc["mark"] == "+" and doc["outcome"] == "slower" and doc["ratio"] == pytest.approx(1.2247449)
    assert doc["alpha"] == 0.002 and doc["min_effect"] == 0.10 and doc["max_spread"] == 0.25
    assert doc["ci"] == [pytest.approx(1.2247449)] * 2 and doc["spread"] == pytest.approx(0.0)
    assert doc["confidence"] == 0.95 and doc["p_value"] == pytest.approx(SEPARATED_P)
    assert set(doc["exponent"]) == {"base", "head", "p_value"} and doc["exponent"]["p_value"] > 0.002
    assert doc["exponent"]["base"] == pytest.approx(0.0, abs=1e-9) and doc["exponent"]["head"] == pytest.approx(
        0.0, abs=1e-9
    )
    assert doc["samples"] == {"base": base, "head": head}
    assert doc["wall_s"] == 41.5 and doc["cpu_s"] == 38.25 and doc["wall_clock"] is None
    valid = doc["workloads"][0]
    assert set(valid) == {
        "name",
        "unit",
        "what",
        "mark",
        "outcome",
        "ratio",
        "ci",
        "spread",
        "p_value",
        "exponent",
        "sizes",
    }
    assert valid["outcome"] == "slower" and valid["spread"] == pytest.approx(0.0)
    assert (valid["name"], valid["unit"], valid["what"], valid["mark"]) == (
        VALID,
        "requests",
        DESCRIBED[0]["what"],
        "+",
    )
    assert valid["ratio"] == pytest.approx(1.5) and valid["p_value"] == pytest.approx(SEPARATED_P)
    assert valid["ci"] == [pytest.approx(1.5)] * 2
    assert set(valid["exponent"]) == {"base", "head", "p_value"} and valid["exponent"]["head"] == pytest.approx(
        0.0, abs=1e-9
    )
    assert valid["sizes"]["100"] == {
        "base": pytest.approx(10.55e-6),
        "head": pytest.approx(15.825e-6),
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
    assert r.outcome is None
    assert r.to_dict() == {
        "status": "unavailable",
        "reason": "the matrix declares no throughput probe for this fix",
        "probe": None,
        "base": {},
        "head": {},
        "settings": {},
        "mark": None,
        "outcome": None,
        "ratio": None,
        "ci": None,
        "spread": None,
        "confidence": None,
        "p_value": None,
        "alpha": 0.002,
        "min_effect": 0.10,
        "max_spread": 0.25,
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
    assert set(clock) == {"mark", "ratio", "ci", "spread", "p_value"}
    assert clock["mark"] == "+" and clock["ratio"] == pytest.approx(3.0)
    assert clock["p_value"] == pytest.approx(SEPARATED_P)
    assert clock["ci"] == [pytest.approx(3.0)] * 2 and clock["spread"] == pytest.approx(0.0)


def test_wall_rounds_missing_on_one_side_are_not_compared():
    base, head = one_slower()
    r = judge_throughput(fresh(), DESCRIBED, base, head, seed=1, wall={"base": base, "head": []})
    assert r.wall is None and "wall" not in r.samples and r.to_dict()["wall_clock"] is None


def test_the_interval_is_the_bootstrap_of_the_paired_median_and_the_seed_makes_it_repeatable():
    base = side({VALID: 10.0, MIXED: 10.0})
    head = [
        {w: {s: v * 1.5 * math.exp(0.05 * math.sin(2.3 * r)) for s, v in cells.items()} for w, cells in one.items()}
        for r, one in enumerate(base)
    ]
    wall = {"base": base, "head": head}
    first, again, other = (judge_throughput(fresh(), DESCRIBED, base, head, seed=s, wall=wall) for s in (1, 1, 2))
    assert first.ci == again.ci and first.wall.ratio_low == again.wall.ratio_low
    assert first.workloads[0].comparison.ratio_low == again.workloads[0].comparison.ratio_low
    # the pairs' log-ratios are 0.05 * sin(2.3 r) around log 1.5: the median of twelve, and a 95 % interval
    # between the 2nd-3rd and the 10th-11th of them, whichever seed draws the resamples
    d = sorted(0.05 * math.sin(2.3 * r) for r in range(ROUNDS))
    assert first.ratio == pytest.approx(1.5 * math.exp((d[5] + d[6]) / 2))
    assert 1.5 * math.exp(d[1]) <= first.ci[0] <= 1.5 * math.exp(d[3]) < first.ratio
    assert first.ratio < 1.5 * math.exp(d[8]) <= first.ci[1] <= 1.5 * math.exp(d[10])
    assert other.ci == pytest.approx(first.ci, rel=0.01)
    assert first.mark == "+" and first.comparison.p_value == pytest.approx(SEPARATED_P)


def test_a_growing_cost_shows_in_the_exponent_medians_and_their_rank_test():
    r = judge_throughput(fresh(), DESCRIBED, growing(0.0), growing(0.5), seed=1)
    assert r.exponent.base == pytest.approx(0.055) and r.exponent.head == pytest.approx(0.555)
    assert r.exponent.p_value == pytest.approx(SEPARATED_P)
    w = r.workloads[0]
    assert w.exponent.base == pytest.approx(0.055) and w.exponent.head == pytest.approx(0.555)
    assert w.exponent.p_value == pytest.approx(SEPARATED_P)
    assert w.sizes["10"]["ratio"] == pytest.approx(1.0)
    assert w.sizes["1000"]["ratio"] == pytest.approx(10.0)  # every pair: 100**0.5 more at 100x the load
    assert w.sizes["1000"]["head"] == pytest.approx(10e-6 * (100**0.55 + 100**0.56) / 2)  # the median of 12
    assert w.to_dict()["exponent"] == {
        "base": pytest.approx(0.055),
        "head": pytest.approx(0.555),
        "p_value": pytest.approx(SEPARATED_P),
    }


def test_two_sizes_are_enough_for_an_exponent():
    r = judge_throughput(fresh(), DESCRIBED, growing(0.0, (10, 300)), growing(1.0, (10, 300)), seed=1)
    assert r.exponent.base == pytest.approx(0.055) and r.exponent.head == pytest.approx(1.055)
    assert r.exponent.p_value == pytest.approx(SEPARATED_P)
    assert r.workloads[1].exponent.head == pytest.approx(1.055)


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
        "seconds per item, geometric mean of every workload and size: need at least two rounds a side, got 1"
    )


def test_rounds_are_judged_in_pairs_so_both_sides_need_as_many():
    base, head = one_slower()
    with pytest.raises(ValueError) as info:
        judge_throughput(fresh(), DESCRIBED, base, head[:-1], seed=1)
    assert str(info.value) == "rounds are judged in pairs: 12 base rounds against 11 head rounds"


def test_a_consistent_difference_below_the_minimum_effect_is_no_difference():
    for factor, mark in ((1.09, "~"), (1 / 1.09, "~"), (1.11, "+"), (1 / 1.11, "-")):
        base, head = pairs([math.log(factor)] * ROUNDS)
        r = judge_throughput(fresh(), DESCRIBED, base, head, seed=1)
        assert r.comparison.p_value == pytest.approx(SEPARATED_P), factor  # every pair agrees...
        assert r.ratio == pytest.approx(factor) and r.ci == pytest.approx((factor, factor))
        assert r.mark == mark and all(w.mark == mark for w in r.workloads), factor  # ...but 9 % is not enough
    assert judge_throughput(fresh(), DESCRIBED, *pairs([math.log(1.09)] * ROUNDS), seed=1).outcome == "same"


def test_pairs_too_noisy_to_tell_are_unstable_with_their_spread():
    base, head = pairs([0.5 if r % 2 else -0.5 for r in range(ROUNDS)])  # a pair +65 %, the next -39 %
    r = judge_throughput(fresh(), DESCRIBED, base, head, seed=1)
    assert r.ok and r.mark == "?" and r.outcome == "unstable" and not r.fails(1.0)
    assert r.ratio == pytest.approx(1.0) and r.comparison.p_value == 1.0
    assert r.ci == pytest.approx((math.exp(-0.5), math.exp(0.5)))
    assert r.comparison.spread == pytest.approx(math.exp(0.5) - 1)  # sqrt(high / low) - 1
    assert r.to_dict()["outcome"] == "unstable" and r.to_dict()["spread"] == pytest.approx(math.exp(0.5) - 1)
    assert all(w.mark == "?" for w in r.workloads)
    assert r.comparison.describe().startswith("unstable: ratio 1.000 ±64.9% (95% CI 0.607-1.649")


def test_a_spread_at_the_limit_is_still_a_judgement():
    half = math.log(1.25)  # an interval of exactly ±25 %
    r = judge_throughput(fresh(), DESCRIBED, *pairs([half if r % 2 else -half for r in range(ROUNDS)]), seed=1)
    assert r.comparison.spread == pytest.approx(0.25) and r.mark == "~"
    wider = math.log(1.26)
    r = judge_throughput(fresh(), DESCRIBED, *pairs([wider if r % 2 else -wider for r in range(ROUNDS)]), seed=1)
    assert r.mark == "?"


def test_a_large_effect_beyond_the_noise_keeps_its_mark():
    d = [math.log(3.0) + (0.5 if r % 2 else -0.5) for r in range(ROUNDS)]  # every pair slower, by 1.8x to 5x
    r = judge_throughput(fresh(), DESCRIBED, *pairs(d), seed=1)
    assert r.comparison.spread > 0.25 and r.mark == "+" and r.outcome == "slower" and r.fails(2.0)
    assert r.comparison.p_value == pytest.approx(SEPARATED_P)


def test_one_disturbed_pair_moves_neither_the_ratio_nor_the_mark():
    d = [0.01 * (r % 3 - 1) for r in range(ROUNDS)]
    d[4] = math.log(5.0)  # the machine took the core from head in the middle of one round
    r = judge_throughput(fresh(), DESCRIBED, *pairs(d), seed=1)
    assert r.mark == "~" and r.ratio == pytest.approx(1.0, abs=0.011)
    assert r.comparison.spread < 0.05 and r.comparison.p_value > 0.1


def test_a_drift_between_rounds_is_not_a_difference_and_pairs_see_through_it():
    # the machine slows down 4x over the A/B; head 20 % slower in every pair
    base = [{w: {str(s): 10e-6 * 4 ** (r / ROUNDS) for s in SIZES} for w in (VALID, MIXED)} for r in range(ROUNDS)]
    head = [{w: {s: v * 1.20 for s, v in cells.items()} for w, cells in one.items()} for one in base]
    r = judge_throughput(fresh(), DESCRIBED, base, head, seed=1)
    assert r.mark == "+" and r.ratio == pytest.approx(1.20) and r.comparison.p_value == pytest.approx(SEPARATED_P)
    from difflab.stats.compare import mann_whitney_p

    pooled = [one[VALID]["10"] for one in base], [one[VALID]["10"] for one in head]
    assert mann_whitney_p(*pooled) > 0.2  # the sides pooled: the drift hides the 20 %
    same = judge_throughput(fresh(), DESCRIBED, base, [dict(one) for one in base], seed=1)
    assert same.mark == "~" and same.ratio == 1.0 and same.comparison.p_value == 1.0


def test_ten_pairs_are_the_fewest_that_can_be_significant():
    for n, mark in ((9, "~"), (10, "+")):
        r = judge_throughput(fresh(), DESCRIBED, *pairs([math.log(1.5)] * n), seed=1)
        assert r.comparison.p_value == pytest.approx(2 / 2**n) and r.mark == mark, n  # 2/512 > 0.002 > 2/1024


def test_the_signed_rank_p_is_exact_with_ties_and_drops_equal_pairs():
    from difflab.stats.paired import wilcoxon_p

    assert wilcoxon_p([0.0] * 5) == 1.0
    assert wilcoxon_p([0.1] * 10) == pytest.approx(2 / 1024)
    assert wilcoxon_p([0.1] * 10 + [0.0] * 3) == pytest.approx(2 / 1024)  # zeros carry no sign
    assert wilcoxon_p([-0.1] * 10) == pytest.approx(2 / 1024)
    # ranks 1, 2, 3 with one negative of rank 1: W+ = 5 of 6; P(W+ >= 5) = 2/8 -> two-sided 0.5
    assert wilcoxon_p([-0.1, 0.2, 0.3]) == pytest.approx(0.5)
    # |d| tied at mid-rank 1.5: (-1, 1, 2) -> W+ = 1.5 + 3 = 4.5 of 6; sums >= 4.5: 4.5, 4.5, 6 -> 2 * 3/8
    assert wilcoxon_p([-1.0, 1.0, 2.0]) == pytest.approx(0.75)
    assert wilcoxon_p([1.0, -1.0]) == 1.0
