"""``difflab run`` / ``difflab observe``: matrix → sources → environment → probes → diff → reports → bundle.

The folder is written under a temporary sibling and renamed into place only
when the run completes, so a crashed or interrupted run never replaces a
good result.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from difflab import stats
from difflab.diff.throughput import ThroughputResult
from difflab.diff.verdict import FixVerdict, judge_all
from difflab.environment.shared import SharedEnvironment
from difflab.errors import ConfigError
from difflab.matrix import Fix
from difflab.observation import SIDES
from difflab.paths import default_results
from difflab.progress import Reporter
from difflab.provenance import probes_record
from difflab.report import Measured, write_reports
from difflab.report.record import folder_stamp, utc_now
from difflab.report.selfcheck import write_selfcheck
from difflab.report.upstream_tests import section, write_files
from difflab.runner import Runner, runner_class
from difflab.runner.jobs import Sources
from difflab.runner.warm import WarmRunner
from difflab.source import MaterialisedSource
from difflab.source.sides import Say, materialise_sides, source_label
from difflab.upstream_tests import FixReplay, agree_with_run, for_run, tests_dir, with_flag
from difflab.workflows.observe import observe
from difflab.workflows.selfcheck import hunk_coverage, run_selfcheck, selfcheck_passed
from difflab.workflows.session import Outcome, ProbeOptions, Session, runner_for_options, started_early
from difflab.workflows.throughput import ThroughputOptions, gate_exit, measure


@dataclass(kw_only=True)
class RunRequest(ProbeOptions):
    """Everything that determines a run (recorded in run.json, replayed by ``reproduce``)."""

    runner_options: dict[str, Any] = field(default_factory=dict)
    sides: tuple[str, ...] = SIDES
    """Both sides give verdicts; one side (``difflab observe``) only records observations."""
    selfcheck: bool = False
    upstream_tests: Path | None = None
    """A folder laid out like SGLang's repository with the fixes' own test files (else ``$DIFFLAB_UPSTREAM_TESTS``)."""
    throughput: ThroughputOptions | None = None
    """Also time each fix's hot path, base against head (``--throughput``); None: behaviour only."""

    @property
    def both_sides(self) -> bool:
        return tuple(self.sides) == SIDES


@dataclass
class RunOutcome(Outcome):
    verdicts: list[FixVerdict] = field(default_factory=list)
    throughput: list[ThroughputResult] = field(default_factory=list)


def _check_request(req: RunRequest) -> None:
    """Refuse sides or a throughput A/B that cannot run before anything is read or written (exit 2)."""
    if not req.sides or not set(req.sides) <= set(SIDES):
        raise ConfigError(f"--side must be base or head, got {req.sides}")
    if req.throughput is None:
        return
    stats.require("--throughput")
    if not req.both_sides:
        raise ConfigError("--throughput compares base with head: it needs both sides")
    if runner_class(req.runner) is not WarmRunner:
        raise ConfigError(
            f"--throughput runs on the warm back end (two forked processes driven round by round); "
            f"--backend {req.runner} cannot interleave rounds"
        )


def default_out() -> Path:
    return default_results() / folder_stamp(utc_now())


def make_runner(req: RunRequest, env: SharedEnvironment, reporter: Reporter | None = None) -> Runner:
    return runner_for_options(req, env, reporter.say if reporter else None, **req.runner_options)


def upstream_replay(
    fixes: list[Fix],
    sources: Sources,
    env: SharedEnvironment,
    verdicts: list[FixVerdict],
    folder: Path | None,
    say: Say,
) -> list[FixReplay]:
    """SGLang's own tests of each fix on its base and head, beside the verdicts (their reasons flag a disagreement)."""
    replays = for_run(fixes, sources, env, folder, say)
    agreements = agree_with_run(replays, {v.id: v.verdict for v in verdicts})
    for v in verdicts:
        if v.id in agreements:
            v.upstream_tests = agreements[v.id].to_dict()
            v.reason = with_flag(v.reason, agreements[v.id])
    for r in replays:
        say(f"upstream tests {r.fix.label}: {r.agreement.text if r.agreement else r.note}")
    return replays


@dataclass
class _Run:
    """One run in progress: what its steps share, and what they found so far."""

    session: Session
    req: RunRequest
    env: SharedEnvironment
    runner: Runner
    work: Path
    sources: Sources = field(default_factory=dict)
    verdicts: list[FixVerdict] = field(default_factory=list)
    measured: list[ThroughputResult] = field(default_factory=list)
    replays: list[FixReplay] = field(default_factory=list)
    exit_code: int = 0

    def fail(self, exit_code: int) -> None:
        self.exit_code = max(self.exit_code, exit_code)


