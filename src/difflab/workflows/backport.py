"""``difflab backport``: run each selected fix's probes on a fork's ref and judge them.

The matrix's declared base/head values are the reference, so only the fork
is run. The results folder is written in a temporary sibling and renamed
into place at the end (as ``difflab run`` does), with run.json,
environment.json, matrix.toml and observations/<fix>/fork/ beside
backport.json, junit.xml and summary.md, so it can be sealed as a bundle.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from difflab.backport.evidence import DEFAULT_SCAN_LIMIT, disagreements, gather
from difflab.backport.report import write_backport_json, write_backport_junit, write_backport_summary
from difflab.bundle import seal
from difflab.diff.likeness import BackportVerdict, judge_backport
from difflab.environment.shared import SharedEnvironment
from difflab.files.atomic import check_out, results_folder
from difflab.matrix import Fix, ReleasePin, load_matrix
from difflab.paths import default_results
from difflab.preflight.defaults import read_defaults
from difflab.progress import Reporter
from difflab.provenance import probes_record
from difflab.report.family import write_family
from difflab.report.record import RunRecord, folder_stamp, is_run_folder, utc_now
from difflab.runner import build_runner, runner_class
from difflab.runner.jobs import check_probe_files
from difflab.source.base import MaterialisedSource
from difflab.source.git import GitSource
from difflab.source.mirror import default_repo
from difflab.source.release import ReleaseSource
from difflab.upstream_tests import (
    agree_on_side,
    for_sources,
    release_reference,
    section,
    tests_dir,
    with_flag,
    write_files,
)
from difflab.workflows.observe import ProbeOptions, observe

SIDE = "fork"


@dataclass(kw_only=True)
class BackportRequest(ProbeOptions):
    """Everything that determines a backport check (recorded in run.json)."""

    repo: str
    ref: str
    upstream: str | None = None
    scan_limit: int = DEFAULT_SCAN_LIMIT
    cache: Path | None = None
    upstream_tests: Path | None = None
    """A folder laid out like SGLang's repository with the fixes' own tests; the fork's own copy of a file wins."""


@dataclass
class BackportOutcome:
    out_dir: Path
    exit_code: int
    verdicts: list[BackportVerdict]


def default_out() -> Path:
    return default_results() / f"backport-{folder_stamp(utc_now())}"


def replay_upstream_tests(
    work: Path,
    fixes: list[Fix],
    fork: MaterialisedSource,
    releases: dict[str, ReleasePin],
    verdicts: list[BackportVerdict],
    env: SharedEnvironment,
    folder: Path,
    say: Callable[[str], None],
) -> list[str]:
    """SGLang's own tests of each fix on the fork (its own copies first), beside each verdict; the Markdown section."""
    backend = ReleaseSource(releases)
    references = {fix.id: release_reference(fix, backend) for fix in fixes}
    replays = for_sources(fixes, {SIDE: fork}, references, env, folder, say)
    agreements = agree_on_side(replays, {(v.id, SIDE): v.verdict for v in verdicts})
    for v in verdicts:
        found = agreements.get((v.id, SIDE))
        if found is not None:
            v.upstream_tests = found.to_dict()
            v.reason = with_flag(v.reason, found)
            v.disagreements += [found.flag] if found.flag else []
            say(f"upstream tests #{v.fix}: {found.text}")
    write_files(work, replays, folder)
    return section(replays)


LOCAL_NOTE = (
    "the {backend} back end runs the fork's code as you, with your network: the verdict says what that code did, "
    "not that it is honest; for a fork you did not write, use --backend docker (docs/forks.md)"
)
"""Said once by ``backport`` on a local back end: what its verdict is worth for code nobody vouched for."""


def execute(req: BackportRequest, reporter: Reporter | None = None) -> BackportOutcome:
    """Check the fork; raise :class:`DifflabError` on bad input (unknown fix, unreachable repo, bad ref)."""
    reporter = reporter or Reporter()
    say = reporter.say
    record = RunRecord(command="backport", argv=req.argv)
    matrix = load_matrix(req.matrix)
    fixes = matrix.select(req.fixes)
    check_probe_files(fixes, matrix.path)
    out = (req.out or default_out()).resolve()
    check_out(out, force=req.force, ours=is_run_folder)  # before anything is fetched
    if not runner_class(req.runner).hermetic:
        say(LOCAL_NOTE.format(backend=req.runner))
    folder = tests_dir(req.upstream_tests)
    source = GitSource(repo=req.repo, cache=req.cache, with_tests=folder is not None)
    say(f"fork {source.repo} at {req.ref}")
    fork = source.rev(req.ref, what=f"{req.ref!r}")
    say(f"fork commit {fork.identity['commit']} (tree {fork.identity['tree'][:12]})")
    upstream = req.upstream or default_repo()
    with results_folder(out, force=req.force, ours=is_run_folder) as work:
        env = SharedEnvironment()
        if runner_class(req.runner).local_environment:
            env.ensure(progress=say)
        runner = build_runner(req.runner, env, req.use_cache, say)
        observed = observe(fixes, {(fix.id, SIDE): fork for fix in fixes}, runner, work, reporter, req.timeout_s)
        by_key = {(obs.fix, obs.probe): obs for obs in observed}
        verdicts = []
        for fix in fixes:
            seen = {spec.name: by_key[(fix.id, spec.name)] for spec in fix.probes if (fix.id, spec.name) in by_key}
            verdict = judge_backport(fix, seen)
            version = next((o.sglang_version for o in seen.values() if o.sglang_version), None)
            evidence = gather(
                source.mirror,
                fork.identity["commit"],
                fix,
                upstream=upstream,
                matrix_path=matrix.path,
                version=version,
                scan_limit=req.scan_limit,
            )
            verdict.evidence = evidence.to_dict()
            verdict.disagreements = disagreements(verdict.verdict, evidence)
            verdicts.append(verdict)
        appendix: list[str] = []
        if folder is not None:
            appendix = replay_upstream_tests(work, fixes, fork, matrix.releases, verdicts, env, folder, say)
        build = f"fork {fork.identity['commit'][:12]}"  # the family's answer and the build's switch defaults
        family = write_family(
            work, matrix, {build: {v.id: v.verdict for v in verdicts}}, {build: read_defaults(fork.root)}
        )
        appendix = [*family, *appendix]
        exit_code = 0 if all(v.passed for v in verdicts) else 1
        fork_doc = {**fork.identity, "ref": req.ref, "subject": fork.extra.get("subject"), "upstream": upstream}
        write_backport_json(work / "backport.json", fork_doc, verdicts)
        write_backport_junit(work / "junit.xml", verdicts)
        write_backport_summary(work / "summary.md", fork_doc, verdicts, appendix)
        record.fixes = [f.id for f in fixes]
        record.details = {
            "sides": [SIDE],
            "source_kind": "git",
            "repo": fork.identity["repo"],
            "ref": req.ref,
            "runner": runner.describe(),
            "sources": {SIDE: fork.identity},
            "environment_digest": env.digest,
            "probes": probes_record(),
        }
        record.write(work, exit_code, matrix=(matrix.path, matrix.sha256), environment=env.document())
        if req.bundle:
            seal(work, key=req.key, echo=reporter.say)
    for v in verdicts:
        say(f"#{v.fix}{f'({v.part})' if v.part else ''}: {v.verdict} - {v.reason}")
    return BackportOutcome(out_dir=out, exit_code=exit_code, verdicts=verdicts)
