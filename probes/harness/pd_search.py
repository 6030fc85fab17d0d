"""A seeded schedule search over a :class:`harness.pd_pair.Pair`: hypothesis's stateful testing and shrinking.

Each schedule is a fresh pair and a sequence of steps, each a real queue method
of the build or an event of the wire: a request arrives (admitted, or rejected
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
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from difflab.probe.kit import Kit
from harness.pd_flow import Flow
from harness.pd_pair import build_pair, one_rank_collectives, wired
from harness.pd_sides import decode_side, prefill_side

PREFILL_LIMIT = 14
DECODE_CAPACITY = 32
LENGTHS = (4, 8, 12)  # prompts of 1 to 3 pages
OVERLONG = 16
MAX_REQUESTS = 4
STEPS = 24
EXPECTED_LOGS = (
    "Decode transfer failed for request",
    "Input length",
    "Deferred KV release for room",
    "Decode handshake failed for request",
)


class LeakFound(Exception):  # noqa: N818 - the property's counterexample
    pass


@dataclass
class Found:
    """One leak: the shrunk schedule that reaches it and who read whose pages."""

    schedule: list[str]
    victim: str
    owner: str
    pages: list[int]
    canary: bool
    decisions: list[str]


def _failed_send_acks(kit: Kit, backend: str) -> bool | None:
    """Does this build's Mooncake prefill rank ack the drain of a room whose send failed? (None: not Mooncake)."""
    if backend != "mooncake":
        return None
    import pr43719_failed_send_ack as oracle

    kit.allow_log(r"^Session decode-session-0 failed\.$")  # the oracle's failed write blacklists the session
    return int(oracle.failed_send(kit)["failed.acks"]) > 0


