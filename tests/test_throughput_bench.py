"""The throughput A/B machinery on toy sources: interleaving, samples, the gate, failures.

Real hub, servers and forked bench children with the host interpreter, against toy
"sources" (a folder holding a module the server preloads): ``fast`` appends to a queue,
``scanning`` scans the whole queue first (an O(n) step per item, the regression a door
check could add). Nothing here depends on how fast the machine is: the tests assert what
was measured (every round, workload and size) and how, and the marks only where recorded
samples stand in for the timed ones. Whether a scan shows as a slowdown is a timing: the
benchmark (``bench/bench_throughput_aa.py``) and ``run --throughput`` report it. A few
seconds in all; the real SGLang hot paths are in ``test_throughput_release.py``.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from difflab.diff.throughput import ThroughputResult, judge_throughput
from difflab.matrix.model import Fix, SidePin
from difflab.progress import Reporter
from difflab.runner.warm import WarmRunner
from difflab.source.base import MaterialisedSource
from difflab.workflows import throughput as workflow
from difflab.workflows.throughput import ThroughputOptions, gate_exit, measure, round_order

QUEUE = """
import os
import time

import toymod
from difflab.probe.bench import Workload


class Queue:
    def __init__(self, n):
        self.items, self.n, self.batch = [object() for _ in range(n)], n, []

    def setup(self):
        self.batch = [object() for _ in range(max(1, self.n // 10))]

    def run(self):
        for x in self.batch:
            if toymod.SCAN:
                any(y is x for y in self.items)
            self.items.append(x)
        return len(self.batch)

    def teardown(self):
        del self.items[self.n :]
        marker = os.path.join(os.path.dirname(__file__), "order-log")  # the caller's variables do not reach here
        log = open(marker).read().strip() if os.path.exists(marker) else None
        if log:
            with open(log, "a") as fh:
                fh.write(toymod.NAME + "\\n")


def workloads(kit):
    return [Workload("queue.add", "items", Queue, "append under load"), Workload("queue.copy", "items", Copy)]


class Copy(Queue):
    def run(self):
        for x in self.batch:
            list(self.items[:10])
        return len(self.batch)
"""

BROKEN = """
from difflab.probe.bench import Workload


class Broken:
    def __init__(self, kit, n):
        self.transport = kit.fake("transport")  # gives nothing

    def setup(self):
        pass

    def run(self):
        self.transport.send(b"x")  # missing on the fake: a probe error, never a number
        return 1

    def teardown(self):
        pass


def workloads(kit):
    return [Workload("broken", "items", lambda n: Broken(kit, n))]
"""

DIES = """
import os

from difflab.probe.bench import Workload


class Dies:
    calls = 0

    def __init__(self, n):
        pass

    def setup(self):
        Dies.calls += 1
        if Dies.calls > 3:
            print("leaving in the middle of a round", flush=True)
            os._exit(3)

    def run(self):
        return 1

    def teardown(self):
        pass


def workloads(kit):
    return [Workload("dies", "items", Dies)]
"""


@dataclass
class HostEnvironment:
    python: Path = field(default_factory=lambda: Path(sys.executable))
    digest: str = "host-test"


def toy_source(lab: Path, name: str, scan: bool) -> MaterialisedSource:
    root = lab / "sources" / name
    root.mkdir(parents=True, exist_ok=True)
    (root / "toymod.py").write_text(f"NAME = {name!r}\nSCAN = {scan}\n")
    return MaterialisedSource(label=name, kind="toy", root=root, identity={"name": name}, digest=f"toy:{name}")


def toy_fix(fix_id: str, probe: str) -> Fix:
    return Fix(
        id=fix_id,
        pr=1,
        title=fix_id,
        base=SidePin(release="base"),
        head=SidePin(release="head"),
        probes=(),
        throughput=probe,
    )


@pytest.fixture
def lab(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("DIFFLAB_CACHE", str(tmp_path / "cache"))
    probes = tmp_path / "throughput"
    probes.mkdir()
    for name, text in {"toy_queue": QUEUE, "toy_broken": BROKEN, "toy_dies": DIES}.items():
        (probes / f"{name}.py").write_text(text)
    return tmp_path


def run(lab: Path, plan: dict[str, tuple[str, MaterialisedSource, MaterialisedSource]], **options) -> list:
    fixes = [toy_fix(fix_id, probe) for fix_id, (probe, _b, _h) in plan.items()]
    sources = {(f, side): src for f, (_p, b, h) in plan.items() for side, src in (("base", b), ("head", h))}
    settings = {"rounds": 7, "sizes": (10, 1000), "min_items": 20, "min_runs": 3, "max_items": 200} | options
    runner = WarmRunner(environment=HostEnvironment(), hub_preload=(), server_preload=("toymod",), learn=False)
    with runner:
        options = ThroughputOptions(**settings)
        return measure(fixes, sources, runner, lab / "work", Reporter(), options, lab / "throughput")


def by_fix(results: list[ThroughputResult]) -> dict[str, ThroughputResult]:
    return {r.fix: r for r in results}


def test_the_a_b_produces_paired_rounds_of_every_workload_and_size_and_judges_exactly_those(lab: Path) -> None:
    """What the machinery guarantees whatever this machine's speed; which mark comes out is a timing.

    A head that scans against one that does not (the slowdown the benchmark and ``run --throughput``
    report): here only that every round of every workload and size was measured, the samples are
    CPU seconds per item, and the result is the judgment of exactly those samples.
    """
    fast, scanning = toy_source(lab, "fast", False), toy_source(lab, "scanning", True)
    (slowed,) = run(lab, {"slowed": ("toy_queue", fast, scanning)}, rounds=4)
    assert slowed.status == "ok", slowed.reason
    assert [w.name for w in slowed.workloads] == ["queue.add", "queue.copy"]
    assert [w.what for w in slowed.workloads] == ["append under load", ""]
    for side in ("base", "head"):
        rounds = slowed.samples[side]
        assert len(rounds) == 4 and len(slowed.samples["wall"][side]) == 4
        for one in rounds:
            assert set(one) == {"queue.add", "queue.copy"}
            assert all(set(cells) == {"10", "1000"} for cells in one.values())
            assert all(0.0 < v < 1.0 for cells in one.values() for v in cells.values())  # seconds per item
    again = judge_throughput(
        ThroughputResult(fix="slowed", label="slowed", status="error"),
        [{"name": w.name, "unit": w.unit, "what": w.what} for w in slowed.workloads],
        slowed.samples["base"],
        slowed.samples["head"],
        ThroughputOptions().seed,
        slowed.samples["wall"],
    )
    judged = ("mark", "outcome", "ratio", "ci", "spread", "p_value", "exponent", "workloads", "wall_clock", "samples")
    assert {k: again.to_dict()[k] for k in judged} == {k: slowed.to_dict()[k] for k in judged}
    assert slowed.comparison.p_value >= 2 / 2**4  # four pairs can never be significant
    assert slowed.mark in ("~", "?") and not slowed.fails(1.0)
    assert slowed.settings["rounds"] == 4 and slowed.wall_s > 0 and slowed.cpu_s > 0
    assert (lab / "work" / "throughput" / "slowed" / "head.log").is_file()


def test_the_gate_applies_the_judgement_of_the_samples(lab: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Recorded samples in place of the timed ones: the marks and the gate are then exact."""
    slow = [{"queue.add": {"10": 2e-6, "1000": 3e-6}, "queue.copy": {"10": 1e-6, "1000": 1e-6}}] * 10
    fast = [{"queue.add": {"10": 1e-6, "1000": 1e-6}, "queue.copy": {"10": 1e-6, "1000": 1e-6}}] * 10
    recorded = {"slowed": (fast, slow), "same": (fast, fast)}

    def judge_recorded(result, described, base, head, seed, wall=None):
        assert len(base) == len(head) == 10  # what the bench measured, in shape
        b, h = recorded[result.fix]
        return judge_throughput(result, described, b, h, seed)

    monkeypatch.setattr(workflow, "judge_throughput", judge_recorded)
    fast_src, scanning = toy_source(lab, "fast", False), toy_source(lab, "scanning", True)
    plan = {"slowed": ("toy_queue", fast_src, scanning), "same": ("toy_queue", fast_src, fast_src)}
    results = by_fix(run(lab, plan, rounds=10))
    slowed, same = results["slowed"], results["same"]
    assert slowed.mark == "+" and slowed.ratio == pytest.approx(math.sqrt(math.sqrt(2 * 3)))
    assert slowed.comparison.p_value == pytest.approx(2 / 2**10)
    add, copy = slowed.workloads
    assert add.mark == "+" and add.sizes["1000"]["ratio"] == pytest.approx(3.0) and copy.mark == "~"
    assert same.mark == "~" and same.ratio == 1.0
    assert slowed.fails(1.10) and not slowed.fails(None) and not same.fails(1.10)
    assert gate_exit([slowed, same], 1.10) == 1
    assert gate_exit([slowed, same], None) == 0  # informational by default
    assert gate_exit([same], 1.10) == 0


def test_rounds_turn_the_order_about_after_the_warm_up(lab: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    order = lab / "order.txt"
    (lab / "throughput" / "order-log").write_text(str(order))
    run(lab, {"f": ("toy_queue", toy_source(lab, "a", False), toy_source(lab, "b", False))}, rounds=3)
    blocks: list[str] = []
    for name in order.read_text().split():
        if not blocks or blocks[-1] != name:
            blocks.append(name)
    # warm-up a b, then the pairs a b | b a | a b: each side's round in one block, the order turned about
    assert blocks == ["a", "b", "a", "b", "a", "b"]
    expected = [("base", "head"), ("base", "head"), ("head", "base"), ("base", "head")]
    assert [round_order(i) for i in (-1, 0, 1, 2)] == expected


def test_a_broken_fake_or_a_dead_bench_is_an_error_and_the_next_fix_still_runs(lab: Path) -> None:
    src = toy_source(lab, "a", False)
    results = by_fix(
        run(lab, {"broken": ("toy_broken", src, src), "dies": ("toy_dies", src, src), "fine": ("toy_queue", src, src)})
    )
    assert results["broken"].status == "error" and "transport.send" in results["broken"].reason
    assert results["dies"].status == "error" and "exit 3" in results["dies"].reason
    assert "leaving in the middle of a round" in results["dies"].reason  # the log's tail
    assert results["fine"].status == "ok"
    assert gate_exit(list(results.values()), None) == 1  # a measurement that failed fails the run


def test_missing_probe_file_and_unavailable_side(lab: Path) -> None:
    src = toy_source(lab, "a", False)
    fixes = [toy_fix("nofile", "no_such_probe"), toy_fix("nohead", "toy_queue"), toy_fix("none", "x")]
    fixes[2] = Fix(**{**fixes[2].__dict__, "throughput": None})
    sources = {("nofile", "base"): src, ("nofile", "head"): src, ("nohead", "base"): src, ("nohead", "head"): "gone"}
    runner = WarmRunner(environment=HostEnvironment(), hub_preload=(), server_preload=("toymod",), learn=False)
    with runner:
        measured = measure(fixes, sources, runner, lab / "w", Reporter(), ThroughputOptions(), lab / "throughput")
    results = by_fix(measured)
    assert results["nofile"].status == "error" and "does not exist" in results["nofile"].reason
    assert results["nohead"].status == "unavailable" and "gone" in results["nohead"].reason
    assert results["none"].status == "unavailable"
