"""Per-fix verdicts from base and head observations.

``confirmed``: the base shows the bug, the head the fix, controls equal.
``not-reproduced``: the base does not show the bug (the probe does not
discriminate, or the base already has the fix). ``not-fixed``: the head
still shows the bug. ``control-drift``: something the fix must not change
did change (the diff is not attributable to the fix). ``unavailable``: a
side has no source. ``error``: no trustworthy observation.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from difflab.diff.backends import applicable, as_declared, gaps
from difflab.diff.classify import Match, classify, controls_hold, field_side, same
from difflab.diff.fields import describe_missing, undeclared
from difflab.matrix.model import Fix, ProbeSpec
from difflab.observation import SIDES, Observation

VERDICTS = ("confirmed", "not-fixed", "not-reproduced", "control-drift", "unavailable", "error")


@dataclass
class FieldResult:
    """One field of one probe, on both sides, against what the matrix declares."""

    field: str
    kind: str  # "expect" | "control"
    base: Any
    head: Any
    declared_base: Any
    declared_head: Any
    ok: bool


@dataclass
class ProbeDiff:
    """One probe's base and head observations and its own verdict."""

    probe: str
    verdict: str
    reason: str
    base_match: str
    head_match: str
    fields: list[FieldResult]
    base: Observation | None
    head: Observation | None
    backends: list[str] = field(default_factory=list)
    """Transport back ends judged on both sides; a back end that does not apply on a side is named in ``reason``."""
    undeclared: list[str] = field(default_factory=list)
    """Fields the probe returned that the matrix declares nowhere: observed, never judged."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)  # the observations too, as Observation.to_dict writes them


@dataclass
class FixVerdict:
    """The verdict for one fix (or one part of it)."""

    fix: int
    id: str
    part: str | None
    title: str
    verdict: str
    reason: str
    expected_unavailable: bool
    base: dict[str, Any]
    head: dict[str, Any]
    probes: list[ProbeDiff] = field(default_factory=list)
    upstream_tests: dict[str, Any] | None = None
    """What SGLang's own tests said beside the probes (``upstream-tests.json``), when they were replayed."""

    @property
    def passed(self) -> bool:
        return self.verdict == "confirmed" or (self.verdict == "unavailable" and self.expected_unavailable)

    def to_dict(self) -> dict[str, Any]:
        return {
            "fix": self.fix,
            "id": self.id,
            "part": self.part,
            "title": self.title,
            "verdict": self.verdict,
            "reason": self.reason,
            "passed": self.passed,
            "expected_unavailable": self.expected_unavailable,
            "base": self.base,
            "head": self.head,
            "probes": [p.to_dict() for p in self.probes],
        } | ({"upstream_tests": self.upstream_tests} if self.upstream_tests is not None else {})


def _fields(spec: ProbeSpec, base: Observation | None, head: Observation | None) -> list[FieldResult]:
    if base is not None and base.status == "unavailable":
        return _head_fields(spec, head)
    bf = base.fields if base and base.ok else {}
    hf = head.fields if head and head.ok else {}
    out = []
    for name, (db, dh) in spec.expect.items():
        b, h = bf.get(name), hf.get(name)
        ok = same(b, db) and (head is None or not head.ok or same(h, dh))
        out.append(FieldResult(name, "expect", b, h, db, dh, ok))
    for name, dv in spec.controls.items():
        b, h = bf.get(name), hf.get(name)
        ok = same(b, dv) and (head is None or not head.ok or same(h, dv))
        out.append(FieldResult(name, "control", b, h, dv, dv, ok))
    return out


def _head_fields(spec: ProbeSpec, head: Observation | None) -> list[FieldResult]:
    """A base with no source (a fix older than every pin): each field is judged on the head alone."""
    hf = head.fields if head and head.ok else {}
    out = [
        FieldResult(n, "expect", None, hf.get(n), db, dh, same(hf.get(n), dh)) for n, (db, dh) in spec.expect.items()
    ]
    out += [FieldResult(n, "control", None, hf.get(n), dv, dv, same(hf.get(n), dv)) for n, dv in spec.controls.items()]
    return out


