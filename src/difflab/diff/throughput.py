"""Throughput, base against head: did the fix make its hot path slower, and does the cost grow with load?

Input: each side's rounds, ``rounds[r][workload][size]`` = CPU seconds per item (the median
of that round's runs, :mod:`difflab.probe.bench`). Round ``r`` of base and round ``r`` of
head ran back to back, so they are judged as a pair:

- a workload's round sample is the geometric mean of its sizes; the fix's is the geometric
  mean of every workload and size (a 2x slower cell and a 2x faster one cancel out);
- ratio = the median over pairs of head / base, with its bootstrap interval and the Wilcoxon
  signed-rank p (:mod:`difflab.stats.paired`); ``+`` slower and ``-`` faster need p < 0.002
  (asv's threshold), the interval excluding 1 and a ratio beyond ``1 ± MIN_EFFECT``; a
  measurement that shows none of that with an interval wider than ``± MAX_SPREAD`` is ``?``
  (unstable, the machine too noisy to tell), else ``~``;
- the exponent: per round, the slope of log(time per item) over log(size)
  (:mod:`difflab.stats.scaling`); each side's exponent is the median over its rounds, and
  the per-round pairs of exponents get a signed-rank test of their own.

Informational unless a factor is given: :meth:`ThroughputResult.fails` is a significant
slowdown beyond it.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from difflab.stats.bootstrap import Bootstrap
from difflab.stats.paired import PairedComparison, PairedGate, compare_paired, wilcoxon_p
from difflab.stats.scaling import fit_exponent, geometric_mean

ALPHA = 0.002
"""asv's threshold, here for the Wilcoxon signed-rank test on the paired rounds."""
MIN_EFFECT = 0.10
"""Head against head, two fresh processes running identical code differ by up to 5 % in every
one of ten pairs, and by 7 % in their median ratio (memory layout, hash seeds: the A/A
benchmark, docs/throughput.md): a ratio within 1 ± 10 % is ``~`` however consistent."""
MAX_SPREAD = 0.25
"""An interval wider than ± 25 % cannot tell a 1.25x slowdown from none: ``?`` (unstable)."""
STATUSES = ("ok", "error", "unavailable")

Rounds = list[dict[str, dict[str, float]]]
"""One side: ``rounds[r][workload][str(size)]`` = CPU seconds per item."""


@dataclass
class Scaling:
    """Time per item against load size, per side: medians over rounds and the fitted exponents."""

    base: float
    head: float
    p_value: float

    def to_dict(self) -> dict[str, Any]:
        return {"base": self.base, "head": self.head, "p_value": self.p_value}


@dataclass
class WorkloadResult:
    """One workload (one hot path under load) of one fix."""

    name: str
    unit: str
    what: str
    comparison: PairedComparison
    exponent: Scaling
    sizes: dict[str, dict[str, float]]
    """``str(size)`` -> base and head medians (seconds per item) and the median of the paired ratios."""

    @property
    def mark(self) -> str:
        return self.comparison.mark

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "unit": self.unit,
            "what": self.what,
            "mark": self.mark,
            "outcome": self.comparison.outcome,
            "ratio": self.comparison.ratio,
            "ci": [self.comparison.ratio_low, self.comparison.ratio_high],
            "spread": self.comparison.spread,
            "p_value": self.comparison.p_value,
            "exponent": self.exponent.to_dict(),
            "sizes": self.sizes,
        }


@dataclass
class ThroughputResult:
    """A fix's throughput A/B: the ``throughput`` part of its entry in diff.json."""

    fix: str
    label: str
    status: str
    reason: str = ""
    probe: str | None = None
    base: dict[str, Any] = field(default_factory=dict)
    head: dict[str, Any] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)
    comparison: PairedComparison | None = None
    exponent: Scaling | None = None
    workloads: list[WorkloadResult] = field(default_factory=list)
    samples: dict[str, Rounds] = field(default_factory=dict)
    wall_s: float | None = None
    """What the A/B took, both bench processes started to both ended."""
    cpu_s: float | None = None
    """CPU time the two bench processes spent in their rounds (warm-up included)."""
    wall: PairedComparison | None = None
    """The same A/B in wall-clock time per item (CPU time is what is judged)."""

    @property
    def ok(self) -> bool:
        return self.status == "ok" and self.comparison is not None

    @property
    def mark(self) -> str:
        return self.comparison.mark if self.comparison is not None else "!"

    @property
    def outcome(self) -> str | None:
        """``slower``, ``faster``, ``same`` or ``unstable``; None without a measurement."""
        return self.comparison.outcome if self.comparison is not None else None

    @property
    def ratio(self) -> float | None:
        return self.comparison.ratio if self.comparison is not None else None

    @property
    def ci(self) -> tuple[float, float] | None:
        c = self.comparison
        return (c.ratio_low, c.ratio_high) if c is not None else None

    def fails(self, factor: float | None) -> bool:
        """A significant slowdown beyond ``factor`` (None: informational, never fails)."""
        c = self.comparison
        return factor is not None and c is not None and c.regression and c.ratio > factor

    def to_dict(self) -> dict[str, Any]:
        c = self.comparison
        return {
            "status": self.status,
            "reason": self.reason,
            "probe": self.probe,
            "base": self.base,
            "head": self.head,
            "settings": self.settings,
            "mark": self.mark if c is not None else None,
            "outcome": self.outcome,
            "ratio": self.ratio,
            "ci": list(self.ci) if self.ci else None,
            "spread": c.spread if c is not None else None,
            "confidence": c.confidence if c is not None else None,
            "p_value": c.p_value if c is not None else None,
            "alpha": ALPHA,
            "min_effect": MIN_EFFECT,
            "max_spread": MAX_SPREAD,
            "exponent": self.exponent.to_dict() if self.exponent else None,
            "workloads": [w.to_dict() for w in self.workloads],
            "samples": self.samples,
            "wall_s": self.wall_s,
            "cpu_s": self.cpu_s,
            "wall_clock": (
                {
                    "mark": self.wall.mark,
                    "ratio": self.wall.ratio,
                    "ci": [self.wall.ratio_low, self.wall.ratio_high],
                    "spread": self.wall.spread,
                    "p_value": self.wall.p_value,
                }
                if self.wall is not None
                else None
            ),
        }


