"""``run --throughput``'s A/B plan and loop (:mod:`difflab.workflows.throughput`) against a scripted bench.

The warm back end's bench (:class:`difflab.runner.warm_bench.WarmBench`) is replaced by a recording one
that answers every round at once with samples chosen per side, and the clock by a counter, so what the
loop decides is exact: which rounds run in which order with which budget and sizes, which samples are
judged, what is recorded per side, that both children end whatever fails, which error a fix gets and
that the fixes after a lost hub are errors while those never measured keep their own reason. The real
hub and bench children are exercised in ``test_throughput_bench.py`` and ``test_workflow_exits.py``.
"""

from __future__ import annotations

import contextlib
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from difflab.errors import ConfigError
from difflab.matrix.model import Fix, SidePin
from difflab.progress import Reporter
from difflab.report.throughput import LOG_LINES
from difflab.runner.cache import CachingRunner
from difflab.runner.subprocess import SubprocessRunner
from difflab.runner.warm import WarmRunner, WarmUnavailable
from difflab.runner.warm_bench import BenchChild, BenchFailed, BenchJob
from difflab.source.base import MaterialisedSource
from difflab.workflows import throughput as workflow
from difflab.workflows.throughput import ThroughputOptions, gate_exit, measure, measure_each, warm_runner

WORKLOADS = [{"name": "door.admit", "unit": "requests", "what": "a door"}, {"name": "door.scan", "unit": "requests"}]
QUICK = ThroughputOptions(rounds=4, warmup=1, sizes=(100, 10), min_items=7, min_runs=2, max_items=70)


@dataclass
class HostEnvironment:
    python: Path = field(default_factory=lambda: Path(sys.executable))
    digest: str = "host-test"


def warm() -> WarmRunner:
    """A warm back end that is never entered: the scripted bench stands in for its hub."""
    return WarmRunner(environment=HostEnvironment(), hub_preload=(), server_preload=(), learn=False)


def source(tmp_path: Path, name: str) -> MaterialisedSource:
    root = tmp_path / "sources" / name
    root.mkdir(parents=True, exist_ok=True)
    return MaterialisedSource(label=name, kind="toy", root=root, identity={"name": name}, digest=f"toy:{name}")


def fix(fix_id: str, probe: str | None = "toy_bench") -> Fix:
    pins = {"base": SidePin(release="0.5.20"), "head": SidePin(release="0.5.21")}
    return Fix(id=fix_id, pr=int(fix_id), title=f"door {fix_id}", probes=(), throughput=probe, **pins)


@pytest.fixture
def probes(tmp_path: Path) -> Path:
    folder = tmp_path / "throughput-probes"
    folder.mkdir()
    (folder / "toy_bench.py").write_text('"""Read by the scripted bench only by its path."""\n')
    return folder


def samples(side: str, index: int, sizes: list[int]) -> dict[str, dict[str, float]]:
    """Head twice as slow as base at every size, a little different each round (so the ranks have no ties)."""
    per_item = (2e-6 if side == "head" else 1e-6) * (1 + index / 100)
    return {w["name"]: {str(n): per_item * (1 + n / 1e4) for n in sizes} for w in WORKLOADS}


