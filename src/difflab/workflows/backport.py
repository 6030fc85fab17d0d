"""``difflab backport``: run each selected fix's probes on a fork's ref and judge them.

The matrix's declared base/head values are the reference, so only the fork
is run. The results folder is written in a temporary sibling and renamed
into place at the end (as ``difflab run`` does), with run.json,
environment.json, matrix.toml and observations/<fix>/fork/ beside
backport.json, junit.xml and summary.md, so it can be sealed as a bundle.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from difflab.backport.evidence import DEFAULT_SCAN_LIMIT, disagreements, gather
from difflab.diff.likeness import BackportVerdict, judge_backport
from difflab.environment.shared import SharedEnvironment
from difflab.observation import Observation
from difflab.preflight.defaults import read_defaults
from difflab.progress import Reporter
from difflab.provenance import probes_record
from difflab.report.backport import write_files
from difflab.report.family import write_family
from difflab.report.upstream_tests import section
from difflab.report.upstream_tests import write_files as write_upstream_files
from difflab.runner import Runner
from difflab.source import releases, repository
from difflab.source.base import MaterialisedSource
from difflab.source.git import GitSource
from difflab.source.mirror import default_repo
from difflab.upstream_tests import agree_on_side, for_sources, release_reference, tests_dir, with_flag
from difflab.workflows.observe import observe
from difflab.workflows.session import Outcome, ProbeOptions, Session, started_early

SIDE = "fork"


@dataclass(kw_only=True)
class BackportRequest(ProbeOptions):
    """Everything that determines a backport check (recorded in run.json)."""

    repo: str
    """The fork: git URL or local path."""
    ref: str
    upstream: str | None = None
    scan_limit: int = DEFAULT_SCAN_LIMIT
    cache: Path | None = None
    upstream_tests: Path | None = None
    """A folder laid out like SGLang's repository with the fixes' own tests; the fork's own copy of a file wins."""


@dataclass
class BackportOutcome(Outcome):
    verdicts: list[BackportVerdict] = field(default_factory=list)


def replay_upstream_tests(
    session: Session,
    work: Path,
    fork: MaterialisedSource,
    verdicts: list[BackportVerdict],
    env: SharedEnvironment,
    folder: Path,
) -> list[str]:
    """SGLang's own tests of each fix on the fork (its own copies first), beside each verdict; the Markdown section."""
    fixes, say = session.fixes, session.say
    backend = releases(session.matrix.releases)  # the fix's own base and head decide which names it adds
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
    write_upstream_files(work, replays, folder)
    return section(replays)


LOCAL_NOTE = (
    "the {backend} back end runs the fork's code as you, with your network: the verdict says what that code did, "
    "not that it is honest; for a fork you did not write, use --backend docker (docs/forks.md)"
)
"""Said once by ``backport`` on a local back end: what its verdict is worth for code nobody vouched for."""


@dataclass
class _Fork:
    """The fork's ref, checked out, and where upstream's fix commits come from (the evidence)."""

    source: GitSource
    tree: MaterialisedSource
    ref: str
    upstream: str

    def document(self) -> dict[str, Any]:
        identity = self.tree.identity
        return {**identity, "ref": self.ref, "subject": self.tree.extra.get("subject"), "upstream": self.upstream}


def _fork(req: BackportRequest, with_tests: bool, say: Callable[[str], None]) -> _Fork:
    source = repository(req.repo, cache=req.cache, with_tests=with_tests)
    say(f"fork {source.repo} at {req.ref}")
    tree = source.rev(req.ref, what=f"{req.ref!r}")
    say(f"fork commit {tree.identity['commit']} (tree {tree.identity['tree'][:12]})")
    return _Fork(source, tree, req.ref, req.upstream or default_repo())


def judge_fork(session: Session, fork: _Fork, observed: list[Observation], scan_limit: int) -> list[BackportVerdict]:
    """Each fix's probes on the fork judged against the matrix's declared values, with the git evidence beside."""
    by_key = {(obs.fix, obs.probe): obs for obs in observed}
    verdicts = []
    for fix in session.fixes:
        seen = {spec.name: by_key[(fix.id, spec.name)] for spec in fix.probes if (fix.id, spec.name) in by_key}
        verdict = judge_backport(fix, seen)
        version = next((o.sglang_version for o in seen.values() if o.sglang_version), None)
        evidence = gather(
            fork.source.mirror,
            fork.tree.identity["commit"],
            fix,
            upstream=fork.upstream,
            matrix_path=session.matrix.path,
            version=version,
            scan_limit=scan_limit,
        )
        verdict.evidence = evidence.to_dict()
        verdict.disagreements = disagreements(verdict.verdict, evidence)
        verdicts.append(verdict)
    return verdicts


def execute(req: BackportRequest, reporter: Reporter | None = None) -> BackportOutcome:
    """Check the fork; raise :class:`DifflabError` on bad input (unknown fix, unreachable repo, bad ref)."""
    session = Session.open("backport", req, reporter, folder_prefix="backport-")  # before anything is fetched
    say = session.say
    if not session.runner_class.hermetic:
        say(LOCAL_NOTE.format(backend=req.runner))
    folder = tests_dir(req.upstream_tests)
    env = session.environment(ensure=False)
    runner = session.runner(env)
    with started_early(runner):  # a ready environment's hub imports while the fork is fetched
        fork = _fork(req, folder is not None, say)
        return _check_fork(session, req, fork, env, runner, folder)


def _check_fork(
    session: Session, req: BackportRequest, fork: _Fork, env: SharedEnvironment, runner: Runner, folder: Path | None
) -> BackportOutcome:
    say = session.say
    if session.runner_class.local_environment:
        env.ensure(progress=say)
    with session.folder() as work:
        fixes = session.fixes
        sides = {(fix.id, SIDE): fork.tree for fix in fixes}
        observed = observe(fixes, sides, runner, work, session.reporter, req.timeout_s)
        verdicts = judge_fork(session, fork, observed, req.scan_limit)
        appendix: list[str] = []
        if folder is not None:
            appendix = replay_upstream_tests(session, work, fork.tree, verdicts, env, folder)
        build = f"fork {fork.tree.identity['commit'][:12]}"  # the family's answer and the build's switch defaults
        family = write_family(
            work, session.matrix, {build: {v.id: v.verdict for v in verdicts}}, {build: read_defaults(fork.tree.root)}
        )
        appendix = [*family, *appendix]
        exit_code = 0 if all(v.passed for v in verdicts) else 1
        write_files(work, fork.document(), verdicts, appendix)
        session.record.details = {
            "sides": [SIDE],
            "source_kind": "git",
            "repo": fork.tree.identity["repo"],
            "ref": req.ref,
            "runner": runner.describe(),
            "sources": {SIDE: fork.tree.identity},
            "environment_digest": env.digest,
            "probes": probes_record(),
        }
        session.finish(work, exit_code, environment=env.document())
    for v in verdicts:
        say(f"#{v.fix}{f'({v.part})' if v.part else ''}: {v.verdict} - {v.reason}")
    return BackportOutcome(out_dir=session.out, exit_code=exit_code, verdicts=verdicts)
