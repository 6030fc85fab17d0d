"""Throughput A/B: base and head benchmarked in interleaved rounds (A B A B ...).

Interleaving spreads slow drifts (thermal, clocks, a noisy neighbour) over both
sides instead of charging them to whichever side ran last. Each round is one
sample per metric; :mod:`difflab.stats.compare` compares the samples.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from difflab.errors import DifflabError
from difflab.gpu.bench import AB_METRICS, BenchResult
from difflab.observation import SIDES
from difflab.stats.bootstrap import Bootstrap
from difflab.stats.compare import Comparison, compare

THROUGHPUT = "gpu_throughput_ab"
"""The A/B's name where a probe's would stand (observations, verdicts)."""


class SideLoad(Protocol):
    def bench(self, round_index: int, output_file: Path) -> BenchResult: ...


@dataclass
class RoundResult:
    round: int
    side: str
    file: str
    values: dict[str, float] = field(default_factory=dict)
    error: str | None = None


@dataclass
class ABResult:
    rounds: list[RoundResult]
    comparisons: dict[str, Comparison]
    error: str | None = None

    def samples(self, side: str, metric: str) -> list[float]:
        return [r.values[metric] for r in self.rounds if r.side == side and r.error is None and metric in r.values]

    @property
    def regressions(self) -> list[str]:
        return [m for m, c in self.comparisons.items() if c.regression]

    def to_dict(self) -> dict[str, Any]:
        return {
            "order": "interleaved " + " ".join(r.side[0].upper() for r in self.rounds),
            "rounds": [r.__dict__ for r in self.rounds],
            "comparisons": {m: c.to_dict() for m, c in self.comparisons.items()},
            "regressions": self.regressions,
            "error": self.error,
        }

    def side_fields(self, side: str) -> dict[str, Any]:
        """Observation fields for one side: its own samples, and the pairwise judgement."""
        fields: dict[str, Any] = {
            "throughput.rounds_ok": sum(1 for r in self.rounds if r.side == side and r.error is None),
            "throughput.no_significant_regression": self.error is None
            and bool(self.comparisons)
            and not self.regressions,
            "throughput.regressions": self.regressions,
        }
        for metric in AB_METRICS:
            fields[f"throughput.{metric}"] = [round(v, 4) for v in self.samples(side, metric)]
        return fields


def run_ab(sides: dict[str, SideLoad], rounds: int, out_dir: Path, seed: int) -> ABResult:
    """``rounds`` rounds of base then head; a failed round is recorded, never retried silently."""
    out_dir.mkdir(parents=True, exist_ok=True)
    results: list[RoundResult] = []
    for r in range(rounds):
        for side in SIDES:
            path = out_dir / f"{side}-round{r}.jsonl"
            rec = RoundResult(round=r, side=side, file=path.name)
            try:
                rec.values = dict(sides[side].bench(r, path).values)
            except DifflabError as exc:
                rec.error = str(exc)
            results.append(rec)
    ab = ABResult(rounds=results, comparisons={})
    try:
        for metric, higher in AB_METRICS.items():
            ab.comparisons[metric] = compare(
                metric,
                ab.samples("base", metric),
                ab.samples("head", metric),
                higher_is_better=higher,
                bootstrap=Bootstrap(seed=seed),
            )
    except ValueError as exc:
        ab.comparisons = {}
        failed = [f"{x.side} round {x.round}: {x.error}" for x in results if x.error]
        ab.error = f"not enough successful rounds to compare ({exc})" + (f"; {'; '.join(failed[:4])}" if failed else "")
    return ab