@dataclass
class ScriptedBench:
    """In place of ``WarmBench``: records every call, answers each round from :func:`samples`.

    ``fail_round`` (side, index) raises ``BenchFailed`` there; ``lose_hub_at`` (fix, side, index)
    raises ``WarmUnavailable`` there; ``enter_fails`` the hub at the start.
    """

    runner: Any
    sources: list[MaterialisedSource]
    script: Script
    calls: list[tuple[Any, ...]] = field(default_factory=list)

    def __enter__(self) -> ScriptedBench:
        self.script.benches.append(self)
        if self.script.enter_fails:
            raise WarmUnavailable("the hub never answered")
        self.calls.append(("enter",))
        return self

    def __exit__(self, *exc: object) -> None:
        self.calls.append(("exit",))

    def start(self, job: BenchJob) -> BenchChild:
        self.calls.append(("start", job.fix_id, job.side))
        job.log_path.parent.mkdir(parents=True, exist_ok=True)
        job.log_path.write_text("".join(f"{job.side} line {i}\n" for i in range(self.script.log_lines)))
        if (job.fix_id, job.side) in self.script.fail_start:
            raise BenchFailed(f"{job.side} {job.source.label}: the probe could not build its loads\nTraceback ...")
        workloads = self.script.head_workloads if job.side == "head" and self.script.head_workloads else WORKLOADS
        version = f"0.0.{len(self.calls)}-{job.side}"
        return BenchChild(
            job=job, key=f"bench-{job.side}", server="s", workloads=list(workloads), sglang_version=version
        )

    def round(self, child: BenchChild, index: int, sizes: list[int], budget: dict[str, int]) -> dict[str, Any]:
        side = child.job.side
        self.calls.append(("round", child.job.fix_id, side, index, list(sizes), dict(budget)))
        if (child.job.fix_id, side, index) == self.script.lose_hub_at:
            raise WarmUnavailable("the hub died")
        if (side, index) == self.script.fail_round:
            raise BenchFailed(f"{side} round {index}: the door is gone\nmore detail")
        cpu = self.script.cpu.get(side, 0.125)
        reply: dict[str, Any] = {"samples": samples(side, index, sizes), "cpu_s": cpu}
        if self.script.wall:
            reply["samples_wall"] = samples(side, index + 50, sizes)
        return reply

    def end(self, child: BenchChild) -> None:
        self.calls.append(("end", child.job.fix_id, child.job.side))


@dataclass
class Script:
    """What the scripted bench does, and every bench the loop made."""

    fail_start: set[tuple[str, str]] = field(default_factory=set)
    fail_round: tuple[str, int] | None = None
    lose_hub_at: tuple[str, str, int] | None = None
    enter_fails: bool = False
    head_workloads: list[dict[str, str]] | None = None
    wall: bool = True
    cpu: dict[str, float | None] = field(default_factory=dict)
    log_lines: int = 3
    benches: list[ScriptedBench] = field(default_factory=list)
    made: list[tuple[Any, list[str]]] = field(default_factory=list)

    def bench(self, runner: Any, sources: list[MaterialisedSource]) -> ScriptedBench:
        self.made.append((runner, [s.label for s in sources]))
        return ScriptedBench(runner, sources, self)


class Clock:
    """``time.monotonic`` that moves 1.25 s at every reading."""

    def __init__(self) -> None:
        self.now = 100.0

    def monotonic(self) -> float:
        self.now += 1.25
        return self.now


