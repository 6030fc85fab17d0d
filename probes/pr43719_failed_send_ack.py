"""#43719 (a) -- a failed Mooncake send never acks the drain of an aborted room.

Scenario: a prefill rank's real ``MooncakeKVManager.transfer_worker`` is
writing a room's last KV chunk to decode (deferred decode KV release on).
While the RDMA write is in flight decode aborts the request: its ABORT reaches
the real bootstrap thread, which marks the room Failed and registers decode as
the target of the drain ack (deferred until the in-flight write settles). Then
the write fails -- ``send_kvcache`` returns non-zero, as Mooncake's
``batch_transfer_sync`` does on its timeout while the batch may still be
writing into decode's pages.

Observations: ``failed.acks`` -- ABORT_ACKs sent to decode once the worker
concluded the failure (an ack tells decode the pages are safe to reuse);
``second_abort.acks`` -- a later, second ABORT for the same room;
``reused.acks`` -- after the scheduler cleared the room and a new request
opened it again (Bootstrapping, WaitingForInput), an ABORT for the new
lifecycle. Before the fix (<= 0.5.21) the worker acks the "drain" of the failed
write and every later ABORT; with it (0.5.22+) the room is poisoned: no ack
until the room's next lifecycle, so decode falls back to its release timeout.

Controls (equal on both sides): decode is told the room Failed; a successful
write during which decode aborts acks the drain exactly once; the new
lifecycle acks once.

Honesty: the worker wraps any exception in a RuntimeError and, from 0.5.22,
poisons the room while doing so -- exactly what the fix does on purpose. The
fakes are strict (a missing attribute is a BaseException the worker cannot
wrap), the RDMA fake runs under ``kit.guard``, and any RuntimeError escapes
the probe as an error instead of being observed.
"""

from __future__ import annotations

import itertools
import re
from typing import Any

from difflab.probe.kit import Kit
from harness.mooncake import DECODE_IP, DECODE_PORT, PrefillRank, build_prefill_rank

_generations = itertools.count(1)


# --- version adaptations (one place, detected by feature) -----------------------
def abort_message(room: int) -> list[bytes]:
    """Decode's ABORT for ``room`` as this release's decode puts it on the wire.

    0.5.22: the ABORT carries decode's abort generation (``AbortNotification``),
    which the ack must echo. <= 0.5.21: four frames, no generation. (Where the
    prefill side handles it moved too -- inline in ``bootstrap_thread`` up to
    0.5.21, ``_handle_abort_notification`` from 0.5.22 -- but the probe feeds
    the real bootstrap thread, so that move needs no adaptation.)
    """
    from sglang.srt.disaggregation.common import conn

    if hasattr(conn, "AbortNotification"):  # 0.5.22
        return conn.AbortNotification(
            room=room, decode_ip=DECODE_IP, decode_port=DECODE_PORT, generation=next(_generations)
        ).to_zmq()
    return [b"ABORT", str(room).encode("ascii"), DECODE_IP.encode("ascii"), str(DECODE_PORT).encode("ascii")]


# --- scenario steps ------------------------------------------------------------------
def _abort_during_send(rank: PrefillRank, return_code: int) -> None:
    """The next RDMA write: decode's ABORT arrives while it is in flight, then it returns ``return_code``."""

    def send() -> int:
        rank.deliver(abort_message(rank.room))
        return return_code

    rank.send_result = send


def _decode_told_failed(rank: PrefillRank) -> bool:
    """Some status message to decode reports this room Failed."""
    from sglang.srt.disaggregation.base.conn import KVPoll

    room, failed = str(rank.room).encode("ascii"), str(int(KVPoll.Failed)).encode("ascii")
    return any(
        len(frames) >= 2 and frames[0] == room and frames[1] == failed
        for endpoint, frames in rank.wire.sent
        if endpoint == rank.decode_endpoint
    )


# --- scenarios -------------------------------------------------------------------
def failed_send(kit: Kit) -> dict[str, Any]:
    """ABORT during a write that then fails: ack now, ack a second ABORT, ack after room reuse?"""
    rank = build_prefill_rank(kit, room=43001)
    _abort_during_send(rank, return_code=-1)
    rank.run_worker(rank.chunk(last=True))
    fields = {
        "failed.send_attempts": rank.send_kvcache.count,
        "failed.decode_told_failed": _decode_told_failed(rank),
        "failed.acks": rank.acks(),
    }
    before = rank.acks()
    rank.deliver(abort_message(rank.room))
    fields["second_abort.acks"] = rank.acks() - before

    before = rank.acks()
    rank.clear_sender()
    rank.open_room()
    rank.deliver(abort_message(rank.room))
    fields["reused.acks"] = rank.acks() - before
    return fields


def succeeded_send(kit: Kit) -> dict[str, Any]:
    """Control: ABORT during a write that succeeds -> the drain is acked once."""
    rank = build_prefill_rank(kit, room=43002)
    _abort_during_send(rank, return_code=0)
    rank.run_worker(rank.chunk(last=False))
    return {
        "succeeded.send_attempts": rank.send_kvcache.count,
        "succeeded.acks": rank.acks(),
    }


def observe(kit: Kit) -> dict[str, Any]:
    # The worker marks the Mooncake session dead after a failed write, at ERROR.
    kit.allow_log(rf"^Session {re.escape('decode-session-0')} failed\.$")
    fields: dict[str, Any] = {}
    for scenario in (failed_send, succeeded_send):
        fields.update(scenario(kit))
    return fields
