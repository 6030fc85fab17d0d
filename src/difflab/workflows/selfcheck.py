"""Causality self-check: revert only the fix's lines, and its probes must flip back.

A release-level diff carries hundreds of unrelated changes, so a probe that
flips between two releases has not yet shown that *the fix* is what it sees.
Each matrix mutation is a small exact edit that undoes the fix's essential
lines in the head source. The mutated copy (hard links to the pristine cache,
the edited file a real copy, so the cache is never touched) must show the
base behaviour on the targeted probes while every control keeps its value.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from difflab.diff.backends import applicable, as_declared, gaps
from difflab.diff.classify import Match, classify, controls_hold, field_side
from difflab.environment.shared import SharedEnvironment
from difflab.errors import ConfigError
from difflab.files.atomic import atomic_folder, check_out, results_folder
from difflab.matrix import Fix, Mutation, load_matrix
from difflab.observation import Observation
from difflab.paths import cache_root, default_results
from difflab.progress import Reporter
from difflab.provenance import probes_record
from difflab.report.junit import Case, write_cases
from difflab.report.markdown import cell
from difflab.report.record import RunRecord, folder_stamp, is_run_folder, write_json
from difflab.runner import ProbeJob, build_runner
from difflab.runner.base import DEFAULT_TIMEOUT_S
from difflab.runner.jobs import build_jobs, check_probe_files
from difflab.source import MaterialisedSource
from difflab.source.release import ReleaseSource
from difflab.workflows.observe import Selection

OUTCOMES = ("causal", "insensitive", "entangled", "mutation-stale", "error")


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


class StaleMutation(Exception):  # noqa: N818 - an outcome, reported as mutation-stale
    """The text a mutation expects is not in the head source (the code moved)."""


def _inside(path: Path, folder: Path) -> bool:
    return path.resolve().is_relative_to(folder.resolve())


def mutated_copy(source: MaterialisedSource, mutation: Mutation, cache: Path | None = None) -> MaterialisedSource:
    """A copy of ``source`` with ``mutation`` applied; the pristine cache is never modified.

    The loader already refuses absolute and ``..`` paths; this is checked again here, after
    links are resolved, because the edit rewrites a file: it must be one inside the copied tree.
    """
    target_file = source.root / mutation.file
    if not _inside(target_file, source.root / "sglang"):
        raise ConfigError(
            f"mutation {mutation.name!r}: file {mutation.file!r} is not inside the source's sglang/ tree; refused"
        )
    if not target_file.is_file():
        raise StaleMutation(f"{mutation.file} does not exist in {source.label}")
    text = target_file.read_text()
    hits = text.count(mutation.find)
    if hits != 1:
        where = "not found" if hits == 0 else f"found {hits} times (must be unique)"
        raise StaleMutation(f"expected text {where} in {mutation.file} of {source.label}")
    key = hashlib.sha256(
        "\0".join([source.digest, mutation.file, mutation.find, mutation.replace]).encode()
    ).hexdigest()[:16]
    root = (cache or cache_root()) / "mutated"
    dest = root / f"{source.label}-{mutation.name}-{key}"
    if not (dest / mutation.file).exists():
        with atomic_folder(dest) as tmp:
            shutil.copytree(source.root / "sglang", tmp / "sglang", copy_function=os.link)
            edited = tmp / mutation.file
            if not _inside(edited, tmp):
                raise ConfigError(f"mutation {mutation.name!r}: {mutation.file!r} leaves the mutated copy; refused")
            edited.parent.chmod(0o755)  # the pristine tree's folders are read-only, and so are the copies
            edited.unlink()  # break the hard link before writing
            edited.write_text(text.replace(mutation.find, mutation.replace))
    identity = dict(source.identity) | {"mutation": mutation.name, "mutated_file": mutation.file}
    return MaterialisedSource(
        label=f"{source.label}+{mutation.name}",
        kind="mutated",
        root=dest,
        identity=identity,
        digest=f"{source.digest}+mut:{key}",
    )


def judge_mutation(fix: Fix, mutation: Mutation, head_label: str, obs: dict[str, Observation]) -> MutationResult:
    """Causal only if every targeted probe shows the base values and every control holds.

    Judged on the back ends that apply on the head: a path on a back end the head lacks
    (or one without the fix's machinery) is neither targeted nor required to hold.
    """
    declared = {spec.name: as_declared(spec, obs.get(spec.name)) for spec in fix.probes}
    obs = {name: o for name, o in declared.items() if o is not None}
    skipped = {b: r for spec in fix.probes for b, r in gaps(obs.get(spec.name), spec).items()}
    reverted = [h for h in mutation.hunks if fix.hunk(h).backend not in skipped]

    def result(outcome: str, reason: str, probes: dict[str, str]) -> MutationResult:
        return MutationResult(
            fix=fix.id,
            mutation=mutation.name,
            file=mutation.file,
            head=head_label,
            outcome=outcome,
            reason=reason,
            probes=probes,
            observations=[o.to_dict() for o in obs.values()],
            hunks=reverted,
            not_applicable=skipped,
        )

    if mutation.hunks and not reverted:
        return result("error", "every path this mutation reverts is on a back end that does not apply here", {})
    specs = {s.name: applicable(s, skipped) for s in fix.probes}
    classes = {name: classify(obs.get(name), spec).value for name, spec in specs.items()}
    errors = [n for n, c in classes.items() if c == Match.ERROR.value]
    if errors:
        why = "; ".join(
            f"{n}: {(obs[n].error or 'no observation').strip().splitlines()[-1]}" for n in errors if n in obs
        )
        return result("error", f"no trustworthy observation under the mutation: {why or errors}", classes)
    drift = [f"{spec.name}:{c}" for spec in specs.values() for c in controls_hold(obs.get(spec.name), spec)]
    if drift:
        return result(
            "error",
            "the mutation changed control field(s), so it reverts more than the fix: " + ", ".join(drift),
            classes,
        )
    if mutation.hunks:
        targeted = [pf for h in reverted for pf in fix.hunk(h).observed()]
    else:
        targeted = [(name, f) for name in mutation.targets for f in specs[name].expect]
    unflipped = [
        f"{name}:{f}" for name, f in targeted if field_side(obs[name].fields.get(f), specs[name].expect[f]) != "base"
    ]
    if unflipped:
        return result(
            "insensitive", "targeted field(s) did not return to the base behaviour: " + ", ".join(unflipped), classes
        )
    if mutation.hunks:
        # every other path of the fix must keep its head behaviour: the mutation reverts its hunk, not the fix
        others = [h for h in fix.hunks if h.id not in mutation.hunks and h.backend not in skipped]
        moved = [
            f"{h.id} ({name}:{f})"
            for h in others
            for name, f in h.observed()
            if (name, f) not in targeted and field_side(obs[name].fields.get(f), specs[name].expect[f]) != "head"
        ]
        if moved:
            return result(
                "entangled",
                "reverting "
                + ", ".join(reverted)
                + " also moved other path(s): "
                + ", ".join(moved)
                + " -- the matrix's hunk fields or the mutation are too broad",
                classes,
            )
        return result(
            "causal",
            f"reverting {', '.join(reverted)} brings back its base behaviour; the fix's other paths and "
            "every control hold",
            classes,
        )
    return result("causal", "reverting the fix's lines brings back the base behaviour; controls hold", classes)


def selfcheck_jobs(
    fix: Fix, mutation: Mutation, mutated: MaterialisedSource, work: Path, timeout_s: float = DEFAULT_TIMEOUT_S
) -> list[ProbeJob]:
    sources = {(fix.id, f"mutated-{mutation.name}"): mutated}
    return build_jobs([fix], sources, lambda fix_id, _side: work / "selfcheck" / fix_id / mutation.name, timeout_s)[0]


def run_selfcheck(
    fixes: list[Fix],
    heads: dict[str, MaterialisedSource],
    runner: Any,
    work: Path,
    track: Any,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> list[MutationResult]:
    """Apply every mutation of every fix to its head source and judge the probes' reaction."""
    results: list[MutationResult] = []
    pending: list[tuple[Fix, Mutation, MaterialisedSource]] = []
    for fix in fixes:
        head = heads.get(fix.id)
        if head is None:
            continue  # no head source (unavailable): nothing to revert
        if not fix.mutations:
            results.append(
                MutationResult(
                    fix=fix.id,
                    mutation="(none)",
                    file="",
                    head=head.label,
                    outcome="error",
                    reason="no reverting mutation declared for this fix in the matrix",
                )
            )
            continue
        for mutation in fix.mutations:
            try:
                pending.append((fix, mutation, mutated_copy(head, mutation)))
            except StaleMutation as exc:
                results.append(
                    MutationResult(
                        fix=fix.id,
                        mutation=mutation.name,
                        file=mutation.file,
                        head=head.label,
                        outcome="mutation-stale",
                        reason=f"fix {fix.id}, {exc}",
                    )
                )
    jobs = [j for fix, m, src in pending for j in selfcheck_jobs(fix, m, src, work, timeout_s)]
    observed = track(runner, jobs) if jobs else []
    by = {(o.fix, o.side, o.probe): o for o in observed}
    for fix, mutation, _src in pending:
        side = f"mutated-{mutation.name}"
        obs = {s.name: by[(fix.id, side, s.name)] for s in fix.probes if (fix.id, side, s.name) in by}
        results.append(judge_mutation(fix, mutation, heads[fix.id].label, obs))
    order = {f.id: i for i, f in enumerate(fixes)}
    return sorted(results, key=lambda r: (order.get(r.fix, 0), r.mutation))


@dataclass
class HunkCoverage:
    """Which of a fix's declared paths have a mutation that was shown to be causal."""

    fix: str
    hunks: list[str]
    covered: list[str]
    note: str = ""

    @property
    def uncovered(self) -> list[str]:
        return [h for h in self.hunks if h not in self.covered]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"uncovered": self.uncovered}


