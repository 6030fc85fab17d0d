"""#40645 / #41402 -- a prefill rank's drain ack reaches every decode peer that waits for it, and is not lost.

Scenario: a Mooncake prefill rank's real ``transfer_worker`` writes a room's KV
(deferred decode KV release on); decode aborts while the write is in flight.
Decode's ABORT reaches the real bootstrap thread, which marks the room Failed
and registers the ABORT's sender for the drain ack, sent once the write
settles (the write here succeeds). Decode holds the room's pages until it gets
that ack, or until its release timeout (30 s by default) passes.

- ``two_peers.*``: prefill TP < decode TP, so two decode ranks read the room
  (:mod:`harness.family_peers`); both abort during the write, each sending its
  own ABORT. Does the first one get an ack, or only the last?
- ``cleared_in_flight.*``: the ABORT arrives, then the scheduler is done with
  the request and the real sender's ``clear()`` forgets the room -- all while
  the write is still in flight. Is the ack still sent when the write settles?
- ``abort_after_clear.*``: the sender is cleared first, then the ABORT arrives
  for the (now unknown) room whose write is still in flight.

Before the fix (<= 0.5.20) the rank kept one ack target per room, the last
ABORT's sender, so an earlier decode peer waited out its release timeout;
``clear()`` dropped the target while the write was in flight, and an ABORT for
a room no longer known but still being written registered nothing, so in both
cases no ack was ever sent. With it (0.5.21+) the drain ack goes to every
decode peer of the room, ``clear()`` keeps the target until the write drains,
and that ABORT registers one. (0.5.22 keeps one target per decode endpoint
instead of the fan-out: the same observable result.)

Controls (equal on both sides): no drain ack leaves while the write is in
flight, in any scenario (``acks_while_writing``); one decode peer aborting during a write gets
one ack (``one_peer``); in ``two_peers`` the last ABORT's sender gets its ack
on every release; an ABORT for a room that is no longer known and not being
written is acked at once (``idle_after_clear``).

Mooncake's prefill side only (fields ``mooncake:<field>``): the fan-out and the
``clear()`` change live in the shared ``CommonKVManager`` / ``CommonKVSender``,
but only Mooncake's bootstrap thread and worker are driven here (NIXL's ``clear()`` path:
``pr40645_nixl_clear_in_flight``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from difflab.probe.kit import Kit, ProbeFailure
from harness.family_peers import abort_from, acks_to, add_decode_peer, first_peer
from harness.features import Machinery
from harness.mooncake import PrefillRank, build_prefill_rank, mooncake_gap

BACKEND = "mooncake"
SECOND_PEER = ("decode-session-1", 17021)

# --- version adaptations (one place, detected by feature) -----------------------
# The ABORT's wire form per release is harness.family_peers.abort_from's. <= 0.5.18 has no drain ack at all.
MACHINERY = Machinery(
    "drain-acknowledged abort (deferred KV release)",
    "sglang.srt.disaggregation.common.conn",
    "CommonKVManager._maybe_ack_drained_abort",
)


def _during_first_write(rank: PrefillRank, *steps: Callable[[], None]) -> dict[str, int]:
    """While the room's first KV write is in flight, run ``steps``; every write then succeeds.

    Returns (filled in once the write ran) ``acks_while_writing``: drain acks sent
    before the write settled -- an ack then would tell decode to reuse pages still being written.
    """
    pending = list(steps)
    seen: dict[str, int] = {}

    def write() -> int:
        while pending:
            pending.pop(0)()
            seen["acks_while_writing"] = rank.wire.count_distinct(b"ABORT_ACK")
        return 0

    rank.send_result = write
    return seen


def _abort(rank: PrefillRank, port: int) -> Callable[[], None]:
    return lambda: rank.deliver(abort_from(rank.room, port))


def _write_room(rank: PrefillRank) -> None:
    rank.run_worker(rank.chunk(last=True))
    if rank.send_kvcache.count == 0:
        raise ProbeFailure("the worker never wrote the room: nothing was in flight")


# --- scenarios -------------------------------------------------------------------
def one_peer(kit: Kit) -> dict[str, Any]:
    """Control: one decode peer aborts during the write -> acked once the write settles."""
    rank = build_prefill_rank(kit, room=40601)
    _, port = first_peer()
    seen = _during_first_write(rank, _abort(rank, port))
    _write_room(rank)
    return {**seen, "first_peer_acks": acks_to(rank, port)}


def two_peers(kit: Kit) -> dict[str, Any]:
    """Two decode peers read the room and both abort during the write: is each acked?"""
    rank = build_prefill_rank(kit, room=40602)
    _, port = first_peer()
    session, second = SECOND_PEER
    add_decode_peer(rank, session, second)
    seen = _during_first_write(rank, _abort(rank, port), _abort(rank, second))
    _write_room(rank)
    return {**seen, "first_peer_acks": acks_to(rank, port), "last_peer_acks": acks_to(rank, second)}


def cleared_in_flight(kit: Kit) -> dict[str, Any]:
    """ABORT, then the sender's clear(), both while the write is in flight: acked when it settles?"""
    rank = build_prefill_rank(kit, room=40603)
    _, port = first_peer()
    seen = _during_first_write(rank, _abort(rank, port), rank.clear_sender)
    _write_room(rank)
    return {**seen, "first_peer_acks": acks_to(rank, port)}


def abort_after_clear(kit: Kit) -> dict[str, Any]:
    """The sender's clear(), then the ABORT, while the write is in flight: acked when it settles?"""
    rank = build_prefill_rank(kit, room=40604)
    _, port = first_peer()
    seen = _during_first_write(rank, rank.clear_sender, _abort(rank, port))
    _write_room(rank)
    return {**seen, "first_peer_acks": acks_to(rank, port)}


def idle_after_clear(kit: Kit) -> dict[str, Any]:
    """Control: the room was written and cleared; an ABORT for it now is acked at once (nothing in flight)."""
    rank = build_prefill_rank(kit, room=40605)
    _, port = first_peer()
    _write_room(rank)
    rank.clear_sender()
    rank.deliver(abort_from(rank.room, port))
    return {"first_peer_acks": acks_to(rank, port)}


SCENARIOS = (one_peer, two_peers, cleared_in_flight, abort_after_clear, idle_after_clear)


def observe(kit: Kit) -> dict[str, Any]:
    MACHINERY.require(kit)
    gap = mooncake_gap()
    if gap is not None:
        return kit.backend_not_applicable(BACKEND, gap)
    fields: dict[str, Any] = {}
    for scenario in SCENARIOS:
        observed = scenario(kit)
        fields.update(kit.on_backend(BACKEND, {f"{scenario.__name__}.{k}": v for k, v in observed.items()}))
    return fields