def _upstream_folder(req: RunRequest, session: Session) -> Path | None:
    """``--upstream-tests`` (or its environment variable) checked before the run starts; both sides only."""
    folder = tests_dir(req.upstream_tests) if req.both_sides else None
    if folder is not None and not session.runner_class.local_environment:
        raise ConfigError(f"--upstream-tests runs in the local shared environment; not with --backend {req.runner}")
    return folder


def _judge(run: _Run) -> None:
    """Both sides: verdicts; one side of a CI fan-out: only whether every probe ran (``difflab merge`` judges)."""
    fixes = run.session.fixes
    observed = observe(fixes, run.sources, run.runner, run.work, run.session.reporter, run.req.timeout_s)
    if not run.req.both_sides:
        run.fail(0 if all(o.status != "error" for o in observed) else 1)
        return
    run.verdicts = judge_all(fixes, observed, {k: source_label(v) for k, v in run.sources.items()})
    run.fail(0 if all(v.passed for v in run.verdicts) else 1)


def _throughput(run: _Run, options: ThroughputOptions) -> None:
    started = time.monotonic()
    run.measured = measure(run.session.fixes, run.sources, run.runner, run.work, run.session.reporter, options)
    run.session.record.details["throughput"] = options.record()
    run.session.record.details["throughput_wall_s"] = round(time.monotonic() - started, 2)  # servers' imports in
    run.fail(gate_exit(run.measured, options.fail_above))


def _selfcheck(run: _Run) -> None:
    heads = {fid: s for (fid, side), s in run.sources.items() if side == "head" and not isinstance(s, str)}
    fixes, reporter = run.session.fixes, run.session.reporter
    checks = run_selfcheck(fixes, heads, run.runner, run.work, reporter.track, run.req.timeout_s)
    coverage = hunk_coverage(fixes, heads, checks)
    write_selfcheck(run.work, checks, coverage)
    run.fail(0 if selfcheck_passed(checks, coverage) else 1)


def _replay(run: _Run, folder: Path | None) -> None:
    run.replays = upstream_replay(run.session.fixes, run.sources, run.env, run.verdicts, folder, run.session.say)
    files = {f.id: f.to_dict() for r in run.replays for f in r.files}
    run.session.record.details["upstream_tests"] = {"dir": str(folder) if folder else None, "files": files}
    write_files(run.work, run.replays, folder)


def _details(run: _Run) -> dict[str, Any]:
    req = run.req
    return {
        "sides": list(req.sides),
        "source_kind": req.source_kind,
        "repo": req.repo,
        "runner": run.runner.describe(),
        "sources": {s.label: s.identity for s in run.sources.values() if isinstance(s, MaterialisedSource)},
        "environment_digest": run.env.digest,
        "probes": probes_record(),
        # fields a probe returned that the matrix declares nowhere: observed, never judged
        "undeclared_fields": {
            f"{v.id}/{p.probe}": p.undeclared for v in run.verdicts for p in v.probes if p.undeclared
        },
    }


def _reports(run: _Run) -> None:
    if not run.verdicts:
        return
    fail_above = run.req.throughput.fail_above if run.req.throughput else None
    appendix = section(run.replays) if run.replays else ()
    write_reports(run.work, run.verdicts, appendix=appendix, throughput=Measured(run.measured, fail_above))


def _steps(run: _Run, folder: Path | None, replaying: bool) -> None:
    """The run's own steps in order, once the sources are there: observe and judge, time, self-check, replay."""
    _judge(run)
    if run.req.throughput is not None:
        _throughput(run, run.req.throughput)
    if run.req.selfcheck:
        _selfcheck(run)
    if replaying:
        _replay(run, folder)
    run.session.record.details = _details(run) | run.session.record.details


def execute(req: RunRequest, reporter: Reporter | None = None) -> RunOutcome:
    """Run the matrix and write the run folder. Raises :class:`DifflabError` on bad input."""
    _check_request(req)
    session = Session.open("run" if req.both_sides else "observe", req, reporter)
    local = session.runner_class.local_environment
    folder = _upstream_folder(req, session)  # bad input stops the run before it starts
    replaying = req.both_sides and local and (folder is not None or req.source_kind == "git")
    env = session.environment(ensure=False)
    runner = make_runner(req, env, session.reporter)
    with session.folder() as work, started_early(runner):
        run = _Run(session, req, env, runner, work)
        run.sources = materialise_sides(session.fixes, session.sources(), session.say, req.sides, session.matrix.path)
        if local:
            env.ensure(progress=session.say)
        _steps(run, folder, replaying)
        _reports(run)
        session.finish(work, run.exit_code, environment=env.document())
    return RunOutcome(out_dir=session.out, exit_code=run.exit_code, verdicts=run.verdicts, throughput=run.measured)


__all__ = ["RunOutcome", "RunRequest", "default_out", "execute", "make_runner", "started_early"]