def hunk_coverage(fixes: list[Fix], heads: dict[str, Any], results: list[MutationResult]) -> list[HunkCoverage]:
    """Per fix: hunks with a causal mutation. A fix without a head source has nothing to revert (not counted)."""
    out = []
    for fix in fixes:
        if fix.id not in heads:
            out.append(HunkCoverage(fix.id, [h.id for h in fix.hunks], [], "head unavailable: not counted"))
            continue
        if not fix.hunks:
            out.append(HunkCoverage(fix.id, ["(no hunks declared)"], [], "declare the fix's paths as [[fixes.hunks]]"))
            continue
        causal = {h for r in results if r.fix == fix.id and r.passed for h in r.hunks}
        # a path on a back end the head lacks (or one without the fix's machinery) exists nowhere to revert
        absent = {b: why for r in results if r.fix == fix.id for b, why in r.not_applicable.items()}
        hunks = [h.id for h in fix.hunks if h.backend not in absent]
        note = "; ".join(f"not applicable on {b} in the head: {why}" for b, why in absent.items())
        out.append(HunkCoverage(fix.id, hunks, [h for h in hunks if h in causal], note))
    return out


def coverage_ratio(coverage: list[HunkCoverage]) -> tuple[int, int]:
    counted = [c for c in coverage if not c.note.startswith("head unavailable")]
    return sum(len(c.covered) for c in counted), sum(len(c.hunks) for c in counted)


