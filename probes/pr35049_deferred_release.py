"""#35049 -- decode holds an aborted request's KV pages until every prefill rank acked the drain.

Scenario: the build's own decode server on Mooncake
(:func:`harness.decode_kv.decode_side`, the deferred-release switch forced on
and reported with the build's default), with a request admitted through the
scheduler that has published its destination to two prefill ranks. The client
aborts it (the real ``Scheduler.abort_request``) and the decode queue runs:
``aborted.*`` -- are its pages and metadata slot held? ``one_ack.*`` -- the
first prefill rank acks its drain: still held? ``drained.*`` -- the second rank
acks: released, once. The real ``pop_transferred`` and
``resolve_deferred_releases`` decide.

Without the fix decode released the pages as soon as it aborted, while a
prefill rank could still be writing into them (the in-flight write race of the
incident reports). Every pinned release (0.5.19 on) carries it, so no pinned
release shows the bug; the reverting mutation (no deferral on a decode-started
abort) shows what the probe reads without it.

Controls (equal with and without the fix): a receiver that never learnt its
prefill ranks is released at once; the drained request ends released exactly
once. Fields read ``mooncake:<field>``.

The same scenarios run on the build's NIXL decode server (``nixl:<field>``), which
judges #35360, the NIXL port: there the shared decode queue holds the request
on every release, and what NIXL's own code decides is whether the prefill ranks'
drain acks, read by NIXL's decode listener thread (the build's wire form,
:func:`harness.decode_kv.deliver_abort_ack`), end the hold -- without the port
the hold can only end by its timeout.
"""

from __future__ import annotations

from typing import Any

from difflab.probe.kit import Kit
from harness.decode_kv import DecodeRank, DecodeSide, decode_side, deliver_abort_ack, prefill_endpoint
from harness.features import Machinery

BACKENDS = ("mooncake", "nixl")  # #35049 on Mooncake; its NIXL port #35360 on NIXL
PREFILL_RANKS = 2

# --- version adaptations (one place, detected by feature) -----------------------
# Deferred decode KV release (every pinned release has it).
MACHINERY = Machinery(
    "deferred decode KV release", "sglang.srt.disaggregation.decode", "DecodeTransferQueue.resolve_deferred_releases"
)


def _ack(rank: DecodeRank, prefill_rank: int) -> None:
    """One prefill rank acks the ABORT it received; the event loop's next pass."""
    for frames in rank.aborts(prefill_endpoint(prefill_rank)):
        deliver_abort_ack(rank.side, rank.room, prefill_rank, frames)
    rank.side.step()


def _aborted(side: DecodeSide, rid: str) -> DecodeRank:
    rank = side.admit(rid)
    rank.client_abort()
    side.step()
    return rank


def deferral(side: DecodeSide) -> dict[str, Any]:
    """A client abort, then the prefill ranks' drain acks one by one."""
    rank = _aborted(side, "pr35049-001")
    fields: dict[str, Any] = {"aborted.held": rank.held()}
    _ack(rank, 0)
    fields["one_ack.held"] = rank.held()
    _ack(rank, 1)
    side.step()  # a later pass must not release again
    fields |= {"drained.released": rank.release_count() == 1, "drained.release_count": rank.release_count()}
    return fields


def unnotifiable(side: DecodeSide) -> dict[str, Any]:
    """Control: no prefill rank to wait for -> released at once."""
    rank = side.admit("pr35049-002")
    rank.receiver.bootstrap_infos = None  # the state this control models: the destinations were never learnt
    rank.client_abort()
    side.step()
    return {"unnotifiable.released": rank.release_count() == 1}


def observe(kit: Kit) -> dict[str, Any]:
    MACHINERY.require(kit)
    kit.allow_log(
        r"Decode transfer failed for request .* with exception KVTransferError\(bootstrap_room=\d+\): "
        r"Aborted by AbortReq\.$"
    )
    fields: dict[str, Any] = {}
    for backend in BACKENDS:
        with decode_side(kit, backend, prefill_ranks=PREFILL_RANKS) as side:
            fields |= kit.on_backend(backend, deferral(side) | unnotifiable(side))
    return fields