def judge_probe(spec: ProbeSpec, base: Observation | None, head: Observation | None) -> ProbeDiff:
    """Verdict for one probe. ``head`` may be unavailable (status ``unavailable``).

    A transport back end that does not apply on either side (the source lacks it, or its
    machinery) is left out of the comparison and named in the reason.
    """
    base, head = as_declared(spec, base), as_declared(spec, head)
    ignored = undeclared(spec, (base, head))
    skipped = {f"{b} on base": r for b, r in gaps(base, spec).items()}
    skipped |= {f"{b} on head": r for b, r in gaps(head, spec).items()}
    if skipped:
        spec = applicable(spec, {key.split(" ", 1)[0] for key in skipped})
        diff = _judge_probe(spec, base, head)
        if not spec.expect:
            diff.verdict = "error"
            diff.reason = "no back end applies"
        diff.reason += "; not applicable: " + "; ".join(f"{k} ({r})" for k, r in skipped.items())
    else:
        diff = _judge_probe(spec, base, head)
    diff.backends = list(spec.backends)
    diff.undeclared = ignored
    return diff


def _judge_probe(spec: ProbeSpec, base: Observation | None, head: Observation | None) -> ProbeDiff:
    bm = classify(base, spec)
    head_unavailable = head is not None and head.status == "unavailable"
    hm = Match.ERROR if head_unavailable else classify(head, spec)
    fields = _fields(spec, base, head)

    def done(verdict: str, reason: str) -> ProbeDiff:
        return ProbeDiff(spec.name, verdict, reason, bm.value, hm.value, fields, base, head)

    one_side = _one_side_unavailable(spec, base, head, bm, hm)
    if one_side:
        return done(*one_side)
    if hm is Match.ERROR:
        return done("error", f"head: {_why(head, spec)}")
    never = describe_missing(spec, base, head)
    if never:  # a control the probe never returns is a misspelling, not drift
        return done("error", never)
    drift = sorted(set(controls_hold(base, spec)) | set(controls_hold(head, spec)))
    if drift:
        return done("control-drift", "control field(s) changed or off their declared value: " + ", ".join(drift))
    if bm is not Match.BASE:
        return done("not-reproduced", f"base does not show the bug: {_mismatch(spec, base, 0)}")
    if hm is not Match.HEAD:
        return done("not-fixed", f"head does not show the fix: {_mismatch(spec, head, 1)}")
    return done("confirmed", "base shows the bug, head the fix, controls equal")


def _one_side_unavailable(
    spec: ProbeSpec, base: Observation | None, head: Observation | None, bm: Match, hm: Match
) -> tuple[str, str] | None:
    """The verdict when a side cannot be compared: no source (a fix in no release yet, or older than
    every pin; the other side is still judged and said, so ``unavailable`` never hides a crashed
    probe), or a base that errored. None: both sides are there to compare."""
    if base is not None and base.status == "unavailable":
        if hm is Match.ERROR:
            return "error", f"head: {_why(head, spec)}"
        shown = "shows the fix" if hm is Match.HEAD else f"does not show the fix ({hm.value})"
        return "unavailable", f"base unavailable: {base.error}; head {shown}"
    if bm is Match.ERROR:
        return "error", f"base: {_why(base, spec)}"
    if head is not None and head.status == "unavailable":
        shown = "shows the bug" if bm is Match.BASE else f"does not show the bug ({bm.value})"
        return "unavailable", f"head unavailable: {head.error}; base {shown}"
    return None


