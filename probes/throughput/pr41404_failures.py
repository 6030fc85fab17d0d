"""#41404 throughput: transfer failures through decode's deferred-release bookkeeping until resolved.

The fix makes every transfer failure decode did not initiate go the long way: the real
``DecodeTransferQueue.pop_transferred`` notifies every prefill rank (ABORT,
``ensure_abort_notified(force_arm=True)``) and holds the pages until each rank acks the
drain, where the base released them at once. What that bookkeeping costs per failure,
and whether it grows with the rooms held, is measured on the decode server the behaviour
probe starts (:func:`harness.decode_kv.decode_side`: the build's ``run_scheduler_process``
on Mooncake, its own scheduler, queues, KV manager and a receiver per room from the
build's prealloc queue; deferred release switched on through the build's switch; the
transfer edge and GPU memory faked). The side is sized for the load through launch flags
(``--max-running-requests``, ``--max-total-tokens``, ``--num-reserved-decode-tokens``),
and the release timeout forced far out of reach (both reported with the build's values).

Workload ``failures``: the load ``n`` is the rooms held -- ``n`` requests admitted
through the scheduler's dispatch and bootstrapped, preallocated and published to both
prefill ranks by its event loop (a few passes, untimed), each then reported Failed by a prefill rank
(decode's receive thread's work, before the timer). Timed until resolved: one pass of the
event loop's decode queue step (``pop_transferred`` notifies and holds), the drain ack of
every prefill rank that got an ABORT (handled as decode's receive thread handles it), a
second pass (``resolve_deferred_releases``). Checked after it, never timed: nothing was
handed to decoding and every room's pages were released exactly once and its metadata
slot freed -- else a probe failure.
"""

from __future__ import annotations

import contextlib
import itertools
from typing import Any

from difflab.probe.bench import Workload
from difflab.probe.kit import Kit, ProbeFailure
from harness.decode_kv import DecodeSide, decode_side, deliver_abort_ack, prefill_endpoint
from harness.requests import new_req
from harness.runtime import ensure_runtime

BACKEND = "mooncake"  # the server's default back end
PREFILL_RANKS = 2
LONG_TIMEOUT_S = 600.0  # never reached: every release must come from the acks (or be immediate)
ROOM_TOKENS = 32  # a room's prompt (16) and new tokens (8), rounded up: the KV pool holds n rooms
RESERVED_DECODE_TOKENS = 1  # decode's per-request headroom, so n rooms fit a pool of n * ROOM_TOKENS
ADMISSION_PASSES = 3  # event-loop passes a batch may take to reach the transfer queue (untimed)
PREFILL_FAILURE = "probe: prefill rank reported the transfer Failed"
_rids = itertools.count()


# --- version adaptation (one place, detected by feature) ---------------------------
def abort_room(frames: list[bytes]) -> int:
    """The room an ABORT on the wire is about: ``AbortNotification`` (0.5.22) or four plain frames (<= 0.5.21)."""
    from sglang.srt.disaggregation.common import conn

    if hasattr(conn, "AbortNotification"):
        return int(conn.AbortNotification.from_zmq(frames).room)
    return int(frames[1])


def open_side(kit: Kit, size: int) -> DecodeSide:
    """A decode server with room for ``size`` requests; its edges are held again around each run."""
    with decode_side(
        kit,
        BACKEND,
        prefill_ranks=PREFILL_RANKS,
        max_running_requests=size,
        max_total_tokens=max(size, 8) * (ROOM_TOKENS + RESERVED_DECODE_TOKENS),
        num_reserved_decode_tokens=RESERVED_DECODE_TOKENS,
    ) as side:
        kit.forced_flag(
            "transfer_queue.deferred_kv_release_timeout",
            LONG_TIMEOUT_S,
            side.queue.deferred_kv_release_timeout,
            "DecodeTransferQueue.__init__ (as built)",
            [],
        )
        side.queue.deferred_kv_release_timeout = LONG_TIMEOUT_S
    return side


