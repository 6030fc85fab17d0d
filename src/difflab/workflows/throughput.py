"""``difflab run --throughput``: each fix's hot path timed on base and head, in interleaved rounds.

Per fix, one bench child per side (:mod:`difflab.probe.bench`), forked from the warm
back end's server for that side's source and kept alive for the whole A/B
(:mod:`difflab.runner.warm_bench`): warm-up rounds (base, head; discarded), then
``rounds`` rounds, each a pair whose order turns about (base, head, head, base ...). Fixes run one after another, so
only one bench process times at a time. Judged by :mod:`difflab.diff.throughput`; the
bench logs' tails are kept in ``throughput/<fix>/<side>.log``.
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from difflab.diff.throughput import ThroughputResult, judge_throughput
from difflab.errors import ConfigError
from difflab.matrix import Fix
from difflab.observation import SIDES
from difflab.paths import probes_dir
from difflab.progress import Reporter
from difflab.report.throughput import THROUGHPUT_DIR, write_log_tail
from difflab.runner.cache import CachingRunner
from difflab.runner.jobs import Sources
from difflab.runner.warm import WarmRunner, WarmUnavailable
from difflab.runner.warm_bench import BenchChild, BenchFailed, BenchJob, WarmBench
from difflab.source import MaterialisedSource
from difflab.stats.compare import DEFAULT_SEED

DEFAULT_ROUNDS = 10
"""Per side. Rounds are judged in pairs: with fewer than 10 no difference can reach p < 0.002
(the Wilcoxon signed-rank test's smallest two-sided p is 2 / 2**n)."""
MIN_SIGNIFICANT_ROUNDS = 10
DEFAULT_SIZES = (10, 100, 1000)
WARMUP_BUDGET = {"min_items": 1, "min_runs": 1, "max_items": 1}
"""A warm-up round builds every load and runs each path once; its samples are discarded."""


@dataclass(frozen=True)
class ThroughputOptions:
    """How the A/B runs (recorded in run.json; ``reproduce`` re-runs with the same)."""

    rounds: int = DEFAULT_ROUNDS
    warmup: int = 1
    sizes: tuple[int, ...] = DEFAULT_SIZES
    fail_above: float | None = None
    """A significant slowdown beyond this factor fails the run; None: informational."""
    min_items: int = 100
    min_runs: int = 3
    max_items: int = 1000
    """One sample (:class:`difflab.probe.bench.Budget`): runs until ``min_items`` items in ``min_runs`` runs,
    or ``max_items`` items (a burst of a thousand rooms is one run)."""
    round_timeout_s: float = 300.0
    seed: int = DEFAULT_SEED

    def __post_init__(self) -> None:
        if self.rounds < 2:
            raise ConfigError(f"--rounds must be at least 2 (got {self.rounds}); rounds are the samples")
        if self.warmup < 0:
            raise ConfigError(f"warm-up rounds must not be negative (got {self.warmup})")
        if len(set(self.sizes)) < 2 or min(self.sizes) < 1:
            raise ConfigError(f"--throughput-sizes needs at least two different positive sizes (got {self.sizes})")
        if self.fail_above is not None and self.fail_above < 1.0:
            raise ConfigError(f"--throughput-fail-above is a slowdown factor >= 1.0 (got {self.fail_above})")

    @property
    def budget(self) -> dict[str, int]:
        return {"min_items": self.min_items, "min_runs": self.min_runs, "max_items": self.max_items}

    def record(self) -> dict[str, Any]:
        data = asdict(self)
        data["sizes"] = list(self.sizes)
        return data

    @classmethod
    def from_record(cls, data: dict[str, Any]) -> ThroughputOptions:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        if "sizes" in known:
            known["sizes"] = tuple(int(s) for s in known["sizes"])
        return cls(**known)


def warm_runner(runner: Any) -> WarmRunner:
    """The warm back end behind ``runner`` (the result cache never answers for a timing)."""
    inner = runner.inner if isinstance(runner, CachingRunner) else runner
    if not isinstance(inner, WarmRunner):
        raise ConfigError(
            f"--throughput runs on the warm back end (two forked processes driven round by round); "
            f"--backend {getattr(inner, 'name', inner)} cannot interleave rounds"
        )
    return inner


@dataclass
class _Plan:
    fix: Fix
    result: ThroughputResult
    jobs: dict[str, BenchJob] = field(default_factory=dict)


def _plan(fix: Fix, sources: Sources, logs: Path, options: ThroughputOptions, probe_dir: Path) -> _Plan:
    labels = {side: sources.get((fix.id, side)) for side in SIDES}
    result = ThroughputResult(
        fix=fix.id,
        label=fix.label,
        status="error",
        probe=fix.throughput,
        base={"label": getattr(labels["base"], "label", None)},
        head={"label": getattr(labels["head"], "label", None)},
        settings=options.record(),
    )
    plan = _Plan(fix, result)
    if fix.throughput is None:
        result.status, result.reason = "unavailable", "the matrix declares no throughput probe for this fix"
        return plan
    probe_file = probe_dir / f"{fix.throughput}.py"
    if not probe_file.is_file():
        result.reason = f"throughput probe file {probe_file} does not exist"
        return plan
    jobs = {}
    for side in SIDES:
        src = labels[side]
        if not isinstance(src, MaterialisedSource):
            result.status, result.reason = "unavailable", f"{side} unavailable: {src}"
            return plan
        log = logs / fix.id / f"{side}.log"
        jobs[side] = BenchJob(fix.id, side, src, probe_file, log, options.round_timeout_s)
    plan.jobs = jobs
    return plan


def _keep_log(job: BenchJob, work: Path) -> None:
    """The tail of a bench child's log beside the results (:func:`difflab.report.throughput.write_log_tail`)."""
    try:
        text = job.log_path.read_text(errors="replace")
    except OSError:
        return
    write_log_tail(work, job.fix_id, job.side, text)


def round_order(index: int) -> tuple[str, ...]:
    """Base first in warm-up and even rounds, head first in odd ones (base, head | head, base | ...).

    A round's two samples form a pair; turning the order about keeps a machine that speeds up
    or slows down within a pair from always favouring the side that runs second.
    """
    return SIDES if index < 0 or index % 2 == 0 else tuple(reversed(SIDES))


def _ab(bench: WarmBench, plan: _Plan, options: ThroughputOptions, reporter: Reporter) -> None:
    """Warm-up, then interleaved rounds; both children stay alive until the last round."""
    result = plan.result
    started, cpu = time.monotonic(), 0.0
    children: dict[str, BenchChild] = {}
    rounds: dict[str, list[dict[str, dict[str, float]]]] = {side: [] for side in SIDES}
    walls: dict[str, list[dict[str, dict[str, float]]]] = {side: [] for side in SIDES}
    try:
        for side in SIDES:
            children[side] = bench.start(plan.jobs[side])
            getattr(result, side).update(sglang_version=children[side].sglang_version)
        described = children["base"].workloads
        if [w["name"] for w in children["head"].workloads] != [w["name"] for w in described]:
            raise BenchFailed("base and head declare different workloads: a probe adapts to a version, never its list")
        total = (options.warmup + options.rounds) * len(SIDES)
        sizes = sorted(options.sizes)
        with reporter.steps(f"throughput {plan.fix.label}", total) as step:
            for index in range(-options.warmup, options.rounds):
                for side in round_order(index):
                    budget = options.budget if index >= 0 else WARMUP_BUDGET
                    reply = bench.round(children[side], index, sizes, budget)
                    cpu += float(reply.get("cpu_s") or 0.0)
                    if index >= 0:
                        rounds[side].append(reply["samples"])
                        walls[side].append(reply.get("samples_wall") or reply["samples"])
                    step(f"{'warm-up' if index < 0 else f'round {index + 1}/{options.rounds}'} {side}")
    finally:
        for child in children.values():
            bench.end(child)
        result.wall_s, result.cpu_s = round(time.monotonic() - started, 2), round(cpu, 2)
    judge_throughput(result, described, rounds["base"], rounds["head"], options.seed, walls)


def _measure_one(bench: WarmBench, plan: _Plan, options: ThroughputOptions, reporter: Reporter, work: Path) -> None:
    """One fix's A/B; a failure is that fix's ``error``, and its bench logs are kept either way."""
    try:
        _ab(bench, plan, options, reporter)
    except (BenchFailed, ValueError) as exc:
        plan.result.status, plan.result.reason = "error", str(exc)
        reporter.say(f"throughput {plan.fix.label}: {str(exc).splitlines()[0]}")
    for job in plan.jobs.values():
        _keep_log(job, work)


def measure_each(
    fixes: list[Fix],
    sources: Sources,
    runner: Any,
    work: Path,
    reporter: Reporter,
    options: ThroughputOptions,
    probe_dir: Path | None = None,
) -> Iterator[ThroughputResult]:
    """Every fix's throughput result in fix order, each as soon as it is judged (a long benchmark keeps what it has).

    Only fixes that declare a throughput probe and have both sides are measured; the others'
    results say why not. ``probe_dir`` holds the throughput probes (default ``probes/throughput/``).
    """
    warm = warm_runner(runner)
    pdir = probe_dir or probes_dir() / THROUGHPUT_DIR
    with tempfile.TemporaryDirectory(prefix="difflab-throughput-") as tmp:
        plans = [_plan(fix, sources, Path(tmp), options, pdir) for fix in fixes]
        needed = [job.source for p in plans for job in p.jobs.values()]
        given = 0
        try:
            with contextlib.ExitStack() as stack:
                bench = stack.enter_context(WarmBench(warm, needed)) if needed else None
                for plan in plans:
                    if plan.jobs and bench is not None:
                        _measure_one(bench, plan, options, reporter, work)
                    given += 1
                    yield plan.result
        except WarmUnavailable as exc:
            for plan in plans[given:]:
                if plan.jobs and plan.result.comparison is None:
                    plan.result.status, plan.result.reason = "error", f"warm back end unavailable: {exc}"
                yield plan.result


def measure(
    fixes: list[Fix],
    sources: Sources,
    runner: Any,
    work: Path,
    reporter: Reporter,
    options: ThroughputOptions,
    probe_dir: Path | None = None,
) -> list[ThroughputResult]:
    """The throughput A/B of every fix that declares a throughput probe and has both sides (:func:`measure_each`)."""
    return list(measure_each(fixes, sources, runner, work, reporter, options, probe_dir))


def gate_exit(results: list[ThroughputResult], fail_above: float | None) -> int:
    """1 if a measurement failed or (with a factor) a fix is significantly slower beyond it; else 0."""
    if any(r.status == "error" for r in results):
        return 1
    return 1 if any(r.fails(fail_above) for r in results) else 0