def _cell_sizes(rounds: Rounds, workload: str) -> list[int]:
    return sorted(int(s) for s in rounds[0][workload])


def _round_sample(one: dict[str, dict[str, float]], workloads: list[str]) -> float:
    return geometric_mean([one[w][s] for w in workloads for s in one[w]])


def _round_exponent(one: dict[str, dict[str, float]], workloads: list[str], sizes: list[int]) -> float:
    per_size = {n: geometric_mean([one[w][str(n)] for w in workloads]) for n in sizes}
    return fit_exponent(per_size)


def _scaling(base: Rounds, head: Rounds, workloads: list[str], sizes: list[int]) -> Scaling:
    if len(sizes) < 2:
        return Scaling(float("nan"), float("nan"), 1.0)
    b = [_round_exponent(r, workloads, sizes) for r in base]
    h = [_round_exponent(r, workloads, sizes) for r in head]
    return Scaling(statistics.median(b), statistics.median(h), wilcoxon_p([y - x for x, y in zip(b, h, strict=True)]))


def _compare(metric: str, base: Rounds, head: Rounds, workloads: list[str], seed: int) -> PairedComparison:
    return compare_paired(
        metric,
        [_round_sample(r, workloads) for r in base],
        [_round_sample(r, workloads) for r in head],
        gate=PairedGate(alpha=ALPHA, min_effect=MIN_EFFECT, max_spread=MAX_SPREAD),
        bootstrap=Bootstrap(seed=seed),
    )


def judge_throughput(
    result: ThroughputResult,
    described: list[dict[str, str]],
    base: Rounds,
    head: Rounds,
    seed: int,
    wall: dict[str, Rounds] | None = None,
) -> ThroughputResult:
    """Fill ``result`` (status ok) from both sides' rounds; ``described`` lists the probe's workloads.

    ``base[r]`` and ``head[r]`` ran back to back: they are judged as a pair.

    ``base``/``head`` are CPU time per item, what is judged; ``wall`` (per side) the same
    rounds in wall time, compared alongside: a path that started to wait (a lock, a sleep)
    shows there and not in CPU time.
    """
    if not base or not head:
        raise ValueError("no rounds to compare")
    if len(base) != len(head):
        raise ValueError(f"rounds are judged in pairs: {len(base)} base rounds against {len(head)} head rounds")
    names = [w["name"] for w in described]
    missing = [n for n in names if any(n not in r for r in (*base, *head))]
    if missing:
        raise ValueError(f"workload(s) {missing} missing from some round")
    sizes = _cell_sizes(base, names[0])
    result.samples = {"base": base, "head": head}
    result.comparison = _compare("seconds per item, geometric mean of every workload and size", base, head, names, seed)
    result.exponent = _scaling(base, head, names, sizes)
    if wall and wall.get("base") and wall.get("head"):
        result.samples["wall"] = wall  # type: ignore[assignment]
        result.wall = _compare("wall seconds per item, geometric mean", wall["base"], wall["head"], names, seed)
    result.workloads = []
    for w in described:
        name = w["name"]
        per_size = {}
        for n in sizes:
            b = statistics.median(r[name][str(n)] for r in base)
            h = statistics.median(r[name][str(n)] for r in head)
            paired = statistics.median(hr[name][str(n)] / br[name][str(n)] for br, hr in zip(base, head, strict=True))
            per_size[str(n)] = {"base": b, "head": h, "ratio": paired}
        result.workloads.append(
            WorkloadResult(
                name=name,
                unit=w.get("unit", "items"),
                what=w.get("what", ""),
                comparison=_compare(f"{name}: seconds per item, geometric mean of sizes", base, head, [name], seed),
                exponent=_scaling(base, head, [name], sizes),
                sizes=per_size,
            )
        )
    result.status = "ok"
    return result
