"""#37077 -- generation tags: a drain ack for an earlier use of a reused room is not taken as the current one's.

Scenario (``reused.*``): a decode server built by the build's own start-up
(:func:`harness.decode_kv.decode_side`) holds request A's pages on room R after
the client aborted it (the built scheduler's ``abort_request``; ABORT sent to
both prefill ranks); nobody acks, and A is released when the release timeout
passes. The room id comes round again: request B, admitted through the
scheduler's own dispatch, gets room R (the tokenizer draws rooms at random), so
the build's prealloc queue gives it a receiver of its own on the same KV
manager, bootstrapped and its destination published -- exactly what A got; the
client aborts B too, so decode holds B's pages until both prefill ranks say B's
transfer drained. Now the acks the prefill ranks owed for *A* arrive, late. The
scheduler's event-loop step (``process_decode_queue``, which resolves held
releases) runs.

Before the fix (<= 0.5.21) an ack names only the room and the prefill rank, so
A's late acks count for B: B's pages are released while B's own transfer may
still be writing into them. With it (0.5.22+) every arming of a room opens a
new generation, the ABORT carries it and the prefill rank echoes it in its
ack; decode counts only the current generation's acks, so B stays held until
its own acks arrive. Each ack here is built from the very ABORT frames that
prefill rank received, in the build's own wire form.

Controls (equal on both sides): A is released by the timeout
(``reused.first_outcome``); once B's own acks arrive it is released exactly
once, drained (``reused.*`` counts); A's late acks arriving *before* B is
aborted are ignored on every release (no room armed: ``early_stale.*``); a
room used once is held until its acks, then drained (``fresh.*``). So the diff
is the generation check, not the deferral machinery.

Every scenario runs on each transport back end the build ships (Mooncake, NIXL,
Mori; fields ``<backend>:<field>``); one whose decode side cannot defer is
``not-applicable`` there, named (Mori up to 0.5.21). The release timeout is
forced short on the built transfer queue so that A can time out (reported with
the build's default).
"""

from __future__ import annotations

import time
from typing import Any

from difflab.probe.kit import Kit, ProbeFailure
from harness.decode_kv import (
    BACKENDS,
    DecodeRank,
    DecodeSide,
    decode_side,
    deferral_gap,
    deliver_abort_ack,
    prefill_endpoint,
)
from harness.features import Machinery

PREFILL_RANKS = 2
RELEASE_TIMEOUT_S = 0.5  # forced: request A must time out; B's checks run long before B's own deadline


# --- version adaptations (one place, detected by feature) -----------------------
# Deferred decode KV release (<= 0.5.18 has none): the room's drain acks the fix tags.
# The ack's wire form per release is harness.decode_kv.deliver_abort_ack's.
MACHINERY = Machinery(
    "deferred decode KV release", "sglang.srt.disaggregation.decode", "DecodeTransferQueue.resolve_deferred_releases"
)


# --- measurements ------------------------------------------------------------------
class Use:
    """One use of the room: its request on the decode server, its bookmarks on the wire and the warning log."""

    def __init__(self, rank: DecodeRank) -> None:
        self.rank = rank
        self.side: DecodeSide = rank.side
        self.warnings_before = len(self.side.warnings.messages)
        self.wire_before = len(self.side.transport.wire.sent)
        self.deferred_at = time.monotonic()

    def releases(self) -> int:
        return self.rank.release_count()

    def held(self) -> bool:
        return self.rank.held()

    def outcome(self) -> str:
        """held / drained / timeout -- from the timeout warning SGLang logs for this use of the room."""
        if self.releases() == 0:
            return "held"
        new = self.side.warnings.messages[self.warnings_before :]
        timed_out = any("timed out" in m and str(self.rank.room) in m for m in new)
        return "timeout" if timed_out else "drained"

    def abort(self) -> None:
        """The client aborts this use's request; the event loop's next pass holds it."""
        self.wire_before = len(self.side.transport.wire.sent)
        self.rank.client_abort()
        if self.side.step():
            raise ProbeFailure("an aborted transfer was handed to decoding")
        self.deferred_at = time.monotonic()
        if self.releases():
            raise ProbeFailure(f"{self.rank.req.rid} was released at once, not held: nothing to judge")

    def frames(self) -> list[tuple[int, list[bytes]]]:
        """The ABORTs this use sent so far, with the prefill rank each went to."""
        room = str(self.rank.room).encode("ascii")
        sent = self.side.transport.wire.sent[self.wire_before :]
        return [
            (prefill_rank, frames)
            for prefill_rank in range(PREFILL_RANKS)
            for endpoint, frames in sent
            if endpoint == prefill_endpoint(prefill_rank)
            and frames[:1] == [b"ABORT"]
            and len(frames) > 1
            and frames[1] == room
        ]

    def ack(self, frames: list[tuple[int, list[bytes]]]) -> None:
        """Each prefill rank acks the ABORT it got, in the build's wire form."""
        if not frames:
            raise ProbeFailure("no ABORT reached a prefill rank: no ack could follow")
        for prefill_rank, abort in frames:
            deliver_abort_ack(self.side, self.rank.room, prefill_rank, abort)

    def resolve(self) -> None:
        """The event loop's next pass; B's checks must come long before B's own deadline."""
        self.side.step()
        if time.monotonic() - self.deferred_at > RELEASE_TIMEOUT_S / 2 and self.outcome() == "held":
            raise ProbeFailure("the machine is too slow: the hold came near its deadline before the check")