def selfcheck_passed(results: list[MutationResult], coverage: list[HunkCoverage]) -> bool:
    covered, total = coverage_ratio(coverage)
    return bool(results) and all(r.passed for r in results) and covered == total


def write_selfcheck(folder: Path, results: list[MutationResult], coverage: list[HunkCoverage] | None = None) -> None:
    """selfcheck.json, selfcheck-junit.xml and selfcheck.md beside the run's other results."""
    coverage = coverage or []
    covered, total = coverage_ratio(coverage)
    doc = {
        "schema": 1,
        "passed": selfcheck_passed(results, coverage) if coverage else all(r.passed for r in results),
        "hunk_coverage": {"covered": covered, "hunks": total, "fixes": [c.to_dict() for c in coverage]},
        "mutations": [r.to_dict() for r in results],
    }
    write_json(folder / "selfcheck.json", doc)
    outcome = {"causal": "passed", "error": "error"}
    cases = [
        Case(f"selfcheck.{r.fix}", r.mutation, outcome.get(r.outcome, "failed"), r.reason, r.outcome) for r in results
    ]
    cases += [
        Case(
            f"selfcheck.{c.fix}",
            "hunk-coverage",
            "failed",
            "no causal mutation for: " + ", ".join(c.uncovered),
            "uncovered",
        )
        if c.uncovered and not c.note.startswith("head unavailable")
        else Case(f"selfcheck.{c.fix}", "hunk-coverage", "passed", "", "")
        for c in coverage
    ]
    write_cases(folder / "selfcheck-junit.xml", "difflab-selfcheck", cases)
    lines = [
        "# Causality self-check",
        "",
        "Each mutation reverts only the fix's essential lines in the head source; the targeted probes",
        "must return to the base behaviour while controls hold.",
        "",
        f"Hunk coverage: {covered}/{total} declared paths have a causal mutation.",
        "",
        "| fix | mutation | hunks | file | head | outcome | reason |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r.fix} | `{r.mutation}` | {', '.join(r.hunks)} | `{r.file}` | {r.head} | {r.outcome} "
            f"| {cell(r.reason)} |"
        )
    if coverage:
        lines += ["", "| fix | paths | covered | not covered | note |", "|---|---|---|---|---|"]
        for c in coverage:
            uncovered = ", ".join(c.uncovered) or "-"
            lines.append(f"| {c.fix} | {len(c.hunks)} | {len(c.covered)} | {uncovered} | {cell(c.note or '-')} |")
    (folder / "selfcheck.md").write_text("\n".join(lines) + "\n")


