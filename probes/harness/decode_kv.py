"""One decode rank of a PD pair: the real transfer queue, receiver and KV manager.

``DecodeTransferQueue``, ``MooncakeKVReceiver`` and ``MooncakeKVManager`` are
SGLang's own classes built with ``__new__`` (see :mod:`harness.strict`) in
decode mode; their methods run unchanged. Faked are only what a CPU cannot
have or must not touch:

- the zmq sockets to the prefill ranks (:class:`harness.wire.Wire`);
- GPU memory: ``release_kv_cache`` (patched where ``decode.py`` imported it,
  as SGLang's tests do), the metadata buffers and the radix tree;
- the scheduler's output streamer and metrics collector (recorders).

The receiver publishes its destination to the prefill ranks with its real
``send_metadata`` (the fake sockets record it), and a client abort goes through
the real ``Scheduler.abort_request`` (:meth:`DecodeRank.client_abort`). The
metadata-slot allocator is SGLang's real ``ReqToMetadataIdxAllocator`` and the
rank group is a real one-rank gloo group.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from difflab.probe.kit import Kit, Recorder, StrictFake
from harness.gloo import single_rank_group
from harness.requests import new_req
from harness.runtime import swapped
from harness.strict import strict_instance
from harness.wire import Wire, tcp_endpoint

DECODE_IP = "192.0.2.20"
DECODE_PORT = 17020
BOOTSTRAP_ADDR = "192.0.2.10:8998"
PREFILL_IP = "192.0.2.10"
PREFILL_BASE_PORT = 17100
METADATA_SLOTS = 4
DECODE_SESSION = "decode-session-0"


def prefill_endpoint(rank: int) -> str:
    return tcp_endpoint(PREFILL_IP, PREFILL_BASE_PORT + rank)


class WarningLog(logging.Handler):
    """Collects WARNING records of one logger (the kit only collects ERRORs)."""

    def __init__(self) -> None:
        super().__init__(level=logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@dataclass
class DecodeRank:
    """Everything one scenario observes; built fresh per scenario."""

    kit: Kit
    wire: Wire
    queue: Any  # DecodeTransferQueue
    kv_mgr: Any  # MooncakeKVManager (decode mode)
    receiver: Any  # MooncakeKVReceiver
    decode_req: Any  # DecodeRequest
    release_kv_cache: Recorder
    metrics: StrictFake
    deferred_outcomes: list[str] = field(default_factory=list)
    warnings: WarningLog = field(default_factory=WarningLog)

    @property
    def room(self) -> int:
        return int(self.decode_req.req.bootstrap_room)

    @property
    def slot(self) -> int:
        return int(self.decode_req.metadata_buffer_index)

    def slot_free(self) -> bool:
        return self.slot in self.queue.req_to_metadata_buffer_idx_allocator.free_slots

    def held(self) -> bool:
        """The request's pages and metadata slot are held: neither released nor freed yet.

        Observed through behaviour (the release call and the slot), not through the
        name of the queue's bookkeeping list, so a fork that keeps its own list reads the same.
        """
        return self.release_kv_cache.count == 0 and not self.slot_free()

    def abort_messages(self) -> int:
        return self.wire.count(b"ABORT")

    def publish_metadata(self, *, refused_by: int | None = None) -> None:
        """The receiver's real ``send_metadata``: every prefill rank learns where to write the room's KV.

        ``refused_by`` makes that prefill rank's socket refuse the send once (a
        transient ZMQ error): the ranks before it already hold the destination,
        the rest do not -- a *partial publish*, which SGLang concludes Failed.
        """
        import numpy as np
        import zmq

        if refused_by is not None:
            self.wire.refuse_next(
                prefill_endpoint(refused_by),
                self.kit.intended_failure(
                    f"prefill rank {refused_by}'s socket refuses the metadata once", zmq.ZMQError
                )(zmq.EAGAIN),
            )
        self.receiver.send_metadata(np.array([10, 11, 12, 13], dtype=np.int32), self.slot)

    def client_abort(self) -> None:
        """The client aborts the request: the real ``Scheduler.abort_request`` with a real ``AbortReq``.

        The request sits in the decode transfer queue; the scheduler is a real
        one built without its constructor around it (empty waiting queue,
        prealloc queue and running batch).
        """
        from sglang.srt.disaggregation.utils import DisaggregationMode
        from sglang.srt.managers.io_struct import AbortReq
        from sglang.srt.managers.scheduler import Scheduler

        scheduler = strict_instance(
            self.kit,
            Scheduler,
            "decode_scheduler",
            disaggregation_mode=DisaggregationMode.DECODE,
            waiting_queue=[],
            chunked_req=None,
            mm_receiver=None,
            dllm_config=None,
            grammar_manager=self.kit.fake("grammar_manager", abort_requests=self.kit.recorder("abort_requests")),
            disagg_decode_prealloc_queue=self.kit.fake("prealloc_queue", queue=[], retracted_queue=[]),
            disagg_decode_transfer_queue=self.queue,
            running_batch=self.kit.fake("running_batch", reqs=[]),
            last_batch=None,
            enable_continuous_input_polling=False,
            ps=self.kit.fake("parallel state", pp_size=1),  # <= 0.5.20 reads the PP size here
        )
        scheduler.abort_request(AbortReq(rid=self.decode_req.req.rid))

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """Patch ``release_kv_cache`` at decode.py's import site and watch its warnings."""
        from sglang.srt.disaggregation import decode

        with swapped(decode, "release_kv_cache", self.release_kv_cache):
            decode.logger.addHandler(self.warnings)
            try:
                yield
            finally:
                decode.logger.removeHandler(self.warnings)


