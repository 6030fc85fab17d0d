"""Judging a reverting mutation: did undoing only the fix's lines bring back the base behaviour?

A mutation is *causal* when every targeted field returns to the base value while every control
holds, and (for a mutation that reverts named hunks) every other path of the fix keeps its head
behaviour. Anything else says which of those failed: ``insensitive`` (a targeted field did not
move), ``entangled`` (other paths moved too), ``error`` (no trustworthy observation, or a control
moved: the mutation reverts more than the fix). ``mutation-stale`` is decided before any probe
runs (the text to revert is not in the head).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from difflab.diff.backends import applicable, as_declared, gaps
from difflab.diff.classify import Match, classify, controls_hold, field_side
from difflab.matrix.model import Fix, Hunk, Mutation, ProbeSpec
from difflab.observation import Observation

OUTCOMES = ("causal", "insensitive", "entangled", "mutation-stale", "error")
HEAD_UNAVAILABLE = "head unavailable"
NO_PROBE = "base unavailable and no probe"
"""A fix older than every pinned release that no probe judges: no probe for a mutation to flip."""


def revertible(fix: Fix) -> bool:
    """Whether a reverting mutation has a probe to flip (a probe-less fix older than every pin has none)."""
    return bool(fix.probes) or not fix.base.unavailable


@dataclass
class MutationResult:
    """What one reverting mutation did to the fix's probes."""

    fix: str
    mutation: str
    file: str
    head: str
    outcome: str
    reason: str
    probes: dict[str, str] = field(default_factory=dict)  # probe -> classification under the mutation
    observations: list[dict[str, Any]] = field(default_factory=list)
    hunks: list[str] = field(default_factory=list)  # the fix's paths this mutation reverts
    not_applicable: dict[str, str] = field(default_factory=dict)
    """Back end -> why it does not apply on the head: its paths are neither reverted nor counted."""

    @property
    def passed(self) -> bool:
        return self.outcome == "causal"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"passed": self.passed}


Field = tuple[str, str]
"""(probe, field)."""


@dataclass
class _Reverted:
    """One mutation's observations on the back ends that apply on the head, and what it reverts there."""

    fix: Fix
    mutation: Mutation
    obs: dict[str, Observation]
    skipped: dict[str, str]
    specs: dict[str, ProbeSpec]

    @classmethod
    def of(cls, fix: Fix, mutation: Mutation, observed: dict[str, Observation]) -> _Reverted:
        declared = {spec.name: as_declared(spec, observed.get(spec.name)) for spec in fix.probes}
        obs = {name: o for name, o in declared.items() if o is not None}
        skipped = {b: r for spec in fix.probes for b, r in gaps(obs.get(spec.name), spec).items()}
        return cls(fix, mutation, obs, skipped, {s.name: applicable(s, skipped) for s in fix.probes})

    @property
    def reverted(self) -> list[str]:
        return [h for h in self.mutation.hunks if self.fix.hunk(h).backend not in self.skipped]

    def classes(self) -> dict[str, str]:
        return {name: classify(self.obs.get(name), spec).value for name, spec in self.specs.items()}

    def side(self, probe: str, name: str) -> str:
        return field_side(self.obs[probe].fields.get(name), self.specs[probe].expect[name])

    def targeted(self) -> list[Field]:
        """The fields this mutation must send back to base: its hunks' fields, else its named targets' expects."""
        if self.mutation.hunks:
            return [pf for h in self.reverted for pf in self.fix.hunk(h).observed()]
        return [(name, f) for name in self.mutation.targets for f in self.specs[name].expect]

    def others(self) -> list[Hunk]:
        """The fix's paths this mutation leaves alone (on back ends that apply)."""
        return [h for h in self.fix.hunks if h.id not in self.mutation.hunks and h.backend not in self.skipped]


def _untrustworthy(r: _Reverted, classes: dict[str, str]) -> str | None:
    errors = [n for n, c in classes.items() if c == Match.ERROR.value]
    if not errors:
        return None
    why = "; ".join(
        f"{n}: {(r.obs[n].error or 'no observation').strip().splitlines()[-1]}" for n in errors if n in r.obs
    )
    return f"no trustworthy observation under the mutation: {why or errors}"


def _drift(r: _Reverted) -> str | None:
    drift = [f"{spec.name}:{c}" for spec in r.specs.values() for c in controls_hold(r.obs.get(spec.name), spec)]
    if not drift:
        return None
    return "the mutation changed control field(s), so it reverts more than the fix: " + ", ".join(drift)


def _unflipped(r: _Reverted, targeted: list[Field]) -> str | None:
    unflipped = [f"{name}:{f}" for name, f in targeted if r.side(name, f) != "base"]
    if not unflipped:
        return None
    return "targeted field(s) did not return to the base behaviour: " + ", ".join(unflipped)