@dataclass(kw_only=True)
class SelfcheckRequest(Selection):
    """``difflab selfcheck``: the fixes whose heads get their reverting mutations."""


def execute(req: SelfcheckRequest, reporter: Reporter) -> tuple[list[MutationResult], list[HunkCoverage], Path]:
    """Mutate every selected head release and judge its probes; the run folder holds selfcheck.*."""
    matrix = load_matrix(req.matrix)
    fixes = matrix.select(req.fixes)
    check_probe_files(fixes, matrix.path)
    record = RunRecord(command="selfcheck", fixes=[f.id for f in fixes])
    out = (req.out or default_results() / f"selfcheck-{folder_stamp(record.started)}").resolve()
    check_out(out, force=req.force, ours=is_run_folder)  # before sources are unpacked
    backend = ReleaseSource(matrix.releases)
    heads = {}
    for fix in fixes:
        if fix.head.unavailable:
            reporter.say(f"{fix.label}: head unavailable ({fix.head.unavailable}); nothing to revert")
            continue
        heads[fix.id] = backend.materialise(fix, "head", fix.head)
    env = SharedEnvironment().ensure(progress=reporter.say)
    runner = build_runner(req.runner, env, req.use_cache)
    with results_folder(out, force=req.force, ours=is_run_folder) as work:
        results = run_selfcheck(fixes, heads, runner, work, reporter.track)
        coverage = hunk_coverage(fixes, heads, results)
        write_selfcheck(work, results, coverage)
        passed = selfcheck_passed(results, coverage)
        record.details["probes"] = probes_record()
        record.write(work, 0 if passed else 1, matrix=(matrix.path, matrix.sha256))
    return results, coverage, out
