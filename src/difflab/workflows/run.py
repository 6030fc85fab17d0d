"""``difflab run`` / ``difflab observe``: matrix → sources → environment → probes → diff → reports → bundle.

The folder is written under a temporary sibling and renamed into place only
when the run completes, so a crashed or interrupted run never replaces a
good result.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from difflab import stats
from difflab.bundle import seal
from difflab.diff.throughput import ThroughputResult
from difflab.diff.verdict import FixVerdict, judge_all
from difflab.environment.shared import SharedEnvironment
from difflab.errors import ConfigError
from difflab.files.atomic import results_folder
from difflab.matrix import Fix, load_matrix
from difflab.observation import SIDES
from difflab.paths import default_results
from difflab.progress import Reporter
from difflab.provenance import probes_record
from difflab.report import write_reports
from difflab.report.record import RunRecord, folder_stamp, is_run_folder, utc_now
from difflab.runner import Runner, build_runner, runner_class
from difflab.runner.jobs import Sources, check_probe_files
from difflab.runner.warm import WarmRunner
from difflab.source import MaterialisedSource, source_class
from difflab.source.sides import Say, materialise_sides, source_label
from difflab.upstream_tests import (
    FixReplay,
    agree_with_run,
    for_run,
    section,
    tests_dir,
    with_flag,
    write_files,
)
from difflab.workflows.observe import ProbeOptions, observe
from difflab.workflows.selfcheck import hunk_coverage, run_selfcheck, selfcheck_passed, write_selfcheck
from difflab.workflows.throughput import ThroughputOptions, gate_exit, measure


@dataclass(kw_only=True)
class RunRequest(ProbeOptions):
    """Everything that determines a run (recorded in run.json, replayed by ``reproduce``)."""

    source_kind: str = "release"
    repo: str | None = None
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
class RunOutcome:
    out_dir: Path
    exit_code: int
    verdicts: list[FixVerdict]
    throughput: list[ThroughputResult] = field(default_factory=list)


def _check_throughput(req: RunRequest) -> None:
    """Refuse a throughput A/B that cannot run before anything is written (exit 2)."""
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
    say = reporter.say if reporter else None
    return build_runner(req.runner, env, req.use_cache, say, **req.runner_options)


@contextlib.contextmanager
def started_early(runner: Runner) -> Iterator[None]:
    """A warm runner's hub imports while the sources are prepared, and is stopped when the run ends.

    Only an uncached warm runner starts early: behind the result cache a run may need no probe at all.
    """
    if not isinstance(runner, WarmRunner):
        yield
        return
    runner.start_early()
    with runner:
        yield


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


def execute(req: RunRequest, reporter: Reporter | None = None) -> RunOutcome:
    """Run the matrix and write the run folder. Raises :class:`DifflabError` on bad input."""
    reporter = reporter or Reporter()
    record = RunRecord(command="run" if req.both_sides else "observe", argv=req.argv)
    if not req.sides or not set(req.sides) <= set(SIDES):
        raise ConfigError(f"--side must be base or head, got {req.sides}")
    _check_throughput(req)
    matrix = load_matrix(req.matrix)
    fixes = matrix.select(req.fixes)
    check_probe_files(fixes, matrix.path)
    record.fixes = [f.id for f in fixes]
    local = runner_class(req.runner).local_environment
    folder = tests_dir(req.upstream_tests) if req.both_sides else None  # bad input stops the run before it starts
    if folder is not None and not local:
        raise ConfigError(f"--upstream-tests runs in the local shared environment; not with --backend {req.runner}")
    replaying = req.both_sides and local and (folder is not None or req.source_kind == "git")
    out = (req.out or default_out()).resolve()
    env = SharedEnvironment()
    runner = make_runner(req, env, reporter)
    with results_folder(out, force=req.force, ours=is_run_folder) as work, started_early(runner):
        backend = source_class(req.source_kind).for_matrix(matrix, req.repo)
        sources = materialise_sides(fixes, backend, reporter.say, req.sides, matrix.path)
        if local:
            env.ensure(progress=reporter.say)
        observed = observe(fixes, sources, runner, work, reporter, req.timeout_s)
        verdicts: list[FixVerdict] = []
        if req.both_sides:
            verdicts = judge_all(fixes, observed, {k: source_label(v) for k, v in sources.items()})
            exit_code = 0 if all(v.passed for v in verdicts) else 1
        else:  # one side of a CI fan-out: verdicts come from `difflab merge`
            exit_code = 0 if all(o.status != "error" for o in observed) else 1
        measured: list[ThroughputResult] = []
        throughput_s = 0.0
        if req.throughput is not None:
            started = time.monotonic()
            measured = measure(fixes, sources, runner, work, reporter, req.throughput)
            throughput_s = time.monotonic() - started
            exit_code = max(exit_code, gate_exit(measured, req.throughput.fail_above))
        if req.selfcheck:
            heads = {fid: s for (fid, side), s in sources.items() if side == "head" and not isinstance(s, str)}
            checks = run_selfcheck(fixes, heads, runner, work, reporter.track, req.timeout_s)
            coverage = hunk_coverage(fixes, heads, checks)
            write_selfcheck(work, checks, coverage)
            if not selfcheck_passed(checks, coverage):
                exit_code = 1
        replays = upstream_replay(fixes, sources, env, verdicts, folder, reporter.say) if replaying else []
        record.details = {
            "sides": list(req.sides),
            "source_kind": req.source_kind,
            "repo": req.repo,
            "runner": runner.describe(),
            "sources": {s.label: s.identity for s in sources.values() if isinstance(s, MaterialisedSource)},
            "environment_digest": env.digest,
            "probes": probes_record(),
            # fields a probe returned that the matrix declares nowhere: observed, never judged
            "undeclared_fields": {
                f"{v.id}/{p.probe}": p.undeclared for v in verdicts for p in v.probes if p.undeclared
            },
        }
        if req.throughput is not None:
            record.details["throughput"] = req.throughput.record()
            record.details["throughput_wall_s"] = round(throughput_s, 2)  # servers' imports included
        if replaying:
            files = {f.id: f.to_dict() for r in replays for f in r.files}
            record.details["upstream_tests"] = {"dir": str(folder) if folder else None, "files": files}
            write_files(work, replays, folder)
        record.write(work, exit_code, matrix=(matrix.path, matrix.sha256), environment=env.document())
        if verdicts:
            fail_above = req.throughput.fail_above if req.throughput else None
            appendix = section(replays) if replays else ()
            write_reports(work, verdicts, appendix=appendix, throughput=measured, fail_above=fail_above)
        if req.bundle:
            seal(work, key=req.key, echo=reporter.say)
    return RunOutcome(out_dir=out, exit_code=exit_code, verdicts=verdicts, throughput=measured)
