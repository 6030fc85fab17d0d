"""Throughput bench child: one process per side, timing a fix's hot path round by round.

A throughput probe (``probes/throughput/<name>.py``) defines ``workloads(kit) ->
list[Workload]``. Each workload drives one real SGLang hot path (a door check per
request, retirement bookkeeping per result, ...) under a load of ``n`` items held
(requests waiting, rooms in flight): ``load(n)`` builds that state once and returns
a :class:`Trial`, whose ``run()`` is the only timed part.

The child is forked from its source server (:mod:`difflab.probe.source_server`)
with an inbox and an outbox pipe, and is driven by the lab one round at a time, so
base and head alternate (``base, head, base, head ...``) while both processes stay
alive. Lab -> child, one JSON object per line:

- ``{"op": "round", "round": R, "sizes": [10, 100, 1000], "min_items": N, "min_runs": K, "max_items": M}``
- ``{"op": "end"}``

Child -> lab: ``bench-ready`` (the workloads), then one ``round`` per request:
``samples[workload][size]`` = CPU seconds per item (``samples_wall``: the same in wall
time), or ``error`` (the kit's problems, a probe failure); the child leaves after an
error or ``end``.

Timing follows asv: the garbage collector is off while ``run()`` runs, each sample
repeats ``setup``/``run``/``teardown`` as its :class:`Budget` says, and the sample
is the median over the runs of seconds per item -- CPU seconds of this process, so a
busy machine's other processes are not charged to the side that happened to run.
The kit's honesty rules hold here too: a missing fake attribute, an exception
inside a fake or an unexpected logged error makes the round an error, never a
number.
"""

from __future__ import annotations

import gc
import json
import os
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from difflab.probe.child import load_probe
from difflab.probe.kit import Kit, MissingFakeAttribute
from difflab.probe.process import EXIT_CRASH, enter_forked_child, write_line

MAX_REPEATS = 10_000
"""A trial whose ``run()`` reports no items would otherwise repeat for ever."""


class Trial(Protocol):
    """One load of a workload, built once; ``run()`` is timed, the rest is not."""

    def setup(self) -> None:
        """Fresh inputs for the next ``run()`` (new requests, new rooms)."""

    def run(self) -> int:
        """Drive the real hot path once; return how many items went through it."""

    def teardown(self) -> None:
        """Check what ``run()`` did (raise ``ProbeFailure`` if the path was not taken) and restore the load."""


@dataclass(frozen=True)
class Workload:
    """A hot path under load: ``load(n)`` holds ``n`` items (waiting requests, rooms held)."""

    name: str
    unit: str
    load: Callable[[int], Trial]
    what: str = ""

    def describe(self) -> dict[str, str]:
        return {"name": self.name, "unit": self.unit, "what": self.what}


@dataclass(frozen=True)
class Budget:
    """How much one sample times: runs until ``min_items`` items in ``min_runs`` runs, or ``max_items`` items.

    A small load needs many short runs for a stable median; a large one (a burst of a
    thousand rooms) is one long run, so ``max_items`` stops it early.
    """

    min_items: int = 200
    min_runs: int = 5
    max_items: int = 1000

    def more(self, runs: int, items: int) -> bool:
        if runs >= MAX_REPEATS:
            return False
        if runs > 0 and items >= self.max_items:
            return False
        return items < self.min_items or runs < self.min_runs

    @classmethod
    def from_request(cls, msg: dict[str, Any]) -> Budget:
        default = cls()
        return cls(**{k: int(msg.get(k, getattr(default, k))) for k in ("min_items", "min_runs", "max_items")})


