"""Base against head from interleaved rounds, judged pair by pair: robust to a drifting, contended machine.

Round ``r`` of base and round ``r`` of head ran one right after the other (the order turns
about every round), so whatever the machine did at that moment -- another job started, the
clock changed -- weighs on both samples of the pair. Each pair gives one log-ratio
``d_r = log(head_r / base_r)``; comparing two sides' pooled samples instead (Mann-Whitney)
lets a drift between rounds pass for a difference between the sides.

- ratio: ``exp(median(d))`` -- one disturbed pair moves a median, not a mean, a little;
- interval: percentile bootstrap of that median over resampled pairs (fixed seed);
- p: the exact two-sided Wilcoxon signed-rank test on ``d`` (ten pairs is the fewest with
  which p can be below asv's 0.002: 2 / 2**10);
- spread: the interval's half-width, ``sqrt(high / low) - 1``: how large a difference this
  measurement could miss.

The outcome (:attr:`PairedComparison.outcome`): ``slower``/``faster`` when the test, the
interval and a minimum effect all agree; ``unstable`` when not, and the interval is wider
than the widest spread that still says anything; else ``same``. The minimum effect is the
floor below which two processes running identical code already differ (memory layout,
hash seeds): a difference that small is never attributed to the code.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from difflab.extras import require
from difflab.stats.bootstrap import Bootstrap


@dataclass(frozen=True)
class PairedGate:
    """When a paired comparison is a change: the rank test's ``alpha``, the smallest ratio that counts
    (``1 ± min_effect``), and the widest interval that still says "no change" (``± max_spread``)."""

    alpha: float
    min_effect: float
    max_spread: float


MARKS = {"slower": "+", "faster": "-", "same": "~", "unstable": "?"}
"""asv's marks, and ``?`` for a measurement too noisy to give one."""


@dataclass(frozen=True)
class PairedComparison:
    """One metric (lower is better: time per item), base against head, pair by pair."""

    metric: str
    base: tuple[float, ...]
    head: tuple[float, ...]
    ratio: float
    """``exp(median(log(head_r / base_r)))``: > 1 head slower."""
    ratio_low: float
    ratio_high: float
    confidence: float
    p_value: float
    """Wilcoxon signed-rank on the paired log-ratios, exact and two-sided."""
    alpha: float
    min_effect: float
    """A ratio within ``1 ± min_effect`` is ``same`` however significant."""
    max_spread: float
    """Beyond this half-width of the interval a measurement that shows no difference is ``unstable``."""

    @property
    def spread(self) -> float:
        """Half-width of the interval, relative: ``sqrt(high / low) - 1``."""
        return math.sqrt(self.ratio_high / self.ratio_low) - 1.0

    @property
    def significant(self) -> bool:
        """The rank test below alpha, the interval excluding 1, and the ratio beyond the minimum effect."""
        excludes_one = self.ratio_low > 1.0 or self.ratio_high < 1.0
        large = abs(math.log(self.ratio)) >= math.log1p(self.min_effect)
        return self.p_value < self.alpha and excludes_one and large

    @property
    def outcome(self) -> str:
        if self.significant:
            return "slower" if self.ratio > 1.0 else "faster"
        return "unstable" if self.spread > self.max_spread else "same"

    @property
    def mark(self) -> str:
        return MARKS[self.outcome]

    @property
    def regression(self) -> bool:
        """Significantly slower (time per item: higher is worse)."""
        return self.outcome == "slower"

    def describe(self) -> str:
        ci = f"{self.confidence:.0%} CI {self.ratio_low:.3f}-{self.ratio_high:.3f}"
        tail = f"{ci}, Wilcoxon p={self.p_value:.3g}"
        if self.outcome == "unstable":
            return f"unstable: ratio {self.ratio:.3f} ±{self.spread:.1%} ({tail}; too noisy to tell)"
        if self.outcome == "same":
            return f"no significant difference (ratio {self.ratio:.3f}, {tail})"
        return f"head {self.outcome}: ratio {self.ratio:.3f} ({tail})"

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(spread=self.spread, outcome=self.outcome, mark=self.mark, summary=self.describe())
        return data