def _declared_unavailable(fix: Fix, base: dict[str, Observation], head: dict[str, Observation]) -> bool:
    """Whether the matrix declares a side unavailable, and every side the observations lack is one it declares.

    An ``unavailable`` verdict passes only then: a head with no source passes for a fix in no release yet,
    a base with none for a fix older than every pin, never the other way round (a side the matrix pins
    that came back without a source is a broken run, not the declared gap).
    """
    declared = {side for side in SIDES if getattr(fix, side).unavailable}
    observed = {"base": base, "head": head}
    lacking = {side for side in SIDES if any(o.status == "unavailable" for o in observed[side].values())}
    return bool(declared) and lacking <= declared


_PRECEDENCE = ("error", "control-drift", "not-reproduced", "not-fixed", "unavailable", "confirmed")


def judge_fix(
    fix: Fix,
    base: dict[str, Observation],
    head: dict[str, Observation],
    base_label: dict[str, Any],
    head_label: dict[str, Any],
) -> FixVerdict:
    """Verdict for a fix from its probes' observations (keyed by probe name)."""

    def verdict(v: str, reason: str, probes: list[ProbeDiff]) -> FixVerdict:
        return FixVerdict(
            fix=fix.pr,
            id=fix.id,
            part=fix.part,
            title=fix.title,
            verdict=v,
            reason=reason,
            expected_unavailable=_declared_unavailable(fix, base, head),
            base=base_label,
            head=head_label,
            probes=probes,
        )

    if not fix.probes and fix.base.unavailable:
        return verdict("unavailable", f"base unavailable: {fix.base.unavailable}; no probe judges it by behaviour", [])
    if not fix.probes:
        return verdict("error", "no probes declared for this fix in the matrix yet", [])
    diffs = [judge_probe(spec, base.get(spec.name), head.get(spec.name)) for spec in fix.probes]
    if not base and not head:
        return verdict("error", "no observation of this fix on either side (base and head missing)", diffs)
    worst = min(diffs, key=lambda d: _PRECEDENCE.index(d.verdict))
    if worst.verdict == "confirmed":
        judged = list(dict.fromkeys(b for d in diffs for b in d.backends))
        on = f" on {', '.join(judged)}" if judged else ""
        skipped = [d.reason.split("; not applicable: ", 1)[1] for d in diffs if "; not applicable: " in d.reason]
        off = f"; not applicable: {'; '.join(skipped)}" if skipped else ""
        return verdict(
            "confirmed", f"{len(diffs)} probe(s): base shows the bug, head the fix, controls equal{on}{off}", diffs
        )
    others = [d for d in diffs if d.verdict == worst.verdict]
    reason = "; ".join(f"{d.probe}: {d.reason}" for d in others)
    return verdict(worst.verdict, reason, diffs)


def judge_all(
    fixes: list[Fix], observations: list[Observation], labels: dict[tuple[str, str], dict[str, Any]]
) -> list[FixVerdict]:
    """Verdict per fix from a flat list of observations (from one run or merged CI cells)."""
    by_key = {(o.fix, o.side, o.probe): o for o in observations}
    verdicts = []
    for fix in fixes:
        per_side = {
            side: {s.name: by_key[(fix.id, side, s.name)] for s in fix.probes if (fix.id, side, s.name) in by_key}
            for side in SIDES
        }
        missing = {"label": "missing"}
        base, head = labels.get((fix.id, "base"), missing), labels.get((fix.id, "head"), missing)
        verdicts.append(judge_fix(fix, per_side["base"], per_side["head"], base, head))
    return verdicts


def _why(obs: Observation | None, spec: ProbeSpec) -> str:
    if obs is None:
        return "no observation"
    if obs.status == "ok":
        return describe_missing(spec, obs) or "an expected field is missing from the observation"
    first = (obs.error or "unknown error").strip().splitlines()
    return first[-1] if first else "unknown error"


def _mismatch(spec: ProbeSpec, obs: Observation | None, index: int) -> str:
    assert obs is not None
    parts = []
    for name, pair in spec.expect.items():
        value = obs.fields.get(name)
        if field_side(value, pair) != ("base", "head")[index]:
            parts.append(f"{name}={value!r} (expected {pair[index]!r})")
    return ", ".join(parts) or "no difference"