class Failures:
    """A decode server about to meet ``size`` failed transfers in one pass of its event loop."""

    def __init__(self, kit: Kit, size: int) -> None:
        self.size = size
        self.side = open_side(kit, size)
        self.ranks = {prefill_endpoint(r): r for r in range(PREFILL_RANKS)}
        self.batch: list[Any] = []
        self.transferred: list[Any] = []
        self.held = contextlib.ExitStack()

    def setup(self) -> None:
        from sglang.srt.disaggregation.base.conn import KVPoll

        side = self.side
        self.held.enter_context(side.edges())
        self.batch = self._admitted([new_req(f"failing-{next(_rids)}") for _ in range(self.size)])
        side.transport.wire.sent.clear()  # the published metadata; from here on the wire holds what run() sends
        for decode_req in self.batch:
            room = int(decode_req.req.bootstrap_room)
            side.kv_mgr.record_failure(room, PREFILL_FAILURE)
            side.kv_mgr.update_status(room, KVPoll.Failed)

    def _admitted(self, reqs: list[Any]) -> list[Any]:
        """``reqs`` through the scheduler's dispatch and the event loop's passes; their ``DecodeRequest``s.

        A room whose bootstrap completes after that pass's preallocation is preallocated by the next.
        """
        side = self.side
        for req in reqs:
            side.scheduler._add_request_to_queue(req)
        handed: list[Any] = []
        for _ in range(ADMISSION_PASSES):
            handed += side.step()
            arrived = {id(d.req): d for d in side.queue.queue}
            missing = [req.rid for req in reqs if id(req) not in arrived]
            if not missing:
                break
        if handed or missing:
            prealloc = side.scheduler.disagg_decode_prealloc_queue
            waiting = [(d.req.rid, str(d.kv_receiver.poll())) for d in prealloc.queue]
            raise ProbeFailure(
                f"{len(missing)} of {len(reqs)} requests did not reach the transfer queue in {ADMISSION_PASSES} passes "
                f"({len(handed)} handed to decoding before any KV arrived; prealloc queue: {waiting}, "
                f"{len(getattr(prealloc, 'pending_reqs', []))} pending, "
                f"{prealloc.token_to_kv_pool_allocator.available_size()} KV tokens and "
                f"{prealloc.req_to_metadata_buffer_idx_allocator.available_size()} metadata slots free)"
            )
        return [arrived[id(req)] for req in reqs]

    def run(self) -> int:
        side, ranks = self.side, self.ranks
        self.transferred = side.step()
        for endpoint, frames in list(side.transport.wire.sent):
            if frames and frames[0] == b"ABORT":
                deliver_abort_ack(side, abort_room(frames), ranks[endpoint], frames)
        self.transferred += side.step()
        return len(self.batch)

    def teardown(self) -> None:
        side = self.side
        reqs = [d.req for d in self.batch]
        released = sum(1 for call in side.release_kv_cache.calls if call.args and any(call.args[0] is r for r in reqs))
        free = side.queue.req_to_metadata_buffer_idx_allocator.free_slots
        freed = sum(1 for d in self.batch if int(d.metadata_buffer_index) in free)
        try:
            if self.transferred or side.queue.queue or released != self.size or freed != self.size:
                raise ProbeFailure(
                    f"{self.size} failed transfers: {len(self.transferred)} handed to decoding, "
                    f"{len(side.queue.queue)} still queued, {released} released, {freed} slots freed"
                )
        finally:
            self.held.close()
        side.release_kv_cache.calls.clear()  # the bench keeps no request alive between runs
        side.forget(reqs)
        side.transport.wire.sent.clear()
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
            "n transfer failures through the decode event loop's pop_transferred, the prefill "
            "ranks' drain acks and its resolve_deferred_releases, until every room is released",
        )
    ]