def _log_ratios(metric: str, base: Sequence[float], head: Sequence[float]) -> list[float]:
    if len(base) != len(head):
        raise ValueError(f"{metric}: paired rounds need as many base as head samples ({len(base)} vs {len(head)})")
    if len(base) < 2:
        raise ValueError(f"{metric}: need at least two rounds a side, got {len(base)}")
    values = [*base, *head]
    if not all(math.isfinite(v) and v > 0 for v in values):
        raise ValueError(f"{metric}: samples must be positive finite numbers")
    return [math.log(h) - math.log(b) for b, h in zip(base, head, strict=True)]


def bootstrap_median_ci(d: Sequence[float], *, resamples: int, confidence: float, seed: int) -> tuple[float, float]:
    """Percentile bootstrap interval of ``median(d)`` over resampled pairs."""
    np = require("numpy", "the A/B statistics (bootstrap intervals)")
    arr = np.asarray(d, dtype=float)
    rng = np.random.default_rng(seed)
    medians = np.median(arr[rng.integers(0, arr.size, size=(resamples, arr.size))], axis=1)
    tail = (1.0 - confidence) / 2.0 * 100.0
    low, high = np.percentile(medians, [tail, 100.0 - tail])
    return float(low), float(high)


def _midranks(values: Sequence[float]) -> list[float]:
    """Ranks 1..n of ``values``, tied values sharing the mean of their ranks."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2.0 + 1.0
        i = j + 1
    return ranks


def wilcoxon_p(d: Sequence[float]) -> float:
    """Exact two-sided Wilcoxon signed-rank p of ``d`` against 0 (zeros dropped, ties at mid-ranks).

    Exact by counting: under no difference each pair's sign is a coin toss, so the sum of the
    positive pairs' ranks has the distribution of a random subset's rank sum (ranks doubled to
    whole numbers, counted by dynamic programming: exact with ties too, where scipy falls back
    to a normal approximation). Every pair equal: 1.
    """
    nonzero = [x for x in d if x != 0.0]
    if not nonzero:
        return 1.0
    ranks = [round(2 * r) for r in _midranks([abs(x) for x in nonzero])]
    ways = [1] + [0] * sum(ranks)  # ways[s]: subsets whose doubled rank sum is s
    for r in ranks:
        for total in range(len(ways) - 1, r - 1, -1):
            ways[total] += ways[total - r]
    observed = sum(r for r, x in zip(ranks, nonzero, strict=True) if x > 0)
    below, above = sum(ways[: observed + 1]), sum(ways[observed:])
    return min(1.0, 2 * min(below, above) / 2 ** len(nonzero))


def compare_paired(
    metric: str, base: Sequence[float], head: Sequence[float], *, gate: PairedGate, bootstrap: Bootstrap | None = None
) -> PairedComparison:
    """Judge ``head[r]`` against ``base[r]`` pair by pair (the same seed gives the same interval)."""
    settings = bootstrap or Bootstrap()
    resamples, confidence, seed = settings.resamples, settings.confidence, settings.seed
    d = _log_ratios(metric, base, head)
    low, high = bootstrap_median_ci(d, resamples=resamples, confidence=confidence, seed=seed)
    return PairedComparison(
        metric=metric,
        base=tuple(float(x) for x in base),
        head=tuple(float(x) for x in head),
        ratio=math.exp(statistics.median(d)),
        ratio_low=math.exp(low),
        ratio_high=math.exp(high),
        confidence=confidence,
        p_value=wilcoxon_p(d),
        alpha=gate.alpha,
        min_effect=gate.min_effect,
        max_spread=gate.max_spread,
    )
