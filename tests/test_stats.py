"""The A/B statistics on synthetic samples with known answers."""

from __future__ import annotations

import numpy as np
import pytest

from difflab.stats.bootstrap import Bootstrap
from difflab.stats.compare import bootstrap_rel_diff_ci, compare, mann_whitney_p


def samples(seed: int, mean: float, n: int = 30, sd: float = 2.0) -> np.ndarray:
    return np.random.default_rng(seed).normal(mean, sd, n)


def test_identical_distributions_ci_spans_zero():
    c = compare("request_throughput", samples(1, 100), samples(2, 100), higher_is_better=True)
    assert c.ci_low < 0 < c.ci_high
    assert not c.significant and not c.regression
    assert c.describe().startswith("no significant difference")


def test_ten_percent_shift_is_detected_with_the_right_direction():
    base, head = samples(3, 100), samples(4, 110)
    thr = compare("output_throughput", base, head, higher_is_better=True)
    assert thr.significant and not thr.regression  # more throughput: better
    assert 0.07 < thr.ci_low < 0.10 < thr.ci_high < 0.13
    assert thr.p_value < 1e-6
    lat = compare("median_itl_ms", base, head, higher_is_better=False)
    assert lat.significant and lat.regression  # more latency: worse
    assert "worse" in lat.describe()


def test_known_mann_whitney_p_values():
    # Complete separation, exact two-sided test: 2 / C(6,3) and 2 / C(10,5).
    assert mann_whitney_p([1, 2, 3], [4, 5, 6]) == pytest.approx(0.1)
    assert mann_whitney_p([1, 2, 3, 4, 5], [6, 7, 8, 9, 10]) == pytest.approx(2 / 252)
    assert mann_whitney_p([1, 1, 1], [1, 1, 1]) == 1.0  # every value tied


def test_fixed_seed_gives_the_same_interval():
    a, b = samples(5, 50), samples(6, 51)
    assert bootstrap_rel_diff_ci(a, b, seed=11) == bootstrap_rel_diff_ci(a, b, seed=11)
    assert bootstrap_rel_diff_ci(a, b, seed=11) != bootstrap_rel_diff_ci(a, b, seed=12)


def test_three_rounds_can_never_be_significant():
    """Min two-sided Mann-Whitney p with 3 vs 3 is 0.1: the rank test must agree with the interval."""
    c = compare("request_throughput", [100, 101, 102], [150, 151, 152], higher_is_better=True)
    assert c.ci_excludes_zero and not c.significant


def test_false_positive_rate_stays_near_nominal_with_few_rounds():
    rng = np.random.default_rng(7)
    flagged = 0
    trials = 120
    for t in range(trials):
        a, b = rng.normal(100, 3, 5), rng.normal(100, 3, 5)
        flagged += compare("m", a, b, higher_is_better=True, bootstrap=Bootstrap(resamples=2000, seed=t)).significant
    assert flagged / trials <= 0.08


@pytest.mark.parametrize(
    "base, head, message",
    [
        ([1.0], [1.0, 2.0], "at least two samples"),
        ([1.0, float("nan")], [1.0, 2.0], "finite"),
        ([0.0, 1.0], [1.0, 2.0], "positive base"),
    ],
)
def test_bad_samples_are_refused(base, head, message):
    with pytest.raises(ValueError, match=message):
        compare("m", base, head, higher_is_better=True)
