"""Prometheus text exposition format (version 0.0.4), parsed into plain samples.

Written here rather than taken from ``prometheus_client`` because that package is
not a lab dependency; the format is small: ``# HELP``/``# TYPE`` comments and
``name{label="value",...} value [timestamp]`` lines.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}


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


def _parse_labels(text: str, pos: int, lineno: int) -> tuple[tuple[tuple[str, str], ...], int]:
    """Parse ``{a="b",...}`` starting at ``text[pos] == '{'``; return labels and the index after ``}``."""
    labels: list[tuple[str, str]] = []
    pos += 1
    while True:
        while pos < len(text) and text[pos] in " \t":
            pos += 1
        if pos < len(text) and text[pos] == "}":
            return tuple(sorted(labels)), pos + 1
        m = _LABEL_NAME.match(text, pos)
        if not m:
            raise MetricsParseError(f"line {lineno}: bad label name at column {pos + 1}")
        key = m.group(0)
        pos = m.end()
        if text[pos : pos + 2] != '="':
            raise MetricsParseError(f"line {lineno}: expected '=\"' after label {key!r}")
        pos += 2
        value = []
        while True:
            if pos >= len(text):
                raise MetricsParseError(f"line {lineno}: unterminated value of label {key!r}")
            ch = text[pos]
            if ch == "\\":
                nxt = text[pos + 1 : pos + 2]
                if nxt not in _ESCAPES:
                    raise MetricsParseError(f"line {lineno}: bad escape in label {key!r}")
                value.append(_ESCAPES[nxt])
                pos += 2
                continue
            if ch == '"':
                pos += 1
                break
            value.append(ch)
            pos += 1
        labels.append((key, "".join(value)))
        while pos < len(text) and text[pos] in " \t":
            pos += 1
        if pos < len(text) and text[pos] == ",":
            pos += 1
        elif pos < len(text) and text[pos] == "}":
            continue
        else:
            raise MetricsParseError(f"line {lineno}: expected ',' or '}}' after label {key!r}")


def _parse_value(token: str, lineno: int) -> float:
    try:
        return float(token)  # accepts NaN, +Inf, -Inf as the format spells them
    except ValueError:
        raise MetricsParseError(f"line {lineno}: bad sample value {token!r}") from None


def parse(text: str) -> MetricSet:
    """Parse one scrape. Raises :class:`MetricsParseError` naming the first bad line."""
    out = MetricSet()
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            parts = line[1:].split(None, 3)
            if len(parts) >= 3 and parts[0] == "TYPE":
                out.types[parts[1]] = parts[2]
            continue
        m = _NAME.match(line)
        if not m:
            raise MetricsParseError(f"line {lineno}: bad metric name in {line[:60]!r}")
        name, pos = m.group(0), m.end()
        labels: tuple[tuple[str, str], ...] = ()
        if pos < len(line) and line[pos] == "{":
            labels, pos = _parse_labels(line, pos, lineno)
        rest = line[pos:].split()
        if not rest or len(rest) > 2:
            raise MetricsParseError(f"line {lineno}: expected 'value [timestamp]' after {name}")
        out.samples.append(Sample(name, labels, _parse_value(rest[0], lineno)))
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
