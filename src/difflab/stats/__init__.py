"""The statistics both throughput tiers use: GPU serving A/B (``difflab gpu``) and CPU hot paths (``run --throughput``).

- :mod:`difflab.stats.compare`: one metric's per-round samples, base against head: bootstrap
  interval of the ratio, Mann-Whitney U, the asv mark;
- :mod:`difflab.stats.paired`: interleaved rounds judged pair by pair (the CPU tier): median
  paired ratio, its bootstrap interval, the exact Wilcoxon signed-rank p, a minimum effect and
  an ``unstable`` outcome;
- :mod:`difflab.stats.scaling`: how time per item grows with the load (a fitted exponent).

numpy and scipy are the optional ``[stats]`` extra, imported where they are used, so the rest
of the lab runs without them; :func:`require` turns their absence into a clear exit-2 message.
"""

from __future__ import annotations

import importlib.util

from difflab.errors import ConfigError

EXTRA = "pip install 'sglang-difflab[stats]'"
PACKAGES = ("numpy", "scipy")


def missing() -> list[str]:
    """The statistics packages this interpreter cannot import."""
    out = []
    for name in PACKAGES:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):  # a broken or blocked package
            found = False
        if not found:
            out.append(name)
    return out


def require(what: str) -> None:
    """Raise :class:`ConfigError` (exit 2) naming the extra if numpy or scipy is missing."""
    absent = missing()
    if absent:
        raise ConfigError(f"{what} needs {' and '.join(absent)} (the [stats] extra): {EXTRA}")
