"""A throughput sample is CPU seconds per item, so a CPU clock that does not advance over a run is no sample.

Linux makes a process's CPU clock tick-grained while a CPU-time limit is armed (``ulimit -t``, or a
test runner's limit): a run of a few milliseconds then reads 0 CPU seconds. The bench says so, naming
the workload and size, instead of handing zeros on to a ratio ("a geometric mean needs positive values").
"""

from __future__ import annotations

import itertools

import pytest

from difflab.probe import bench
from difflab.probe.bench import Budget, Measurer, Workload
from difflab.probe.kit import Kit


class Appends:
    def __init__(self, n: int) -> None:
        self.items: list[object] = [object() for _ in range(n)]

    def setup(self) -> None:
        pass

    def run(self) -> int:
        for _ in range(50):
            self.items.append(object())
        return 50

    def teardown(self) -> None:
        del self.items[-50:]


WORKLOAD = Workload("queue.add", "items", Appends)
BUDGET = Budget(min_items=100, min_runs=3, max_items=1000)


def test_a_clock_that_advances_gives_a_positive_sample_per_item(monkeypatch: pytest.MonkeyPatch) -> None:
    ticks = itertools.count(step=0.001)  # a millisecond of CPU per read: 2 reads per run
    monkeypatch.setattr(bench.time, "process_time", lambda: next(ticks))
    cpu, wall, items = Measurer(Kit(), [WORKLOAD]).sample(WORKLOAD, 10, BUDGET)
    assert cpu == pytest.approx(0.001 / 50) and wall > 0 and items == 150


def test_a_cpu_clock_that_does_not_advance_is_an_error_naming_the_workload(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench.time, "process_time", lambda: 12.5)
    with pytest.raises(RuntimeError) as stopped:
        Measurer(Kit(), [WORKLOAD]).sample(WORKLOAD, 10, BUDGET)
    message = str(stopped.value)
    assert message.startswith(
        "workload queue.add at size 10: this process's CPU clock did not advance in most of 3 runs"
    )
    assert "CPU-time limit" in message


def test_a_clock_still_for_a_minority_of_runs_is_a_median_not_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    reads = iter([0.0, 0.0, 1.0, 1.002, 2.0, 2.004])  # runs of 0, 2 and 4 ms
    monkeypatch.setattr(bench.time, "process_time", lambda: next(reads))
    cpu, _wall, _items = Measurer(Kit(), [WORKLOAD]).sample(WORKLOAD, 10, BUDGET)
    assert cpu == pytest.approx(0.002 / 50)