class Said(Reporter):
    """A reporter that keeps what it said and every step of every bar."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []
        self.bars: list[tuple[str, int, list[str]]] = []

    def say(self, message: str) -> None:
        self.lines.append(message)

    @contextlib.contextmanager
    def steps(self, label: str, total: int) -> Iterator[Callable[[str], None]]:
        done: list[str] = []
        self.bars.append((label, total, done))
        yield done.append


@pytest.fixture
def script(monkeypatch: pytest.MonkeyPatch) -> Script:
    scripted = Script()
    monkeypatch.setattr(workflow, "WarmBench", scripted.bench)
    monkeypatch.setattr(workflow, "time", Clock())
    return scripted


def sources_of(tmp_path: Path, *fix_ids: str) -> dict[tuple[str, str], Any]:
    base, head = source(tmp_path, "base-src"), source(tmp_path, "head-src")
    return {(f, side): src for f in fix_ids for side, src in (("base", base), ("head", head))}


def rounds_of(bench: ScriptedBench, fix_id: str = "1") -> list[tuple[str, int]]:
    return [(c[2], c[3]) for c in bench.calls if c[0] == "round" and c[1] == fix_id]


# -- one fix's A/B: the rounds, the samples judged, what is recorded ---------------------------------------------
def test_the_a_b_warms_up_then_turns_the_order_about_with_the_rounds_budget_and_sorted_sizes(
    tmp_path: Path, probes: Path, script: Script
) -> None:
    said = Said()
    (result,) = measure([fix("1")], sources_of(tmp_path, "1"), warm(), tmp_path / "work", said, QUICK, probes)
    assert result.status == "ok", result.reason
    (bench,) = script.benches
    assert rounds_of(bench) == [
        ("base", -1), ("head", -1),
        ("base", 0), ("head", 0), ("head", 1), ("base", 1), ("base", 2), ("head", 2), ("head", 3), ("base", 3),
    ]  # fmt: skip
    rounds = [c for c in bench.calls if c[0] == "round"]
    assert {tuple(c[4]) for c in rounds} == {(10, 100)}  # smallest first, whatever order they were given in
    warmup = {"min_items": 1, "min_runs": 1, "max_items": 1}
    assert [c[5] for c in rounds[:2]] == [warmup, warmup]
    assert all(c[5] == {"min_items": 7, "min_runs": 2, "max_items": 70} for c in rounds[2:])
    # both children start before the first round, and end after the last
    assert bench.calls[:3] == [("enter",), ("start", "1", "base"), ("start", "1", "head")]
    assert bench.calls[-3:] == [("end", "1", "base"), ("end", "1", "head"), ("exit",)]
    (label, total, steps) = said.bars[0]
    assert (label, total) == ("throughput #1", 10) and len(said.bars) == 1
    assert steps[:3] == ["warm-up base", "warm-up head", "round 1/4 base"] and steps[-1] == "round 4/4 base"
    assert len(steps) == total and said.lines == []


def test_the_a_b_judges_the_timed_rounds_only_and_records_each_sides_version_cpu_and_wall(
    tmp_path: Path, probes: Path, script: Script
) -> None:
    script.cpu = {"base": 0.125, "head": None}  # a reply without CPU time counts none
    (result,) = measure([fix("1")], sources_of(tmp_path, "1"), warm(), tmp_path / "work", Said(), QUICK, probes)
    assert result.samples["base"] == [samples("base", i, [10, 100]) for i in range(4)]
    assert result.samples["head"] == [samples("head", i, [10, 100]) for i in range(4)]
    assert result.samples["wall"] == {s: [samples(s, i + 50, [10, 100]) for i in range(4)] for s in ("base", "head")}
    assert [w.name for w in result.workloads] == ["door.admit", "door.scan"] and result.ratio > 1.9
    assert result.base == {"label": "base-src", "sglang_version": "0.0.2-base"}
    assert result.head == {"label": "head-src", "sglang_version": "0.0.3-head"}
    assert (result.fix, result.label, result.probe) == ("1", "#1", "toy_bench")
    assert result.settings == QUICK.record()
    assert result.cpu_s == 0.62  # five base rounds of 0.125 s (warm-up included), rounded to 0.01
    assert result.wall_s == 1.25  # the clock read once before the first child and once after the last


def test_without_wall_samples_the_wall_comparison_is_the_cpu_one(tmp_path: Path, probes: Path, script: Script) -> None:
    script.wall = False
    (result,) = measure([fix("1")], sources_of(tmp_path, "1"), warm(), tmp_path / "work", Said(), QUICK, probes)
    assert result.status == "ok" and result.samples["wall"] == {s: result.samples[s] for s in ("base", "head")}


def test_no_warm_up_rounds_when_none_are_asked(tmp_path: Path, probes: Path, script: Script) -> None:
    options = ThroughputOptions(rounds=2, warmup=0, sizes=(1, 2))
    said = Said()
    (result,) = measure([fix("1")], sources_of(tmp_path, "1"), warm(), tmp_path / "w", said, options, probes)
    assert rounds_of(script.benches[0]) == [("base", 0), ("head", 0), ("head", 1), ("base", 1)]
    assert said.bars[0][1] == 4 and result.samples["base"][0] == samples("base", 0, [1, 2])


def test_the_bench_logs_tails_are_kept_beside_the_results(tmp_path: Path, probes: Path, script: Script) -> None:
    script.log_lines = LOG_LINES + 5
    work = tmp_path / "work"
    measure([fix("1")], sources_of(tmp_path, "1"), warm(), work, Said(), QUICK, probes)
    for side in ("base", "head"):
        kept = (work / "throughput" / "1" / f"{side}.log").read_text().splitlines()
        assert kept[0] == "[5 earlier lines not kept]" and kept[-1] == f"{side} line {LOG_LINES + 4}"


# -- a failing fix: its error, both children ended, its logs kept, the next fix still measured ------------------------
def test_a_failed_round_is_that_fixs_error_and_both_children_still_end(
    tmp_path: Path, probes: Path, script: Script
) -> None:
    script.fail_round = ("head", 1)
    said, work = Said(), tmp_path / "work"
    (result,) = measure([fix("1")], sources_of(tmp_path, "1"), warm(), work, said, QUICK, probes)
    assert result.status == "error" and result.reason == "head round 1: the door is gone\nmore detail"
    assert said.lines == ["throughput #1: head round 1: the door is gone"]  # the first line only
    (bench,) = script.benches
    assert [c for c in bench.calls if c[0] == "end"] == [("end", "1", "base"), ("end", "1", "head")]
    assert rounds_of(bench)[-1] == ("head", 1) and result.comparison is None
    assert result.cpu_s == 0.5 and result.wall_s == 1.25  # what ran until then: two warm-up rounds and two timed
    assert (work / "throughput" / "1" / "head.log").read_text() == "head line 0\nhead line 1\nhead line 2\n"


def test_a_child_that_cannot_start_ends_the_one_already_started(tmp_path: Path, probes: Path, script: Script) -> None:
    script.fail_start = {("1", "head")}
    work = tmp_path / "work"
    (result,) = measure([fix("1")], sources_of(tmp_path, "1"), warm(), work, Said(), QUICK, probes)
    assert result.status == "error" and result.reason.startswith("head head-src: the probe could not build its loads")
    calls = script.benches[0].calls
    assert ("end", "1", "base") in calls and ("end", "1", "head") not in calls and rounds_of(script.benches[0]) == []
    assert result.base["sglang_version"] == "0.0.2-base" and "sglang_version" not in result.head
    assert (work / "throughput" / "1" / "base.log").is_file() and (work / "throughput" / "1" / "head.log").is_file()


def test_base_and_head_declaring_different_workloads_is_an_error_before_any_round(
    tmp_path: Path, probes: Path, script: Script
) -> None:
    script.head_workloads = [WORKLOADS[1], WORKLOADS[0]]  # the same names in another order is another list
    (result,) = measure([fix("1")], sources_of(tmp_path, "1"), warm(), tmp_path / "w", Said(), QUICK, probes)
    assert result.status == "error" and result.reason == (
        "base and head declare different workloads: a probe adapts to a version, never its list"
    )
    assert rounds_of(script.benches[0]) == [] and result.cpu_s == 0.0


def test_a_log_that_was_never_written_is_simply_not_kept(tmp_path: Path, probes: Path, script: Script) -> None:
    """The base child fails to build and its log is removed: nothing to keep there, the head's still kept."""
    script.fail_start = {("1", "base")}
    work = tmp_path / "work"
    real = ScriptedBench.start

    def start_and_lose_the_log(self: ScriptedBench, job: BenchJob) -> BenchChild:
        try:
            return real(self, job)
        finally:
            job.log_path.unlink()

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ScriptedBench, "start", start_and_lose_the_log)
        (result,) = measure([fix("1")], sources_of(tmp_path, "1"), warm(), work, Said(), QUICK, probes)
    assert result.status == "error" and not (work / "throughput" / "1").exists()