def machine_class(kit: Kit, backend: str, acks_failed_send: bool | None, sink: list[Found]) -> type:
    """The hypothesis state machine over fresh pairs of this build."""
    from hypothesis import strategies as st
    from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

    class PairSchedules(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.pair = build_pair(kit, backend, reuse_memory=True)
            self.pair.acks_failed_send = acks_failed_send
            self.stack = self.pair.stack
            self.stack.enter_context(wired(self.pair))
            self.stack.enter_context(one_rank_collectives())
            self.flow = Flow(self.pair, prefill_side(self.pair, PREFILL_LIMIT), decode_side(self.pair, DECODE_CAPACITY))
            self.steps: list[str] = []
            self.count = 0

        def teardown(self) -> None:
            self.stack.close()

        def _do(self, label: str, action: Callable[[], Any]) -> None:
            self.steps.append(label)
            action()

        # -- arrivals ----------------------------------------------------------
        @precondition(lambda self: self.count < MAX_REQUESTS)
        @rule(length=st.sampled_from(LENGTHS))
        def admit(self, length: int) -> None:
            rid = f"r{self.count}"
            self.count += 1
            self._do(f"admit {rid} ({length} tokens)", lambda: self.flow.arrive(rid, length))

        @precondition(lambda self: self.count < MAX_REQUESTS)
        @rule()
        def reject(self) -> None:
            rid = f"r{self.count}"
            self.count += 1
            message = f"Input length ({OVERLONG} tokens) exceeds the maximum allowed length ({PREFILL_LIMIT} tokens)."
            self._do(
                f"reject {rid} at prefill intake ({OVERLONG} tokens)",
                lambda: self.flow.arrive(rid, OVERLONG, reject_on_prefill=message),
            )

        # -- one pass of both event loops ---------------------------------------
        @rule()
        def tick(self) -> None:
            self._do("both schedulers run one loop pass", self.flow.tick)

        # -- the client ---------------------------------------------------------
        @precondition(lambda self: bool(self.flow.abortable()))
        @rule(pick=st.integers(0, MAX_REQUESTS - 1))
        def abort(self, pick: int) -> None:
            live = self.flow.abortable()
            rid = live[pick % len(live)]
            self._do(f"client aborts {rid} on decode", lambda: self.flow.client_abort(rid))

        @precondition(lambda self: bool(self.flow.running))
        @rule(pick=st.integers(0, MAX_REQUESTS - 1))
        def finish(self, pick: int) -> None:
            rid = self.flow.running[pick % len(self.flow.running)]
            self._do(f"{rid} finishes", lambda: self.flow.finish(rid))

        # -- the wire -----------------------------------------------------------
        @precondition(lambda self: not self.pair.wire.hold)
        @rule()
        def hold(self) -> None:
            self._do("wire holds writes back", lambda: setattr(self.pair.wire, "hold", True))

        @precondition(lambda self: bool(self.pair.wire.pending()))
        @rule(pick=st.integers(0, 7))
        def land_late(self, pick: int) -> None:
            pending = self.pair.wire.pending()
            write = pending[pick % len(pending)]
            self._do(f"held write of {write.writer} lands late", lambda: self.pair.wire.land(write, late=True))

        @precondition(lambda self: bool(self.pair.wire.pending()))
        @rule(pick=st.integers(0, 7))
        def fail_send(self, pick: int) -> None:
            pending = self.pair.wire.pending()
            write = pending[pick % len(pending)]
            self._do(
                f"transfer of {write.writer} reported failed (write still in flight)",
                lambda: self.pair.fail_send(write),
            )

        @rule(land=st.booleans())
        def time_passes(self, land: bool) -> None:
            self._do(
                f"held writes {'land' if land else 'fail'}; time passes the timeouts",
                lambda: self.flow.time_passes(land),
            )

        @invariant()
        def nobody_reads_a_strangers_pages(self) -> None:
            self.flow.attend_all()
            if self.flow.leaks:
                leak = self.flow.leaks[0]
                sink.append(
                    Found(
                        schedule=list(self.steps),
                        victim=leak.victim,
                        owner=leak.owner,
                        pages=leak.pages,
                        canary=leak.canary,
                        decisions=list(self.pair.decisions),
                    )
                )
                raise LeakFound(f"{leak.victim} read pages {leak.pages} written by {leak.owner}")

    return PairSchedules


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

    for pattern in EXPECTED_LOGS:
        kit.allow_log(re.escape(pattern))
    acks_failed_send = _failed_send_acks(kit, backend)
    sink: list[Found] = []
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
    started = time.perf_counter()
    found: Found | None = None
    try:
        with _no_source_constants():
            test()
    except LeakFound:
        found = sink[-1]  # hypothesis replays the shrunk schedule last
    elapsed = time.perf_counter() - started
    return {
        "runs": runs[0],
        "seconds": elapsed,
        "acks_failed_send": acks_failed_send,
        "leak": None if found is None else vars(found),
    }


ASSUMPTIONS = (
    "a held write settles (lands or fails, as the schedule says) before the lab's clock passes a timeout",
    "a failed send leaves its write in flight; whether the prefill rank then acks an ABORT of the room is "
    "this build's Mooncake transfer_worker's answer (acks_failed_send)",
    "acks reach decode at its next queue step; each loop pass runs decode, then prefill bootstrap, run, in-flight poll",
    "the one-rank all-reduces answer in-process; the two ranks' pools are built once and reset per schedule",
)


def observe_chunk(kit: Kit, *, schedules: int, seed: int, chunk: int, backend: str) -> dict[str, Any]:
    """One job of ``difflab fuzz``: a seeded search of ``schedules`` schedules; the leak goes in an event."""
    ran = search(kit, schedules=schedules, seed=seed, backend=backend, chunk=chunk)
    kit.event("search", seed=seed, chunk=chunk, backend=backend, assumptions=list(ASSUMPTIONS), **ran)
    return {
        "search.schedules": schedules,
        "search.runs": ran["runs"],
        "search.seconds": ran["seconds"],
        "search.leaked": ran["leak"] is not None,
    }