def _switch(name: str, on: bool) -> dict[str, Any]:
    """Deferred release forced on (recorded beside the verdict with this build's default), or plainly off."""
    return {"forced": {name: True}} if on else {name: False}


def build_decode_rank(
    kit: Kit,
    *,
    rid: str,
    prefill_ranks: int,
    queue_defers: bool,
    manager_defers: bool,
    release_timeout_s: float,
    notifiable: bool = True,
    refuse_metadata_at: int | None = None,
) -> DecodeRank:
    """A decode rank with one request in the transfer queue, metadata published to prefill.

    ``notifiable=False`` models a receiver that never learnt where the prefill
    ranks are (no bootstrap info), so it has nobody to send an ABORT to and
    publishes nothing. ``refuse_metadata_at`` makes that prefill rank refuse
    the metadata once (:meth:`DecodeRank.publish_metadata`).
    """
    import torch
    from sglang.srt.disaggregation.base.conn import KVPoll
    from sglang.srt.disaggregation.decode import DecodeRequest, DecodeTransferQueue
    from sglang.srt.disaggregation.mooncake.conn import MooncakeKVManager, MooncakeKVReceiver
    from sglang.srt.disaggregation.utils import DisaggregationMode, ReqToMetadataIdxAllocator

    wire = Wire(kit)
    endpoints = [prefill_endpoint(r) for r in range(prefill_ranks)]
    req = new_req(rid)  # a real Req with its own bootstrap room
    room = int(req.bootstrap_room)

    kv_mgr = strict_instance(
        kit,
        MooncakeKVManager,
        "decode_kv_mgr",
        disaggregation_mode=DisaggregationMode.DECODE,
        **_switch("enable_deferred_decode_kv_release", manager_defers),
        local_ip=DECODE_IP,
        rank_port=DECODE_PORT,
        # the Mooncake transfer engine (RDMA): decode only asks it for its session id
        engine=kit.fake("mooncake engine", get_session_id=lambda: DECODE_SESSION),
    )
    bootstrap_infos = (
        [
            {"rank_ip": PREFILL_IP, "rank_port": PREFILL_BASE_PORT + r, "is_dummy": False, "pp_rank": 0}
            for r in range(prefill_ranks)
        ]
        if notifiable
        else None
    )
    receiver = strict_instance(
        kit,
        MooncakeKVReceiver,
        "kv_receiver",
        class_attrs={
            "_socket_cache": wire.sockets(*endpoints),
            "_socket_locks": Wire.locks(*endpoints),
            "_global_lock": threading.Lock(),
            # Any attempt to open a real socket is reported, not performed.
            "_ctx": kit.fake("receiver zmq.Context"),
        },
        kv_mgr=kv_mgr,
        bootstrap_room=room,
        bootstrap_addr=BOOTSTRAP_ADDR,
        bootstrap_infos=bootstrap_infos,
        required_dst_info_num=1,  # what the receiver's init() learns from the bootstrap server
        session_id=DECODE_SESSION,
    )
    # The room's real lifecycle on the decode side: bootstrapped, metadata sent.
    kv_mgr.addr_to_rooms_tracker[BOOTSTRAP_ADDR].add(room)
    kv_mgr.prefill_response_tracker[room] = set()
    kv_mgr.required_prefill_response_num_table[room] = prefill_ranks
    kv_mgr.update_status(room, KVPoll.Bootstrapping)
    kv_mgr.update_status(room, KVPoll.WaitingForInput)

    allocator = ReqToMetadataIdxAllocator(METADATA_SLOTS)
    slot = allocator.alloc()
    decode_req = DecodeRequest(req=req, kv_receiver=receiver, metadata_buffer_index=slot)

    metadata_rooms = torch.zeros((METADATA_SLOTS, 8), dtype=torch.int64)
    metadata_rooms[slot, 0] = room

    def clear_slot(idx: int) -> None:
        metadata_rooms[idx] = 0

    deferred_outcomes: list[str] = []

    def observe_deferred(*, duration_seconds: float, outcome: str) -> None:
        deferred_outcomes.append(outcome)

    metrics = kit.fake(
        "metrics_collector",
        increment_transfer_failed_reqs=kit.recorder("increment_transfer_failed_reqs"),
        observe_decode_deferred_kv_release=kit.recorder(
            "observe_decode_deferred_kv_release", side_effect=observe_deferred
        ),
    )
    scheduler = kit.fake(
        "scheduler",
        enable_decode_hicache=False,
        enable_hisparse=False,
        kv_checksum_computer=None,
        output_streamer=kit.fake("output_streamer", stream_output=kit.recorder("stream_output")),
        metrics_reporter=kit.fake("metrics_reporter", enable_metrics=True),
        metrics_collector=metrics,
    )
    queue = strict_instance(
        kit,
        DecodeTransferQueue,
        "transfer_queue",
        queue=[decode_req],
        gloo_group=single_rank_group(),
        req_to_metadata_buffer_idx_allocator=allocator,
        tp_rank=0,
        metadata_buffers=kit.fake(
            "metadata_buffers",
            bootstrap_room=metadata_rooms,
            clear_slot=kit.recorder("clear_slot", side_effect=clear_slot),
        ),
        scheduler=scheduler,
        tree_cache=kit.fake("tree_cache", unlock=kit.recorder("tree_cache.unlock")),
        spec_algorithm=None,
        enable_staging=False,
        staging_handler=None,
        enable_host_receive=False,
        **_switch("enable_deferred_kv_release", queue_defers),
        deferred_kv_release_timeout=release_timeout_s,
    )
    rank = DecodeRank(
        kit=kit,
        wire=wire,
        queue=queue,
        kv_mgr=kv_mgr,
        receiver=receiver,
        decode_req=decode_req,
        release_kv_cache=kit.recorder("release_kv_cache"),
        metrics=metrics,
        deferred_outcomes=deferred_outcomes,
    )
    if notifiable:
        rank.publish_metadata(refused_by=refuse_metadata_at)
    return rank
