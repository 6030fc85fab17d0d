"""The schedule search's state machine: hypothesis's stateful rules over a :class:`harness.pd_pair.Pair`.

Each rule is one step of a schedule -- a real queue method of the build or an event of
the wire (see :mod:`harness.pd_search`). :func:`harness.pd_search.machine_class` binds a
subclass to one build's kit, back end and Mooncake answer; this module needs hypothesis
and is imported only by the search.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from harness.pd_flow import Flow
from harness.pd_pair import build_pair, on_cpu, one_rank_collectives
from harness.pd_sides import wired_decode_side, wired_prefill_side

PREFILL_LIMIT = 14  # the intake bound the rejection names (prefill rejects an over-long prompt at intake)
DECODE_CAPACITY = 32
LENGTHS = (4, 8, 12)  # prompts of 1 to 3 pages
OVERLONG = 16
MAX_REQUESTS = 4
REJECTION = f"Input length ({OVERLONG} tokens) exceeds the maximum allowed length ({PREFILL_LIMIT} tokens)."


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


# Preconditions as named functions: hypothesis describes each rule's precondition, and a lambda's
# description is read back from its source (tokenized once per description), a function's from its name.
def _room_for_more(machine: PairSchedules) -> bool:
    return machine.count < MAX_REQUESTS


def _abortable(machine: PairSchedules) -> bool:
    return bool(machine.flow.abortable())


def _running(machine: PairSchedules) -> bool:
    return bool(machine.flow.running)


def _wire_passes(machine: PairSchedules) -> bool:
    return not machine.pair.wire.hold


def _writes_held(machine: PairSchedules) -> bool:
    return bool(machine.pair.wire.pending())


class PairSchedules(RuleBasedStateMachine):
    """Schedules over one build's pair; a subclass names the build (class attributes below)."""

    kit: ClassVar[Any]
    backend: ClassVar[str]
    acks_failed_send: ClassVar[bool | None]
    report: ClassVar[Callable[[Found], None]]
    servers: ClassVar[dict[str, dict[str, Any]]]
    """``decode_server`` / ``prefill_server``: how the build's start-up built each side."""

    def __init__(self) -> None:
        super().__init__()
        self.pair = build_pair(self.kit, self.backend, reuse_memory=True)
        self.pair.acks_failed_send = self.acks_failed_send
        self.stack = self.pair.stack
        self.stack.enter_context(on_cpu(self.pair))
        self.stack.enter_context(one_rank_collectives())
        decode = self.stack.enter_context(wired_decode_side(self.pair, DECODE_CAPACITY, report=self._server))
        prefill = self.stack.enter_context(wired_prefill_side(self.pair, report=self._server))
        self.flow = Flow(self.pair, prefill, decode)
        self.steps: list[str] = []
        self.count = 0

    def teardown(self) -> None:
        self.stack.close()

    def _server(self, name: str, **fields: Any) -> None:
        """What each side's server was: its start-up ran once and is kept since; the sender and receiver
        classes are every schedule's together."""
        fields.pop("scenario", None)
        before = self.servers.get(name, {})
        for key, value in fields.items():
            if isinstance(value, list):
                fields[key] = sorted({*before.get(key, []), *value})
        self.servers[name] = fields

    def _do(self, label: str, action: Callable[[], Any]) -> None:
        self.steps.append(label)
        action()

    def _next_rid(self) -> str:
        rid = f"r{self.count}"
        self.count += 1
        return rid

    # -- arrivals ----------------------------------------------------------------
    @precondition(_room_for_more)
    @rule(length=st.sampled_from(LENGTHS))
    def admit(self, length: int) -> None:
        rid = self._next_rid()
        self._do(f"admit {rid} ({length} tokens)", lambda: self.flow.arrive(rid, length))

    @precondition(_room_for_more)
    @rule()
    def reject(self) -> None:
        rid = self._next_rid()
        self._do(
            f"reject {rid} at prefill intake ({OVERLONG} tokens)",
            lambda: self.flow.arrive(rid, OVERLONG, reject_on_prefill=REJECTION),
        )

    # -- one pass of both event loops ---------------------------------------------
    @rule()
    def tick(self) -> None:
        self._do("both schedulers run one loop pass", self.flow.tick)

    # -- the client ---------------------------------------------------------------
    @precondition(_abortable)
    @rule(pick=st.integers(0, MAX_REQUESTS - 1))
    def abort(self, pick: int) -> None:
        live = self.flow.abortable()
        rid = live[pick % len(live)]
        self._do(f"client aborts {rid} on decode", lambda: self.flow.client_abort(rid))

    @precondition(_running)
    @rule(pick=st.integers(0, MAX_REQUESTS - 1))
    def finish(self, pick: int) -> None:
        rid = self.flow.running[pick % len(self.flow.running)]
        self._do(f"{rid} finishes", lambda: self.flow.finish(rid))

    # -- the wire -----------------------------------------------------------------
    @precondition(_wire_passes)
    @rule()
    def hold(self) -> None:
        self._do("wire holds writes back", lambda: setattr(self.pair.wire, "hold", True))

    @precondition(_writes_held)
    @rule(pick=st.integers(0, 7))
    def land_late(self, pick: int) -> None:
        pending = self.pair.wire.pending()
        write = pending[pick % len(pending)]
        self._do(f"held write of {write.writer} lands late", lambda: self.pair.wire.land(write, late=True))

    @precondition(_writes_held)
    @rule(pick=st.integers(0, 7))
    def fail_send(self, pick: int) -> None:
        pending = self.pair.wire.pending()
        write = pending[pick % len(pending)]
        self._do(
            f"transfer of {write.writer} reported failed (write still in flight)", lambda: self.pair.fail_send(write)
        )

    @rule(land=st.booleans())
    def time_passes(self, land: bool) -> None:
        self._do(
            f"held writes {'land' if land else 'fail'}; time passes the timeouts", lambda: self.flow.time_passes(land)
        )

    @invariant()
    def nobody_reads_a_strangers_pages(self) -> None:
        self.flow.attend_all()
        if not self.flow.leaks:
            return
        leak = self.flow.leaks[0]
        self.report(
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