def _moved(r: _Reverted, targeted: list[Field]) -> str | None:
    """Every other path of the fix must keep its head behaviour: the mutation reverts its hunk, not the fix."""
    moved = [
        f"{h.id} ({name}:{f})"
        for h in r.others()
        for name, f in h.observed()
        if (name, f) not in targeted and r.side(name, f) != "head"
    ]
    if not moved:
        return None
    return (
        f"reverting {', '.join(r.reverted)} also moved other path(s): {', '.join(moved)} "
        "-- the matrix's hunk fields or the mutation are too broad"
    )


def _causal(r: _Reverted) -> str:
    if r.mutation.hunks:
        return (
            f"reverting {', '.join(r.reverted)} brings back its base behaviour; the fix's other paths and "
            "every control hold"
        )
    return "reverting the fix's lines brings back the base behaviour; controls hold"


def _verdict(r: _Reverted, classes: dict[str, str]) -> tuple[str, str]:
    """(outcome, reason): the first of the checks that fails, in the order that makes the others meaningless."""
    if r.mutation.hunks and not r.reverted:
        return "error", "every path this mutation reverts is on a back end that does not apply here"
    failed = _untrustworthy(r, classes) or _drift(r)
    if failed:
        return "error", failed
    targeted = r.targeted()
    insensitive = _unflipped(r, targeted)
    if insensitive:
        return "insensitive", insensitive
    entangled = _moved(r, targeted) if r.mutation.hunks else None
    if entangled:
        return "entangled", entangled
    return "causal", _causal(r)


def judge_mutation(fix: Fix, mutation: Mutation, head_label: str, obs: dict[str, Observation]) -> MutationResult:
    """Causal only if every targeted probe shows the base values and every control holds.

    Judged on the back ends that apply on the head: a path on a back end the head lacks
    (or one without the fix's machinery) is neither targeted nor required to hold.
    """
    r = _Reverted.of(fix, mutation, obs)
    stopped = bool(mutation.hunks) and not r.reverted
    classes = {} if stopped else r.classes()
    outcome, reason = _verdict(r, classes)
    return MutationResult(
        fix=fix.id,
        mutation=mutation.name,
        file=mutation.file,
        head=head_label,
        outcome=outcome,
        reason=reason,
        probes=classes,
        observations=[o.to_dict() for o in r.obs.values()],
        hunks=r.reverted,
        not_applicable=r.skipped,
    )


def not_run(fix: Fix, mutation: Mutation | None, head_label: str, outcome: str, reason: str) -> MutationResult:
    """A mutation judged before any probe ran: none declared (``error``) or its text is gone (``mutation-stale``)."""
    return MutationResult(
        fix=fix.id,
        mutation=mutation.name if mutation else "(none)",
        file=mutation.file if mutation else "",
        head=head_label,
        outcome=outcome,
        reason=reason,
    )


@dataclass
class HunkCoverage:
    """Which of a fix's declared paths have a mutation that was shown to be causal."""

    fix: str
    hunks: list[str]
    covered: list[str]
    note: str = ""

    @property
    def counted(self) -> bool:
        """A fix without a head source has nothing to revert: it is not counted."""
        return not self.note.startswith((HEAD_UNAVAILABLE, NO_PROBE))

    @property
    def uncovered(self) -> list[str]:
        return [h for h in self.hunks if h not in self.covered]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"uncovered": self.uncovered}


def fix_coverage(fix: Fix, results: list[MutationResult]) -> HunkCoverage:
    """One fix with a head: its hunks with a causal mutation, leaving out paths on back ends the head lacks."""
    if not fix.hunks:
        return HunkCoverage(fix.id, ["(no hunks declared)"], [], "declare the fix's paths as [[fixes.hunks]]")
    mine = [r for r in results if r.fix == fix.id]
    causal = {h for r in mine if r.passed for h in r.hunks}
    # a path on a back end the head lacks (or one without the fix's machinery) exists nowhere to revert
    absent = {b: why for r in mine for b, why in r.not_applicable.items()}
    hunks = [h.id for h in fix.hunks if h.backend not in absent]
    note = "; ".join(f"not applicable on {b} in the head: {why}" for b, why in absent.items())
    return HunkCoverage(fix.id, hunks, [h for h in hunks if h in causal], note)


def hunk_coverage(fixes: list[Fix], heads: dict[str, Any], results: list[MutationResult]) -> list[HunkCoverage]:
    """Per fix: hunks with a causal mutation. A fix without a head source has nothing to revert (not counted)."""
    return [
        fix_coverage(fix, results)
        if fix.id in heads and revertible(fix)
        else HunkCoverage(
            fix.id, [h.id for h in fix.hunks], [], f"{HEAD_UNAVAILABLE if revertible(fix) else NO_PROBE}: not counted"
        )
        for fix in fixes
    ]


def coverage_ratio(coverage: list[HunkCoverage]) -> tuple[int, int]:
    counted = [c for c in coverage if c.counted]
    return sum(len(c.covered) for c in counted), sum(len(c.hunks) for c in counted)


def selfcheck_passed(results: list[MutationResult], coverage: list[HunkCoverage]) -> bool:
    covered, total = coverage_ratio(coverage)
    return bool(results) and all(r.passed for r in results) and covered == total
