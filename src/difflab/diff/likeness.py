"""Does one source carry a fix? Each probe's observation against the matrix's declared values.

One answer shared by ``backport`` (a fork's ref), ``bisect`` (each commit)
and ``contains`` (each release).

The declared ``expect`` pairs are the reference: a probe is *head-like*
when every expected field has its head (fixed) value and *base-like* when
every one has its base (bug) value (:func:`difflab.diff.classify.classify`).
Controls must hold either way, or the behaviour is not attributable to the
fix. Per fix: ``present`` (every probe head-like), ``absent`` (every probe
base-like), ``partial`` (some each; the report names which), ``error``
(no trustworthy answer: probe error, control off, a field matching neither).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from difflab.diff.classify import Match, classify, controls_hold, field_side
from difflab.matrix.model import Fix, ProbeSpec
from difflab.observation import Observation

VERDICTS = ("present", "absent", "partial", "error")


@dataclass
class FieldCheck:
    """One field observed on the fork, beside what base and head declare."""

    field: str
    kind: str  # "expect" | "control"
    observed: Any
    declared_base: Any
    declared_head: Any
    like: str  # "base" | "head" | "other" | "missing" for expect; "ok" | "off" | "missing" for control


@dataclass
class ProbeComparison:
    """One probe on the fork: which side it behaves like, and why."""

    probe: str
    like: str  # head | base | mixed | other | error | control-drift
    reason: str
    fields: list[FieldCheck]
    observation: Observation | None = None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["observation"] = self.observation.to_dict() if self.observation else None
        return data


@dataclass
class BackportVerdict:
    """The verdict for one fix on one source, its probe comparisons and (for forks) the git evidence."""

    fix: int
    id: str
    part: str | None
    title: str
    verdict: str
    reason: str
    probes: list[ProbeComparison]
    evidence: dict[str, Any] = field(default_factory=dict)
    disagreements: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.verdict == "present"

    def to_dict(self) -> dict[str, Any]:
        return {
            "fix": self.fix,
            "id": self.id,
            "part": self.part,
            "title": self.title,
            "verdict": self.verdict,
            "reason": self.reason,
            "passed": self.passed,
            "head_like": [p.probe for p in self.probes if p.like == "head"],
            "base_like": [p.probe for p in self.probes if p.like == "base"],
            "probes": [p.to_dict() for p in self.probes],
            "evidence": self.evidence,
            "disagreements": self.disagreements,
        }


def _field_checks(spec: ProbeSpec, obs: Observation | None) -> list[FieldCheck]:
    seen = obs.fields if obs is not None and obs.ok else {}
    out = []
    for name, pair in spec.expect.items():
        like = field_side(seen[name], pair) if name in seen else "missing"
        out.append(FieldCheck(name, "expect", seen.get(name), pair[0], pair[1], like))
    off = set(controls_hold(obs, spec))
    for name, value in spec.controls.items():
        like = "missing" if name not in seen else ("off" if name in off else "ok")
        out.append(FieldCheck(name, "control", seen.get(name), value, value, like))
    return out


def compare_probe(spec: ProbeSpec, obs: Observation | None) -> ProbeComparison:
    """Which side the fork's observation of one probe behaves like."""
    checks = _field_checks(spec, obs)
    match = classify(obs, spec)
    if match is Match.ERROR:
        why = (
            "no observation"
            if obs is None
            else ((obs.error or "").strip().splitlines()[-1:] or ["an expected field is missing"])[0]
        )
        return ProbeComparison(spec.name, "error", f"probe error: {why}", checks, obs)
    off = [c.field for c in checks if c.kind == "control" and c.like != "ok"]
    if off:
        return ProbeComparison(
            spec.name, "control-drift", "control field(s) off their declared value: " + ", ".join(off), checks, obs
        )
    like = match.value
    expect = [c for c in checks if c.kind == "expect"]
    if like == "head":
        reason = "every expected field has its head (fixed) value"
    elif like == "base":
        reason = "every expected field has its base (bug) value"
    elif like == "mixed":
        reason = "head-like: {}; base-like: {}".format(
            ", ".join(c.field for c in expect if c.like == "head"),
            ", ".join(c.field for c in expect if c.like == "base"),
        )
    else:
        reason = "matches neither side: " + ", ".join(f"{c.field}={c.observed!r}" for c in expect if c.like == "other")
    return ProbeComparison(spec.name, like, reason, checks, obs)


def judge_backport(fix: Fix, observations: dict[str, Observation]) -> BackportVerdict:
    """present / absent / partial / error for one fix from its probes' observations on one source."""

    def verdict(v: str, reason: str, probes: list[ProbeComparison]) -> BackportVerdict:
        return BackportVerdict(fix.pr, fix.id, fix.part, fix.title, v, reason, probes)

    if not fix.probes:
        return verdict("error", "no probes declared for this fix in the matrix", [])
    probes = [compare_probe(spec, observations.get(spec.name)) for spec in fix.probes]
    untrusted = [p for p in probes if p.like in ("error", "control-drift", "other")]
    if untrusted:
        return verdict("error", "; ".join(f"{p.probe}: {p.reason}" for p in untrusted), probes)
    head = [p.probe for p in probes if p.like == "head"]
    base = [p.probe for p in probes if p.like == "base"]
    mixed = [p.probe for p in probes if p.like == "mixed"]
    if len(head) == len(probes):
        return verdict("present", f"all {len(probes)} probe(s) behave like the fix's head; controls hold", probes)
    if len(base) == len(probes):
        return verdict("absent", f"all {len(probes)} probe(s) behave like the fix's base (the bug)", probes)
    parts = []
    if head:
        parts.append("like head: " + ", ".join(head))
    if base:
        parts.append("like base: " + ", ".join(base))
    if mixed:
        parts.append("mixed within the probe: " + ", ".join(mixed))
    return verdict("partial", "; ".join(parts), probes)
