"""How a bootstrap interval is drawn: the resample count, the confidence and the seed travel together.

A fixed seed makes an interval a function of its samples: the same rounds give the same
interval, so a judgement repeats exactly when a result folder is judged again.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_SEED = 20261026
DEFAULT_RESAMPLES = 10_000
DEFAULT_CONFIDENCE = 0.95


@dataclass(frozen=True)
class Bootstrap:
    """The settings of one bootstrap interval."""

    resamples: int = DEFAULT_RESAMPLES
    confidence: float = DEFAULT_CONFIDENCE
    seed: int = DEFAULT_SEED