# -- which fixes are measured, and what the others say ---------------------------------------------------------------
def test_fixes_without_a_probe_a_probe_file_or_a_side_say_why_and_start_no_child(
    tmp_path: Path, probes: Path, script: Script
) -> None:
    fixes = [fix("1", None), fix("2", "no_such_probe"), fix("3"), fix("4"), fix("5")]
    sources = sources_of(tmp_path, "1", "2", "3", "4", "5")
    sources[("3", "head")] = "no release carries it"
    sources[("4", "base")] = "older than every pin"
    del sources[("4", "head")]
    said = Said()
    results = {r.fix: r for r in measure(fixes, sources, warm(), tmp_path / "w", said, QUICK, probes)}
    assert {k: (r.status, r.reason) for k, r in results.items() if k != "5"} == {
        "1": ("unavailable", "the matrix declares no throughput probe for this fix"),
        "2": ("error", f"throughput probe file {probes / 'no_such_probe.py'} does not exist"),
        "3": ("unavailable", "head unavailable: no release carries it"),
        "4": ("unavailable", "base unavailable: older than every pin"),
    }
    assert results["5"].status == "ok" and [b[0] for b in said.bars] == ["throughput #5"]
    assert results["3"].base == {"label": "base-src"} and results["3"].head == {"label": None}
    assert all(r.settings == QUICK.record() for r in results.values())
    (made,) = script.made
    assert made[1] == ["base-src", "head-src"]  # only the measured fix's sources are served
    assert {c[1] for c in script.benches[0].calls if c[0] == "start"} == {"5"}


