"""Causality self-check: revert only the fix's lines, and its probes must flip back.

A release-level diff carries hundreds of unrelated changes, so a probe that
flips between two releases has not yet shown that *the fix* is what it sees.
Each matrix mutation is a small exact edit that undoes the fix's essential
lines in the head source (a release's or a git commit's, as ``--source`` says).
The mutated copy (:mod:`difflab.source.mutation`: hard links to the pristine
cache, the edited file a real copy, so the cache is never touched) must show
the base behaviour on the targeted probes while every control keeps its value;
:mod:`difflab.diff.mutation` judges it and :mod:`difflab.report.selfcheck`
writes the files.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from difflab.diff.mutation import (
    OUTCOMES,
    HunkCoverage,
    MutationResult,
    coverage_ratio,
    hunk_coverage,
    judge_mutation,
    not_run,
    revertible,
    selfcheck_passed,
)
from difflab.matrix import Fix, Mutation
from difflab.observation import Observation
from difflab.progress import Reporter
from difflab.provenance import probes_record
from difflab.report.selfcheck import write_selfcheck
from difflab.runner import ProbeJob, Runner
from difflab.runner.base import DEFAULT_TIMEOUT_S
from difflab.runner.jobs import build_jobs
from difflab.source import MaterialisedSource, SourceBackend
from difflab.source.mutation import StaleMutation, mutated_copy
from difflab.source.sides import Say, materialise_sides
from difflab.workflows.session import Outcome, ProbeOptions, Session

Track = Callable[[Runner, Sequence[ProbeJob]], list[Observation]]
"""Runs the jobs and shows their progress (:meth:`difflab.progress.Reporter.track`)."""

Pending = tuple[Fix, Mutation, MaterialisedSource]


def selfcheck_jobs(
    fix: Fix, mutation: Mutation, mutated: MaterialisedSource, work: Path, timeout_s: float = DEFAULT_TIMEOUT_S
) -> list[ProbeJob]:
    sources = {(fix.id, f"mutated-{mutation.name}"): mutated}
    return build_jobs([fix], sources, lambda fix_id, _side: work / "selfcheck" / fix_id / mutation.name, timeout_s)[0]


def mutate(fix: Fix, head: MaterialisedSource) -> tuple[list[Pending], list[MutationResult]]:
    """Every mutation of ``fix`` applied to its head, and those judged already (none declared, stale)."""
    if not fix.mutations:
        return [], [
            not_run(fix, None, head.label, "error", "no reverting mutation declared for this fix in the matrix")
        ]
    pending: list[Pending] = []
    judged: list[MutationResult] = []
    for mutation in fix.mutations:
        try:
            pending.append((fix, mutation, mutated_copy(head, mutation)))
        except StaleMutation as exc:
            judged.append(not_run(fix, mutation, head.label, "mutation-stale", f"fix {fix.id}, {exc}"))
    return pending, judged


def run_selfcheck(
    fixes: list[Fix],
    heads: dict[str, MaterialisedSource],
    runner: Runner,
    work: Path,
    track: Track,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> list[MutationResult]:
    """Apply every mutation of every fix to its head source and judge the probes' reaction."""
    results: list[MutationResult] = []
    pending: list[Pending] = []
    # no head source (unavailable), or no probe to flip (older than every pin): nothing to revert
    for fix in (f for f in fixes if f.id in heads and revertible(f)):
        mutated, judged = mutate(fix, heads[fix.id])
        pending += mutated
        results += judged
    jobs = [j for fix, m, src in pending for j in selfcheck_jobs(fix, m, src, work, timeout_s)]
    observed = track(runner, jobs) if jobs else []
    by = {(o.fix, o.side, o.probe): o for o in observed}
    for fix, mutation, _src in pending:
        side = f"mutated-{mutation.name}"
        obs = {s.name: by[(fix.id, side, s.name)] for s in fix.probes if (fix.id, side, s.name) in by}
        results.append(judge_mutation(fix, mutation, heads[fix.id].label, obs))
    order = {f.id: i for i, f in enumerate(fixes)}
    return sorted(results, key=lambda r: (order.get(r.fix, 0), r.mutation))


def materialise_heads(
    fixes: list[Fix], backend: SourceBackend, say: Say, matrix_path: Path | None = None
) -> dict[str, MaterialisedSource]:
    """Each fix's head under the chosen source kind; a head the matrix marks unavailable, or a fix with no
    probe to flip, is said and left out."""
    heads: dict[str, MaterialisedSource] = {}
    for fix in fixes:
        if not revertible(fix):
            say(f"{fix.id}: base unavailable ({fix.base.unavailable}) and no probe; nothing to revert")
    fixes = [f for f in fixes if revertible(f)]
    for (fix_id, _side), src in materialise_sides(fixes, backend, say, ("head",), matrix_path).items():
        if isinstance(src, str):
            say(f"{fix_id}: head unavailable ({src}); nothing to revert")
        else:
            heads[fix_id] = src
    return heads


@dataclass(kw_only=True)
class SelfcheckRequest(ProbeOptions):
    """``difflab selfcheck``: the fixes whose heads get their reverting mutations."""


@dataclass
class SelfcheckOutcome(Outcome):
    results: list[MutationResult] = field(default_factory=list)
    coverage: list[HunkCoverage] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return selfcheck_passed(self.results, self.coverage)


def execute(req: SelfcheckRequest, reporter: Reporter | None = None) -> SelfcheckOutcome:
    """Mutate every selected head (release or git commit) and judge its probes; the run folder holds selfcheck.*."""
    session = Session.open("selfcheck", req, reporter, folder_prefix="selfcheck-")
    heads = materialise_heads(session.fixes, session.sources(), session.say, session.matrix.path)
    env = session.environment()
    runner = session.runner(env)
    with session.folder() as work:
        results = run_selfcheck(session.fixes, heads, runner, work, session.reporter.track, req.timeout_s)
        coverage = hunk_coverage(session.fixes, heads, results)
        write_selfcheck(work, results, coverage)
        session.record.details = {
            "source_kind": req.source_kind,
            "repo": req.repo,
            "runner": runner.describe(),
            "sources": {s.label: s.identity for s in heads.values()},
            "environment_digest": env.digest,
            "probes": probes_record(),
        }
        exit_code = session.finish(work, 0 if selfcheck_passed(results, coverage) else 1, environment=env.document())
    return SelfcheckOutcome(out_dir=session.out, exit_code=exit_code, results=results, coverage=coverage)


__all__ = [
    "OUTCOMES",
    "HunkCoverage",
    "MutationResult",
    "SelfcheckOutcome",
    "SelfcheckRequest",
    "StaleMutation",
    "coverage_ratio",
    "execute",
    "hunk_coverage",
    "judge_mutation",
    "mutated_copy",
    "run_selfcheck",
    "selfcheck_passed",
    "write_selfcheck",
]