@dataclass
class Measurer:
    """Times every workload at every size; trials are built on first use and kept for later rounds."""

    kit: Kit
    workloads: list[Workload]
    trials: dict[tuple[str, int], Trial] = field(default_factory=dict)

    def trial(self, workload: Workload, size: int) -> Trial:
        key = (workload.name, size)
        if key not in self.trials:
            self.trials[key] = workload.load(size)
        return self.trials[key]

    def sample(self, workload: Workload, size: int, budget: Budget) -> tuple[float, float, int]:
        """CPU and wall seconds per item at ``size`` (medians over runs), and how many items were timed.

        CPU time (``time.process_time``: this process, every thread) is the sample: on a
        shared machine the OS hands the core to other processes mid-run, which wall time
        charges to whichever side was running and CPU time does not. The median, as asv
        reports it: a run that was disturbed anyway is an outlier, not a shift.
        """
        trial = self.trial(workload, size)
        cpu: list[float] = []
        wall: list[float] = []
        items = 0
        while budget.more(len(cpu), items):
            trial.setup()
            gc.disable()
            try:
                started, started_cpu = time.perf_counter(), time.process_time()
                done = int(trial.run())
                elapsed_cpu, elapsed = time.process_time() - started_cpu, time.perf_counter() - started
            finally:
                gc.enable()
            trial.teardown()
            if done <= 0:
                raise RuntimeError(f"workload {workload.name} at size {size} reported no items")
            cpu.append(elapsed_cpu / done)
            wall.append(elapsed / done)
            items += done
        if statistics.median(cpu) <= 0:
            # A CPU clock coarser than the runs (Linux makes it tick-grained while a CPU-time limit is
            # armed): no CPU sample exists, and a ratio of zeros is no measurement.
            raise RuntimeError(
                f"workload {workload.name} at size {size}: this process's CPU clock did not advance in most "
                f"of {len(cpu)} runs ({statistics.median(wall):.3g} s wall per item); it is coarser than a run "
                "here (is a CPU-time limit set, ulimit -t?), so there is no CPU time to compare"
            )
        return statistics.median(cpu), statistics.median(wall), items

    def round(self, sizes: list[int], budget: Budget) -> dict[str, Any]:
        built = len(self.trials)
        samples: dict[str, dict[str, float]] = {}
        walls: dict[str, dict[str, float]] = {}
        items: dict[str, dict[str, int]] = {}
        for workload in self.workloads:
            for size in sizes:
                per_item, per_item_wall, count = self.sample(workload, size, budget)
                samples.setdefault(workload.name, {})[str(size)] = per_item
                walls.setdefault(workload.name, {})[str(size)] = per_item_wall
                items.setdefault(workload.name, {})[str(size)] = count
        if len(self.trials) != built:
            # The loads built this round live as long as the bench: keep the collector off them.
            gc.collect()
            gc.freeze()
        return {"samples": samples, "samples_wall": walls, "items": items}


def _failure(exc: BaseException) -> str:
    if isinstance(exc, MissingFakeAttribute):
        return f"probe fake incomplete: {exc}"
    return "".join(traceback.format_exception(exc)).strip()


def serve(probe: Path, inbox: int, outbox: int) -> None:
    """Load the throughput probe, then answer round requests until ``end`` (or an error)."""
    kit = Kit()
    reader = os.fdopen(inbox, "r", encoding="utf-8")
    # The probe's helpers live in probes/harness/, beside probes/throughput/.
    sys.path.insert(0, str(probe.parent.parent))
    # Deployment log levels while timing: a debug record the kit would open up costs time on one side only.
    with kit.capture_logs(open_pd_loggers=False):
        try:
            module = load_probe(probe, entry="workloads")
            measurer = Measurer(kit, list(module.workloads(kit)))
            if not measurer.workloads:
                raise ValueError(f"throughput probe {probe} declares no workloads")
        except BaseException as exc:  # noqa: B036 - reported, then the child leaves
            if isinstance(exc, KeyboardInterrupt):
                raise
            write_line(outbox, {"event": "bench-failed", "error": _failure(exc), "problems": kit.problems()})
            return
        write_line(
            outbox,
            {
                "event": "bench-ready",
                "workloads": [w.describe() for w in measurer.workloads],
                "sglang_version": _version(kit),
            },
        )
        for line in reader:
            msg = json.loads(line)
            if msg.get("op") != "round":
                return
            reply: dict[str, Any] = {"event": "round", "round": msg.get("round")}
            started, cpu = time.perf_counter(), time.process_time()
            try:
                reply |= measurer.round([int(s) for s in msg["sizes"]], Budget.from_request(msg))
            except BaseException as exc:  # noqa: B036
                if isinstance(exc, KeyboardInterrupt):
                    raise
                reply["error"] = _failure(exc)
            problems = kit.problems()
            if problems and "error" not in reply:
                reply["error"] = "measurement not trustworthy: " + "; ".join(p.splitlines()[0] for p in problems)
            reply["problems"] = problems
            reply["wall_s"] = round(time.perf_counter() - started, 4)
            reply["cpu_s"] = round(time.process_time() - cpu, 4)
            write_line(outbox, reply)
            if "error" in reply:
                return


def _version(kit: Kit) -> str | None:
    try:
        return kit.sglang_version
    except Exception:  # no SGLang (a toy source): the lab records None
        return None


def bench_main(req: dict[str, Any], import_log: str | None, close_fds: list[int], inbox: int, outbox: int) -> None:
    """In the forked bench process: never returns."""
    code = EXIT_CRASH
    try:
        enter_forked_child(req["log"], import_log, close_fds)
        os.chdir(Path(req["log"]).parent)
        serve(Path(req["probe"]), inbox, outbox)
        code = 0
    except BaseException:  # noqa: B036 - report anything, then leave
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)
