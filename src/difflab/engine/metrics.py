"""Prometheus metrics of an engine's ``/metrics``, as plain samples; parsed by ``prometheus_client``.

SGLang exposes its metrics with ``prometheus_client``, so the same library's parser reads them
(text format 0.0.4: ``# HELP``/``# TYPE`` lines, escapes, ``NaN``/``+Inf``, timestamps); it comes
with the ``gpu`` extra and is imported only when a scrape is parsed. :func:`render_sample` is the
test server's writer of single lines and needs nothing beyond the standard library.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from types import ModuleType

from difflab.extras import require

PURPOSE = "reading the engines' Prometheus metrics (/metrics)"


class MetricsParseError(ValueError):
    """The text is not valid exposition format; the message names the line."""


@dataclass(frozen=True)
class Sample:
    """One exposed series value."""

    name: str
    labels: tuple[tuple[str, str], ...]
    value: float

    def label(self, key: str) -> str | None:
        return dict(self.labels).get(key)

    def matches(self, match: dict[str, str]) -> bool:
        own = dict(self.labels)
        return all(own.get(k) == v for k, v in match.items())


@dataclass
class MetricSet:
    """All samples of one scrape, with the declared metric types."""

    samples: list[Sample] = field(default_factory=list)
    types: dict[str, str] = field(default_factory=dict)

    def find(self, name: str, **match: str) -> list[Sample]:
        return [s for s in self.samples if s.name == name and s.matches(match)]

    def has(self, name: str) -> bool:
        return any(s.name == name for s in self.samples)

    def total(self, name: str, **match: str) -> float | None:
        """Sum over matching series (counters, per-rank usage); ``None`` when none is exposed."""
        found = self.find(name, **match)
        return sum(s.value for s in found) if found else None

    def minimum(self, name: str, **match: str) -> float | None:
        """Smallest value over matching series (per-rank capacities: the weakest rank decides)."""
        found = [s.value for s in self.find(name, **match) if not math.isnan(s.value)]
        return min(found) if found else None

    def by_label(self, name: str, label: str, **match: str) -> dict[str, float]:
        """Values summed per value of ``label`` (e.g. counts per ``outcome``)."""
        out: dict[str, float] = {}
        for s in self.find(name, **match):
            key = s.label(label)
            if key is not None:
                out[key] = out.get(key, 0.0) + s.value
        return out

    def names(self) -> set[str]:
        return {s.name for s in self.samples}


def _parser() -> ModuleType:
    return require("prometheus_client.parser", PURPOSE)


def _where(parser: ModuleType, text: str) -> str:
    """The first line the parser refuses on its own, as ``line N: ... in '...'`` (empty when none alone is bad)."""
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        try:
            list(parser.text_string_to_metric_families(line + "\n"))
        except (ValueError, IndexError, KeyError, TypeError) as exc:
            return f"line {lineno}: {exc} in {line[:80]!r}"
    return ""


def parse(text: str) -> MetricSet:
    """Parse one scrape. Raises :class:`MetricsParseError` naming the first bad line."""
    parser = _parser()
    out = MetricSet()
    try:
        for family in parser.text_string_to_metric_families(text):
            if family.type != "unknown":
                out.types[family.name] = family.type
            for s in family.samples:
                out.samples.append(Sample(s.name, tuple(sorted(s.labels.items())), float(s.value)))
    except (ValueError, IndexError, KeyError, TypeError) as exc:
        raise MetricsParseError(_where(parser, text) or f"not Prometheus text format: {exc}") from None
    return out


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render_sample(name: str, labels: Iterable[tuple[str, str]], value: float) -> str:
    """One exposition line (used by the test server; escaping per the format)."""
    body = ",".join(f'{k}="{_escape(v)}"' for k, v in labels)
    if math.isnan(value):
        shown = "NaN"
    elif math.isinf(value):
        shown = "+Inf" if value > 0 else "-Inf"
    else:
        shown = repr(float(value))
    return f"{name}{{{body}}} {shown}" if body else f"{name} {shown}"
