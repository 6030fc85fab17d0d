"""#43719 (a) on Mori -- a failed Mori write never acks the drain of an aborted room; the room is poisoned.

Scenario: a Mori prefill rank the build's own start-up built (:mod:`harness.mori`)
sends a room's last chunk to one decode rank, deferred decode KV release on:
the real shard worker posts the room's RDMA writes and waits for them; writes
still in flight when the wait returns go to the real drainer, which waits for
them and only then releases the drain ack (``ABORT_ACK``: decode may reuse the
pages). Decode's ABORT reaches the real bootstrap thread, which marks the room
Failed and arms the ack. Then one of the writes ends ``Failed`` -- Mori's
``TransferStatus.Failed()``, which says nothing about what that write still
puts into decode's pages.

Observations (acks are ABORT_ACKs sent to decode):

- shard worker path: ``failed`` -- decode aborts while the worker waits, a write
  then fails (``acks``); ``second_abort.acks`` for a later ABORT;
  ``after_clear.acks`` for an ABORT after the scheduler cleared the sender (the
  room no longer known); ``failed_late`` -- a write fails with nobody aborting,
  decode's ABORT comes afterwards (``late_acks``);
- drainer path: ``partial`` -- one write fails while another is still writing;
  the worker tells decode and hands the writes to the drainer, and decode's
  ABORT arrives while the drainer waits (``acks``, ``late_acks``);
  ``posting_failed`` -- decode aborts while the writes are being posted, the
  drainer waits for them, and they fail (``acks``, ``late_acks``).

Before the fix (0.5.22) a failed write counts as settled: the drain is acked
once the worker or drainer is done with it, and every later ABORT is acked at
once; with it (0.5.23) a room with a failed write is poisoned
(``_poison_failed_transfer``): it never acks until its next lifecycle, and
decode falls back to its release timeout.

Controls (equal on both sides): the same writes succeeding, on both paths
(``succeeded``: ABORT while the worker waits; ``drained``: ABORT while posting)
ack the drain once and a later ABORT once more; a failed write with nobody
aborting acks nothing by itself and decode is told the room Failed
(``failed_late``, ``partial``); the room's next lifecycle (Bootstrapping,
decode's metadata) acks an ABORT once (``reused.acks``); every scenario posted
its writes (``writes``).

Not covered -- no scenario can name these paths, for these reasons:

- the poison check in ``_mark_transfer_quiescent``: the poison has already
  dropped the room's ack target, and ``register_deferred_ack_target`` refuses a
  new one for a poisoned room, so there is nothing for that check to withhold
  in any order a single room's messages can take (reverting it changes no field);
- the poison reset on a new lifecycle (``update_status``) is 0.5.22's, not this
  fix's: ``reused.acks`` is its control.

Honesty: the worker, the drainer and the bootstrap thread each catch
``Exception`` (and log it, or retry, or conclude the room Failed -- what the fix
is about). The engine, status and socket fakes are strict and guarded: a
missing attribute is a ``BaseException`` none of them can take, an exception
inside a fake is recorded and fails the probe, and the build's logged errors
are checked (only the ones a failed write makes are allowed). The rank's
bookkeeping -- poisoned rooms, ack targets, outstanding writes -- is this
build's own; the probe reads none of it. Fields read ``mori:<field>``; a build
without Mori, or whose Mori cannot defer its drain ack (<= 0.5.21), is
``not-applicable``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from difflab.probe.kit import Kit
from harness.features import Machinery
from harness.mori import BACKEND, MoriRank, build_mori_rank, mori_gap

# --- version adaptations (one place, detected by feature) -----------------------
# Deferred decode KV release with drain acks (every pinned release has it); whether Mori's prefill rank
# holds its ack until the writes settle (0.5.22+) is harness.mori.mori_gap's question.
MACHINERY = Machinery(
    "drain-acknowledged abort (deferred KV release)",
    "sglang.srt.disaggregation.common.conn",
    "CommonKVManager._maybe_ack_drained_abort",
)


def _late_acks(rank: MoriRank) -> int:
    """ABORT_ACKs for one more ABORT of the room, arriving after the rank is done with it."""
    start = rank.sent_so_far()
    rank.abort()
    return rank.acks(since=start)


# --- scenarios: the shard worker -------------------------------------------------------
def failed(rank: MoriRank) -> dict[str, Any]:
    """ABORT while the worker waits; a write then fails: ack now, a second ABORT, after clear, after reuse?"""
    rank.open_room(43101)
    rank.send(failing=1, on_wait=rank.abort)
    fields = {"failed.writes": rank.writes(), "failed.acks": rank.acks(), "second_abort.acks": _late_acks(rank)}
    rank.clear_sender()
    fields["after_clear.acks"] = _late_acks(rank)
    rank.open_room()
    fields["reused.acks"] = _late_acks(rank)
    return fields


def failed_late(rank: MoriRank) -> dict[str, Any]:
    """A write fails with nobody aborting yet; decode, told Failed, aborts afterwards."""
    rank.open_room(43102)
    rank.send(failing=1)
    return {
        "writes": rank.writes(),
        "decode_told_failed": rank.decode_told_failed(),
        "acks": rank.acks(),
        "late_acks": _late_acks(rank),
    }


def succeeded(rank: MoriRank) -> dict[str, Any]:
    """Control: ABORT while the worker waits for writes that succeed -> the drain is acked once, a later ABORT too."""
    rank.open_room(43103)
    rank.send(on_wait=rank.abort)
    return {"writes": rank.writes(), "acks": rank.acks(), "late_acks": _late_acks(rank)}


# --- scenarios: the drainer --------------------------------------------------------------
def partial(rank: MoriRank) -> dict[str, Any]:
    """One write fails while another still writes; decode's ABORT comes while the drainer waits for it."""
    rank.open_room(43104)
    rank.send(failing=1, lingering=1, on_drain=rank.abort)
    return {
        "writes": rank.writes(),
        "decode_told_failed": rank.decode_told_failed(),
        "acks": rank.acks(),
        "late_acks": _late_acks(rank),
    }


def posting_failed(rank: MoriRank) -> dict[str, Any]:
    """ABORT while the writes are being posted; the drainer waits for them and they fail."""
    rank.open_room(43105)
    rank.send(failing=1, on_post=rank.abort)
    return {"writes": rank.writes(), "acks": rank.acks(), "late_acks": _late_acks(rank)}


def drained(rank: MoriRank) -> dict[str, Any]:
    """Control: ABORT while the writes are being posted; the drainer waits for them and they succeed."""
    rank.open_room(43106)
    rank.send(on_post=rank.abort)
    return {"writes": rank.writes(), "acks": rank.acks(), "late_acks": _late_acks(rank)}


SCENARIOS: tuple[Callable[[MoriRank], dict[str, Any]], ...] = (
    failed,
    failed_late,
    succeeded,
    partial,
    posting_failed,
    drained,
)
UNPREFIXED = {failed}
"""Scenarios that name their own fields (one scenario's steps read as separate observations)."""


def observe(kit: Kit) -> dict[str, Any]:
    MACHINERY.require(kit)
    gap = mori_gap()
    if gap is not None:
        return kit.backend_not_applicable(BACKEND, gap)
    rank = build_mori_rank(kit)
    fields: dict[str, Any] = {}
    for scenario in SCENARIOS:
        seen = scenario(rank)
        fields.update(seen if scenario in UNPREFIXED else {f"{scenario.__name__}.{k}": v for k, v in seen.items()})
    return kit.on_backend(BACKEND, fields)
