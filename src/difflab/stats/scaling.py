"""How time per item grows with the load: the exponent ``k`` of ``time per item ~ size**k``.

A step that stays O(1) per item fits ``k ≈ 0`` (slightly negative when a fixed cost per
batch is spread over more items); a step that scans what is held (an O(n) scan per item)
pushes ``k`` towards 1. The fit is least squares on ``log(time)`` against ``log(size)``
(numpy, the ``[stats]`` extra), one fit per round, so the exponent has per-round samples
that :mod:`difflab.stats.compare` can test like any other metric.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from difflab.extras import require


def fit_exponent(per_size: Mapping[int, float]) -> float:
    """Slope of ``log(seconds per item)`` over ``log(size)``; needs two sizes and positive times."""
    np = require("numpy", "the growth exponent (a least-squares fit)")

    sizes = sorted(per_size)
    if len(sizes) < 2:
        raise ValueError(f"an exponent needs at least two sizes, got {sizes}")
    times = [per_size[n] for n in sizes]
    if min(sizes) <= 0 or min(times) <= 0:
        raise ValueError("sizes and times must be positive")
    slope, _ = np.polyfit(np.log(sizes), np.log(times), 1)
    return float(slope)


def geometric_mean(values: Sequence[float]) -> float:
    """The mean that treats a 2x faster cell and a 2x slower cell as cancelling out."""
    if not values or min(values) <= 0:
        raise ValueError("a geometric mean needs positive values")
    return math.exp(sum(math.log(v) for v in values) / len(values))
