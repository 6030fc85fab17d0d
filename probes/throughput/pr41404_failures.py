"""#41404 throughput: transfer failures through decode's deferred-release bookkeeping until resolved.

The fix makes every transfer failure decode did not initiate go the long way: the real
``DecodeTransferQueue.pop_transferred`` notifies every prefill rank (ABORT,
``ensure_abort_notified(force_arm=True)``) and holds the pages until each rank acks the
drain, where the base released them at once. What that bookkeeping costs per failure,
and whether it grows with the rooms held, is measured on one decode rank built as the
behaviour probe builds it (:mod:`harness.decode_kv`: real ``MooncakeKVManager``,
``MooncakeKVReceiver`` per room and ``DecodeTransferQueue``; deferred release forced on
for queue and manager on both sides; the zmq sockets to two prefill ranks, GPU memory,
metrics and the output streamer faked).

Workload ``failures``: the load ``n`` is the rooms held -- ``n`` requests in the transfer
queue, their destination published to both prefill ranks, each reported Failed by a
prefill rank (decode's receive thread's work, before the timer). Timed until resolved:
one ``pop_transferred``, the drain ack of every prefill rank that got an ABORT (handled
as decode's receive thread handles it), one ``resolve_deferred_releases``. Checked after
it, never timed: nothing was handed to decoding and every room's pages were released
exactly once and its metadata slot freed -- else a probe failure.
"""

from __future__ import annotations

import itertools
from typing import Any

from difflab.probe.bench import Workload
from difflab.probe.kit import Kit, ProbeFailure
from harness.decode_kv import DecodeRooms, build_decode_rooms, deliver_abort_ack, prefill_endpoint
from harness.runtime import ensure_runtime

PREFILL_RANKS = 2
LONG_TIMEOUT_S = 600.0  # never reached: every release must come from the acks (or be immediate)
PREFILL_FAILURE = "probe: prefill rank reported the transfer Failed"
_rids = itertools.count()


# --- version adaptation (one place, detected by feature) ---------------------------
def abort_room(frames: list[bytes]) -> int:
    """The room an ABORT on the wire is about: ``AbortNotification`` (0.5.22) or four plain frames (<= 0.5.21)."""
    from sglang.srt.disaggregation.common import conn

    if hasattr(conn, "AbortNotification"):
        return int(conn.AbortNotification.from_zmq(frames).room)
    return int(frames[1])


class Failures:
    """A decode rank about to meet ``size`` failed transfers in one pass of its scheduler."""

    def __init__(self, kit: Kit, size: int) -> None:
        self.size = size
        self.rooms: DecodeRooms = build_decode_rooms(
            kit, slots=size, prefill_ranks=PREFILL_RANKS, release_timeout_s=LONG_TIMEOUT_S
        )
        self.ranks = {prefill_endpoint(r): r for r in range(PREFILL_RANKS)}
        self.batch: list[Any] = []
        self.transferred: list[Any] = []
        self.patch: Any = None

    def setup(self) -> None:
        from sglang.srt.disaggregation.base.conn import KVPoll

        mgr = self.rooms.kv_mgr
        self.batch = self.rooms.admit([f"failing-{next(_rids)}" for _ in range(self.size)])
        self.rooms.wire.sent.clear()  # the published metadata; from here on the wire holds what run() sends
        for decode_req in self.batch:
            room = int(decode_req.req.bootstrap_room)
            mgr.record_failure(room, PREFILL_FAILURE)
            mgr.update_status(room, KVPoll.Failed)
        self.patch = self.rooms.running()
        self.patch.__enter__()

    def run(self) -> int:
        queue, mgr, ranks = self.rooms.queue, self.rooms.kv_mgr, self.ranks
        self.transferred = queue.pop_transferred()
        for endpoint, frames in list(self.rooms.wire.sent):
            if frames and frames[0] == b"ABORT":
                deliver_abort_ack(mgr, abort_room(frames), ranks[endpoint], frames)
        queue.resolve_deferred_releases()
        return len(self.batch)

    def teardown(self) -> None:
        self.patch.__exit__(None, None, None)
        rooms = self.rooms
        released = rooms.release_kv_cache.count
        freed = sum(1 for d in self.batch if rooms.slot_free(d))
        if self.transferred or rooms.queue.queue or released != self.size or freed != self.size:
            raise ProbeFailure(
                f"{self.size} failed transfers: {len(self.transferred)} handed to decoding, "
                f"{len(rooms.queue.queue)} still queued, {released} released, {freed} slots freed"
            )
        rooms.release_kv_cache.calls.clear()  # the bench keeps no request alive between runs
        rooms.wire.sent.clear()
        scheduler = rooms.queue.scheduler
        scheduler.output_streamer.stream_output.calls.clear()
        if scheduler.metrics_collector is not None:  # metrics on (not this build's default)
            scheduler.metrics_collector.increment_transfer_failed_reqs.calls.clear()
        self.batch, self.transferred = [], []


def workloads(kit: Kit) -> list[Workload]:
    ensure_runtime()
    # pop_transferred logs every failed transfer at ERROR, with the recorded root cause.
    kit.allow_log(
        r"Decode transfer failed for request .* with exception KVTransferError\(bootstrap_room=\d+\): "
        rf"{PREFILL_FAILURE}$"
    )
    return [
        Workload(
            "failures",
            "aborts",
            lambda n: Failures(kit, n),
            "n transfer failures through pop_transferred, the prefill ranks' drain acks and "
            "resolve_deferred_releases, until every room is released",
        )
    ]
