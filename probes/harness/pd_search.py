"""A seeded schedule search over a :class:`harness.pd_pair.Pair`: hypothesis's stateful testing and shrinking.

Each schedule runs on a pair whose two sides are the servers the build's own
start-up builds (:func:`harness.pd_sides.wired_prefill_side`,
:func:`harness.pd_sides.wired_decode_side`: ``run_scheduler_process``, the
scheduler class, ``init_disaggregation``'s queues, the back end's KV managers,
senders and receivers), started once per process and put back to their start-up
state before each schedule (:mod:`harness.kept`), and is a sequence of steps, each
a method of those servers or an event of the wire: a request arrives (admitted, or rejected
at prefill's intake), decode runs its queue step (``process_decode_queue``),
prefill bootstraps, runs a request (its result step) or polls its in-flight
queue, the client aborts a request on decode (``Scheduler.abort_request``), a
running request finishes, the wire starts holding writes back, lands a held
write late, reports a transfer failed while the write is still in flight, or
time passes beyond the build's timeouts. After every step every running decode
request attends (a decode step of the batch) and the ownership invariant is
checked. A violation is a leak; hypothesis shrinks the schedule that found it.

What the wire assumes (recorded in the result): a held write settles -- lands or
fails, the search chooses -- before the clock passes a timeout; on a back end
whose failed send acks the drain in this build (the real Mooncake
``transfer_worker``, run once per process, answers), the prefill rank acks an
ABORT of a failed room at once although the write may still land.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Iterator
from typing import Any

from difflab.probe.kit import Kit

STEPS = 24
EXPECTED_LOGS = (
    "Decode transfer failed for request",
    "Input length",
    "Deferred KV release for room",
    "Decode handshake failed for request",
)


def _failed_send_acks(kit: Kit, backend: str) -> bool | None:
    """Does this build's Mooncake prefill rank ack the drain of a room whose send failed? (None: not Mooncake)."""
    if backend != "mooncake":
        return None
    import pr43719_failed_send_ack as oracle

    kit.allow_log(r"^Session decode-session-0 failed\.$")  # the oracle's failed write blacklists the session
    return int(oracle.failed_send(kit)["failed.acks"]) > 0


def machine_class(kit: Kit, backend: str, acks_failed_send: bool | None, sink: list[Any]) -> type:
    """The state machine over pairs on this build's two kept servers (:class:`harness.pd_machine.PairSchedules`)."""
    from harness.pd_machine import PairSchedules

    found = sink.append
    namespace = {"kit": kit, "backend": backend, "acks_failed_send": acks_failed_send, "report": staticmethod(found)}
    return type("PairSchedulesOfBuild", (PairSchedules,), namespace | {"servers": {}})


def _warm_up(machine: type) -> None:
    """One untimed schedule step: the first pair pays the imports and the constructor-code lookups."""
    first = machine.__new__(machine)
    machine.__init__.__wrapped__(first)
    try:
        first.tick()
        first.flow.attend_all()
    finally:
        first.teardown()


@contextlib.contextmanager
def _no_source_constants() -> Iterator[None]:
    """Hypothesis mines constants from the source of every module it deems local; here that is all of
    SGLang (on ``PYTHONPATH``, not in site-packages) -- tens of seconds of parsing per newly imported
    batch, and no use to strategies that draw from fixed choices. Switched off for the search."""
    from hypothesis.internal.conjecture import providers

    saved = providers._get_local_constants
    providers._get_local_constants = lambda: providers._local_constants
    try:
        yield
    finally:
        providers._get_local_constants = saved


def search(kit: Kit, *, schedules: int, seed: int, backend: str = "mooncake", chunk: int = 0) -> dict[str, Any]:
    """Run ``schedules`` seeded schedules; return the shrunk leak found (if any) and what was run."""
    from hypothesis import HealthCheck, Phase, Verbosity, settings
    from hypothesis import seed as with_seed
    from hypothesis.stateful import get_state_machine_test

    from harness.pd_machine import Found, LeakFound

    for pattern in EXPECTED_LOGS:
        kit.allow_log(re.escape(pattern))
    acks_failed_send = _failed_send_acks(kit, backend)
    sink: list[Found] = []  # every leak reported, in order
    runs = [0]
    machine = machine_class(kit, backend, acks_failed_send, sink)
    original_init = machine.__init__

    def counted(self: Any) -> None:
        runs[0] += 1
        original_init(self)

    counted.__wrapped__ = original_init  # type: ignore[attr-defined]
    machine.__init__ = counted
    config = settings(
        max_examples=schedules,
        stateful_step_count=STEPS,
        database=None,
        deadline=None,
        derandomize=False,
        phases=[Phase.generate, Phase.shrink],
        suppress_health_check=list(HealthCheck),
        verbosity=Verbosity.quiet,
        report_multiple_bugs=False,
        print_blob=False,
    )
    test = with_seed(seed * 1000 + chunk)(get_state_machine_test(machine, settings=config))
    _warm_up(machine)  # start-up (imports, the build's constructor defaults) is not the search's rate
    started, cpu_started = time.perf_counter(), time.process_time()
    found: Found | None = None
    try:
        with _no_source_constants():
            test()
    except LeakFound:
        found = sink[-1]  # hypothesis replays the shrunk schedule last
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    return {
        "runs": runs[0],
        "seconds": elapsed,
        "cpu_seconds": cpu,  # this process's CPU time: the per-core rate, whatever else shares the machine
        "acks_failed_send": acks_failed_send,
        "servers": machine.servers,
        "leak": None if found is None else vars(found),
    }


ASSUMPTIONS = (
    "a held write settles (lands or fails, as the schedule says) before the lab's clock passes a timeout",
    "a failed send leaves its write in flight; whether the prefill rank then acks an ABORT of the room is "
    "this build's Mooncake transfer_worker's answer (acks_failed_send)",
    "acks reach decode at its next queue step; each loop pass runs decode, then prefill bootstrap, run, in-flight poll",
    "the one-rank all-reduces answer in-process; the two ranks' pools are built once and reset per schedule",
    "both servers are started once by the build's own start-up and put back to their start-up state before "
    "each schedule (harness.kept)",
)


def observe_chunk(kit: Kit, *, schedules: int, seed: int, chunk: int, backend: str) -> dict[str, Any]:
    """One job of ``difflab fuzz``: a seeded search of ``schedules`` schedules; the leak goes in an event."""
    ran = search(kit, schedules=schedules, seed=seed, backend=backend, chunk=chunk)
    kit.event("search", seed=seed, chunk=chunk, backend=backend, assumptions=list(ASSUMPTIONS), **ran)
    return {
        "search.schedules": schedules,
        "search.runs": ran["runs"],
        "search.seconds": ran["seconds"],
        "search.cpu_seconds": ran["cpu_seconds"],
        "search.leaked": ran["leak"] is not None,
    }