def _release_by_timeout(first: Use) -> str:
    """Nobody acked A: the timeout passes and the event loop releases it once."""
    first.side.wait(RELEASE_TIMEOUT_S * 1.5, "nobody acks request A: its release timeout passes")
    first.side.step()
    first.side.step()  # a second pass must not release again
    if first.releases() != 1:
        raise ProbeFailure(f"request A was released {first.releases()} times by the timeout, not once")
    return first.outcome()


def _after_own_acks(second: Use) -> dict[str, Any]:
    """The prefill ranks ack this use's own ABORTs: released once, drained."""
    second.ack(second.frames())
    second.side.step()
    second.side.step()
    return {
        "outcome": second.outcome(),
        "release_count": second.releases(),
        "slot_freed": second.rank.slot_free(),
    }


def _timed_out_first_use(side: DecodeSide, rid: str) -> tuple[DecodeRank, str, list[tuple[int, list[bytes]]]]:
    """Request ``rid`` aborted, nobody acks, released by the timeout: (its rank, outcome, the ABORTs it sent)."""
    first = Use(side.admit(rid))
    first.abort()
    stale = first.frames()
    return first.rank, _release_by_timeout(first), stale


# --- scenarios -------------------------------------------------------------------
def reused(side: DecodeSide) -> dict[str, Any]:
    """A's late acks arrive while B holds the reused room: counted for B (released) or ignored (held)?"""
    first, first_outcome, stale = _timed_out_first_use(side, "pr37077-001")
    second = Use(side.admit("pr37077-002", room=first.room))
    second.abort()
    second.ack(stale)  # the acks the prefill ranks owed for A
    second.resolve()
    fields = {
        "first_outcome": first_outcome,
        "held_after_stale_acks": second.held(),
        "released_by_stale_acks": second.releases() > 0,
    }
    return fields | _after_own_acks(second)


def early_stale(side: DecodeSide) -> dict[str, Any]:
    """Control: A's late acks arrive before B is aborted (no room armed): ignored on every release."""
    first, first_outcome, stale = _timed_out_first_use(side, "pr37077-003")
    second = Use(side.admit("pr37077-004", room=first.room))
    second.ack(stale)
    second.abort()
    second.resolve()
    fields = {
        "first_outcome": first_outcome,
        "held_after_stale_acks": second.held(),
        "released_by_stale_acks": second.releases() > 0,
    }
    return fields | _after_own_acks(second)


def fresh(side: DecodeSide) -> dict[str, Any]:
    """Control: a room used once is held after its abort, then drained by its own acks."""
    only = Use(side.admit("pr37077-005"))
    only.abort()
    only.resolve()
    return {"held_after_stale_acks": only.held(), **_after_own_acks(only)}


SCENARIOS = (reused, early_stale, fresh)


def _prefixed(scenario: str, fields: dict[str, Any]) -> dict[str, Any]:
    return {f"{scenario}.{k}": v for k, v in fields.items()}


def observe(kit: Kit) -> dict[str, Any]:
    MACHINERY.require(kit)
    # pop_transferred logs every failed transfer at ERROR, with its root cause (here: the client's abort).
    kit.allow_log(r"Decode transfer failed for request .* with exception KVTransferError\(bootstrap_room=\d+\): .*$")
    fields: dict[str, Any] = {}
    for backend in BACKENDS:
        gap = deferral_gap(backend)
        if gap is not None:
            fields.update(kit.backend_not_applicable(backend, gap))
            continue
        with (
            decode_side(kit, backend, prefill_ranks=PREFILL_RANKS) as side,
            side.forced(side.queue, "transfer_queue", "deferred_kv_release_timeout", RELEASE_TIMEOUT_S),
        ):
            for scenario in SCENARIOS:
                fields.update(kit.on_backend(backend, _prefixed(scenario.__name__, scenario(side))))
    return fields