def test_no_bench_starts_when_no_fix_can_be_measured(tmp_path: Path, probes: Path, script: Script) -> None:
    results = measure([fix("1", None), fix("2", "missing")], {}, warm(), tmp_path / "w", Said(), QUICK, probes)
    assert [r.status for r in results] == ["unavailable", "error"] and script.made == []


def test_the_probes_come_from_the_labs_throughput_folder_by_default(
    tmp_path: Path, probes: Path, script: Script, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DIFFLAB_PROBES", str(tmp_path / "lab-probes"))
    (tmp_path / "lab-probes").mkdir()
    probes.rename(tmp_path / "lab-probes" / "throughput")
    (result,) = measure([fix("1")], sources_of(tmp_path, "1"), warm(), tmp_path / "w", Said(), QUICK)
    assert result.status == "ok"
    (job,) = [c for c in script.benches[0].calls if c[0] == "start"][:1]
    assert job == ("start", "1", "base")


def test_each_bench_job_carries_the_fix_side_source_probe_log_and_round_timeout(
    tmp_path: Path, probes: Path, script: Script, monkeypatch: pytest.MonkeyPatch
) -> None:
    jobs: list[BenchJob] = []
    real = ScriptedBench.start

    def keep(self: ScriptedBench, job: BenchJob) -> BenchChild:
        jobs.append(job)
        return real(self, job)

    monkeypatch.setattr(ScriptedBench, "start", keep)
    options = ThroughputOptions(rounds=2, sizes=(1, 2), round_timeout_s=42.5)
    sources = sources_of(tmp_path, "1")
    measure([fix("1")], sources, warm(), tmp_path / "w", Said(), options, probes)
    base, head = jobs
    assert (base.fix_id, base.side, base.source, base.probe_file) == (
        "1",
        "base",
        sources[("1", "base")],
        probes / "toy_bench.py",
    )
    assert (head.side, head.source, head.timeout_s, base.timeout_s) == ("head", sources[("1", "head")], 42.5, 42.5)
    assert (
        base.log_path.parts[-2:] == ("1", "base.log")
        and base.log_path.parent.parent.name.startswith("difflab-throughput-")
        and head.log_path.parts[-2:] == ("1", "head.log")
    )
    assert base.log_path.parent == head.log_path.parent and not base.log_path.is_relative_to(tmp_path / "w")
    assert not base.log_path.exists()  # a temporary folder, removed with the A/B


def test_each_result_is_given_as_soon_as_its_fix_is_judged(tmp_path: Path, probes: Path, script: Script) -> None:
    results = measure_each(
        [fix("1"), fix("2")], sources_of(tmp_path, "1", "2"), warm(), tmp_path / "w", Said(), QUICK, probes
    )
    first = next(results)
    assert first.fix == "1" and first.status == "ok"
    assert {c[1] for c in script.benches[0].calls if c[0] == "start"} == {"1"}  # fix 2 not started yet
    second = next(results)
    assert second.fix == "2" and second.status == "ok"
    assert list(results) == [] and script.benches[0].calls[-1] == ("exit",)


def test_a_lost_hub_is_the_error_of_every_fix_still_to_measure_and_no_other(
    tmp_path: Path, probes: Path, script: Script
) -> None:
    script.lose_hub_at = ("2", "head", 0)
    fixes = [fix("1"), fix("2"), fix("3", None), fix("4")]
    results = measure(fixes, sources_of(tmp_path, "1", "2", "3", "4"), warm(), tmp_path / "w", Said(), QUICK, probes)
    assert [(r.fix, r.status) for r in results] == [("1", "ok"), ("2", "error"), ("3", "unavailable"), ("4", "error")]
    assert results[1].reason == results[3].reason == "warm back end unavailable: the hub died"
    assert results[0].comparison is not None and results[2].reason.startswith("the matrix declares no")
    assert ("end", "2", "base") in script.benches[0].calls and not any(
        c[1:2] == ("4",) for c in script.benches[0].calls
    )


def test_a_hub_that_never_starts_is_every_measurable_fixs_error(tmp_path: Path, probes: Path, script: Script) -> None:
    script.enter_fails = True
    fixes = [fix("1"), fix("2", None)]
    results = measure(fixes, sources_of(tmp_path, "1", "2"), warm(), tmp_path / "w", Said(), QUICK, probes)
    assert [(r.fix, r.status, r.reason) for r in results] == [
        ("1", "error", "warm back end unavailable: the hub never answered"),
        ("2", "unavailable", "the matrix declares no throughput probe for this fix"),
    ]


# -- the back end, the options and the gate ---------------------------------------------------------------------
def test_the_ab_runs_on_the_warm_back_end_behind_the_result_cache(tmp_path: Path) -> None:
    runner = warm()
    assert warm_runner(runner) is runner
    assert warm_runner(CachingRunner(runner, HostEnvironment(), cache_dir=tmp_path)) is runner
    other = SubprocessRunner(environment=HostEnvironment())
    message = (
        "--throughput runs on the warm back end (two forked processes driven round by round); "
        "--backend subprocess cannot interleave rounds"
    )
    for wrapped in (other, CachingRunner(other, HostEnvironment(), cache_dir=tmp_path)):
        with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
            warm_runner(wrapped)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"rounds": 1}, "--rounds must be at least 2 (got 1); rounds are the samples"),
        ({"warmup": -1}, "warm-up rounds must not be negative (got -1)"),
        ({"sizes": (7, 7)}, "--throughput-sizes needs at least two different positive sizes (got (7, 7))"),
        ({"sizes": (5,)}, "--throughput-sizes needs at least two different positive sizes (got (5,))"),
        ({"sizes": (0, 10)}, "--throughput-sizes needs at least two different positive sizes (got (0, 10))"),
        ({"fail_above": 0.99}, "--throughput-fail-above is a slowdown factor >= 1.0 (got 0.99)"),
    ],
)
def test_options_that_cannot_be_measured_are_refused_naming_the_flag(changes: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
        ThroughputOptions(**changes)


def test_the_least_options_that_can_be_measured_are_accepted() -> None:
    least = ThroughputOptions(rounds=2, warmup=0, sizes=(1, 2), fail_above=1.0)
    assert (least.rounds, least.warmup, least.sizes, least.fail_above) == (2, 0, (1, 2), 1.0)


def test_the_options_are_recorded_and_read_back_as_they_were() -> None:
    options = ThroughputOptions(rounds=12, warmup=2, sizes=(10, 300), fail_above=1.25, min_items=9, seed=7)
    record = options.record()
    assert record == {
        "rounds": 12,
        "warmup": 2,
        "sizes": [10, 300],
        "fail_above": 1.25,
        "min_items": 9,
        "min_runs": 3,
        "max_items": 1000,
        "round_timeout_s": 300.0,
        "seed": 7,
    }
    assert options.budget == {"min_items": 9, "min_runs": 3, "max_items": 1000}
    again = ThroughputOptions.from_record({**record, "sizes": ["10", "300"], "written_by": "a later lab"})
    assert again == options and again.sizes == (10, 300)
    assert ThroughputOptions.from_record({"rounds": 3}) == ThroughputOptions(rounds=3)


def test_the_gate_fails_on_any_error_and_on_a_slowdown_only_with_a_factor(
    tmp_path: Path, probes: Path, script: Script
) -> None:
    slower, same = measure(
        [fix("1"), fix("2", None)],
        sources_of(tmp_path, "1", "2"),
        warm(),
        tmp_path / "w",
        Said(),
        ThroughputOptions(rounds=10, sizes=(1, 2)),
        probes,
    )
    assert slower.mark == "+" and slower.ratio > 1.9 and same.status == "unavailable"
    assert gate_exit([slower, same], None) == 0  # informational without a factor
    assert gate_exit([slower, same], 2.5) == 0 and gate_exit([same, slower], 1.5) == 1
    failed = type(same)(fix="3", label="#3", status="error", reason="broken")
    assert gate_exit([same, failed], None) == 1 and gate_exit([failed], 10.0) == 1
    assert gate_exit([], 1.0) == 0


# -- what the loop hands on: the options' seed, its own clock, a log's odd bytes, the fixes it already gave ------------
def test_the_a_b_is_judged_with_the_options_seed(
    tmp_path: Path, probes: Path, script: Script, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bootstrap's seed is the one recorded in run.json, so ``reproduce`` draws the same interval."""
    seeds: list[int] = []
    real = workflow.judge_throughput

    def judge(result: Any, described: Any, base: Any, head: Any, seed: int, wall: Any = None) -> Any:
        seeds.append(seed)
        return real(result, described, base, head, seed, wall)

    monkeypatch.setattr(workflow, "judge_throughput", judge)
    options = ThroughputOptions(rounds=4, warmup=0, sizes=(10, 100), seed=12345)
    (result,) = measure([fix("1")], sources_of(tmp_path, "1"), warm(), tmp_path / "w", Said(), options, probes)
    assert result.status == "ok" and seeds == [12345]


def test_the_a_bs_wall_time_is_read_to_the_hundredth(
    tmp_path: Path, probes: Path, script: Script, monkeypatch: pytest.MonkeyPatch
) -> None:
    readings = iter([10.0, 11.23456])
    monkeypatch.setattr(workflow, "time", SimpleNamespace(monotonic=lambda: next(readings)))
    (result,) = measure([fix("1")], sources_of(tmp_path, "1"), warm(), tmp_path / "w", Said(), QUICK, probes)
    assert result.status == "ok" and result.wall_s == 1.23


def test_a_log_with_bytes_that_are_not_utf8_is_kept_with_them_replaced(
    tmp_path: Path, probes: Path, script: Script, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = ScriptedBench.start

    def start_with_odd_bytes(self: ScriptedBench, job: BenchJob) -> BenchChild:
        child = real(self, job)
        job.log_path.write_bytes(b"a native crash: \xff\xfe\n")
        return child

    monkeypatch.setattr(ScriptedBench, "start", start_with_odd_bytes)
    work = tmp_path / "work"
    (result,) = measure([fix("1")], sources_of(tmp_path, "1"), warm(), work, Said(), QUICK, probes)
    assert result.status == "ok"
    for side in ("base", "head"):
        assert (work / "throughput" / "1" / f"{side}.log").read_text() == "a native crash: \ufffd\ufffd\n"


def test_a_lost_hub_leaves_the_error_of_a_fix_already_given_as_it_was(
    tmp_path: Path, probes: Path, script: Script
) -> None:
    """Fix 2 failed on its own before the hub was lost at fix 3: its reason stays its own."""
    script.fail_start = {("2", "base")}
    script.lose_hub_at = ("3", "head", 0)
    fixes = [fix("1"), fix("2"), fix("3"), fix("4")]
    results = measure(fixes, sources_of(tmp_path, "1", "2", "3", "4"), warm(), tmp_path / "w", Said(), QUICK, probes)
    assert [(r.fix, r.status) for r in results] == [("1", "ok"), ("2", "error"), ("3", "error"), ("4", "error")]
    assert results[1].reason.startswith("base base-src: the probe could not build its loads")
    assert results[2].reason == results[3].reason == "warm back end unavailable: the hub died"


def test_a_back_end_without_a_name_is_named_by_what_it_is() -> None:
    class Plain:
        def __repr__(self) -> str:
            return "<a plain runner>"

    with pytest.raises(ConfigError, match=r"--backend <a plain runner> cannot interleave rounds$"):
        warm_runner(Plain())
