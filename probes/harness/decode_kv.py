"""One decode rank of a PD pair: the real transfer queue, receiver and KV manager, on a chosen back end.

``DecodeTransferQueue`` and the back end's receiver and KV manager are
SGLang's own classes built with ``__new__`` (see :mod:`harness.strict`) in
decode mode; their methods run unchanged. The back end is picked the way a
server picks it: ``ServerArgs.disaggregation_transfer_backend`` (``mooncake``
by default, ``nixl``, ``mori``), mapped to classes by the build's own
``get_kv_class``. Faked are only what a CPU cannot have or must not touch:

- the zmq sockets to the prefill ranks (:class:`harness.wire.Wire`) and the
  back end's transfer engine (Mooncake's engine, NIXL's agent, Mori's engine
  descriptor): decode only asks them for its own name;
- GPU memory: ``release_kv_cache`` (swapped in every module of the build that
  imported it, as SGLang's tests patch it at its import site), the metadata
  buffers and the radix tree;
- the scheduler's output streamer and metrics collector (recorders).

Values the outcome depends on come from the build: the deferred-release
timeout is the transfer queue's own (its constructor's default) unless a
scenario forces one, which is then reported with the build's default.

The receiver publishes its destination to the prefill ranks with its real
``send_metadata`` (the fake sockets record it), and a client abort goes through
the real ``Scheduler.abort_request`` (:meth:`DecodeRank.client_abort`). The
metadata-slot allocator is SGLang's real ``ReqToMetadataIdxAllocator`` and the
rank group is a real one-rank gloo group.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from difflab.probe.kit import Kit, Recorder, StrictFake
from harness.gloo import single_rank_group
from harness.requests import new_req
from harness.runtime import scheduler_metrics, swapped_at_import_sites
from harness.strict import prime, strict_instance
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
        """ABORTs decode sent, a repeat of the same message to the same rank counted once (prefill treats it alike)."""
        return self.wire.count_distinct(b"ABORT")

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
        """Swap ``release_kv_cache`` wherever the build imported it, and watch decode's warnings."""
        from sglang.srt.disaggregation import decode
        from sglang.srt.mem_cache import common

        with swapped_at_import_sites(common, "release_kv_cache", self.release_kv_cache):
            decode.logger.addHandler(self.warnings)
            try:
                yield
            finally:
                decode.logger.removeHandler(self.warnings)


# --- back-end adaptations (one place): what each transport's decode side needs faked --------------
BACKENDS = ("mooncake", "nixl", "mori")
"""The transports driven here, Mooncake (the server's default) first. Ascend needs an NPU; ``fake`` moves no KV."""

TRANSPORT_PACKAGES = {"mori": "mori"}
"""A back end whose conn module imports its RDMA library at module level: that library is stubbed (the transport)."""


def _engine_attrs(kit: Kit, backend: str) -> dict[str, Any]:
    """The transfer engine a back end's decode KV manager holds; decode only asks it for its own name."""
    if backend == "mooncake":
        return {"engine": kit.fake("mooncake engine", get_session_id=lambda: DECODE_SESSION)}
    if backend == "nixl":
        agent = kit.fake("nixl agent")
        agent.name = DECODE_SESSION  # a fake's own label is its first argument, so the agent's name is set after
        # kv_args: the GPU buffers; NIXL's send_metadata logs the engine rank
        return {"agent": agent, "kv_args": kit.fake("kv_args", engine_rank=0)}
    if backend == "mori":
        return {"engine_desc": kit.fake("mori engine descriptor", key=DECODE_SESSION)}
    raise ValueError(f"no decode transport adaptation for back end {backend!r}")


def _receiver_attrs(backend: str) -> dict[str, Any]:
    """What a back end's receiver learnt in its own ``__init__`` from its engine (Mooncake: the session id)."""
    return {"session_id": DECODE_SESSION} if backend == "mooncake" else {}


def _import_transport(backend: str) -> None:
    """Import the back end's conn module, its RDMA library (never on a CPU) stubbed where it needs one."""
    import importlib

    package = TRANSPORT_PACKAGES.get(backend)
    if package is None or package in sys.modules:
        importlib.import_module(f"sglang.srt.disaggregation.{backend}")
        return
    from difflab.probe.stubs import StubFinder

    finder = StubFinder((package,))
    sys.meta_path.insert(0, finder)
    try:
        importlib.import_module(f"sglang.srt.disaggregation.{backend}")
    finally:
        sys.meta_path.remove(finder)


@functools.cache
def transport_classes(backend: str) -> tuple[type, type]:
    """(KV manager, receiver) of ``backend``, chosen as a server chooses: ServerArgs, TransferBackend, get_kv_class."""
    from sglang.srt.disaggregation.utils import KVClassType, TransferBackend, get_kv_class
    from sglang.srt.server_args import ServerArgs

    _import_transport(backend)
    chosen = TransferBackend(
        ServerArgs(model_path="dummy", disaggregation_transfer_backend=backend).disaggregation_transfer_backend
    )
    return get_kv_class(chosen, KVClassType.MANAGER), get_kv_class(chosen, KVClassType.RECEIVER)


@functools.cache
def deferral_gap(backend: str) -> str | None:
    """Why this build's ``backend`` cannot hold decode pages until prefill's drain ack; None where it can.

    A back end the build does not ship, one whose KV manager declares it cannot defer
    (``supports_deferred_decode_kv_release``, 0.5.21+), or one whose decode side never
    consumes a drain ack (no ``note_abort_ack`` / ``handle_abort_ack_message`` call in its
    module: Mori up to 0.5.21) has none of the machinery deferred release needs.
    """
    import inspect

    from sglang.srt.server_args import DISAGG_TRANSFER_BACKEND_CHOICES

    if backend not in DISAGG_TRANSFER_BACKEND_CHOICES:
        return (
            f"this build ships no {backend} transfer back end (choices: {', '.join(DISAGG_TRANSFER_BACKEND_CHOICES)})"
        )
    try:
        manager_cls, _ = transport_classes(backend)
    except ModuleNotFoundError as exc:
        if (exc.name or "").startswith(f"sglang.srt.disaggregation.{backend}"):
            return f"this build has no module {exc.name}"
        raise
    if getattr(manager_cls, "supports_deferred_decode_kv_release", True) is False:
        return f"{manager_cls.__name__}.supports_deferred_decode_kv_release is False: it cannot defer decode KV release"
    source = inspect.getsource(sys.modules[manager_cls.__module__])
    if "note_abort_ack" not in source and "handle_abort_ack_message" not in source:
        return f"{manager_cls.__module__} never consumes a prefill rank's drain ack (ABORT_ACK)"
    return None


def _decode_manager(kit: Kit, backend: str, manager_defers: bool) -> Any:
    """The decode rank's real KV manager of ``backend`` (decode mode), its bookkeeping from this build's constructor.

    Deferred release is forced (on, or off for a control), reported with the build's own default.
    """
    from sglang.srt.disaggregation.utils import DisaggregationMode

    manager_cls, _ = transport_classes(backend)
    return strict_instance(
        kit,
        manager_cls,
        "decode_kv_mgr",
        disaggregation_mode=DisaggregationMode.DECODE,
        forced={"enable_deferred_decode_kv_release": manager_defers},
        local_ip=DECODE_IP,
        rank_port=DECODE_PORT,
        **_engine_attrs(kit, backend),
    )


def _receiver_class_attrs(kit: Kit, wire: Wire, prefill_ranks: int) -> dict[str, Any]:
    """What SGLang keeps on the receiver class (shared by every receiver of the process): sockets, locks."""
    endpoints = [prefill_endpoint(r) for r in range(prefill_ranks)]
    return {
        "_socket_cache": wire.sockets(*endpoints),
        "_socket_locks": Wire.locks(*endpoints),
        "_global_lock": threading.Lock(),
        # Any attempt to open a real socket is reported, not performed.
        "_ctx": kit.fake("receiver zmq.Context"),
    }


def _receiver(
    kit: Kit,
    wire: Wire,
    kv_mgr: Any,
    room: int,
    prefill_ranks: int,
    notifiable: bool,
    backend: str,
    class_attrs: dict[str, Any] | None = None,
) -> Any:
    """A real receiver of ``backend`` for ``room``, bootstrapped: the room is WaitingForInput on the manager."""
    from sglang.srt.disaggregation.base.conn import KVPoll

    _, receiver_cls = transport_classes(backend)

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
        receiver_cls,
        "kv_receiver",
        class_attrs=class_attrs or _receiver_class_attrs(kit, wire, prefill_ranks),
        kv_mgr=kv_mgr,
        bootstrap_room=room,
        bootstrap_addr=BOOTSTRAP_ADDR,
        bootstrap_infos=bootstrap_infos,
        required_dst_info_num=1,  # what the receiver's init() learns from the bootstrap server
        **_receiver_attrs(backend),
    )
    # The room's real lifecycle on the decode side: bootstrapped, metadata sent.
    kv_mgr.addr_to_rooms_tracker[BOOTSTRAP_ADDR].add(room)
    kv_mgr.prefill_response_tracker[room] = set()
    kv_mgr.required_prefill_response_num_table[room] = prefill_ranks
    kv_mgr.update_status(room, KVPoll.Bootstrapping)
    kv_mgr.update_status(room, KVPoll.WaitingForInput)
    return receiver


@dataclass
class _QueueParts:
    queue: Any  # DecodeTransferQueue
    metrics: StrictFake
    metadata_rooms: Any  # torch tensor: the bootstrap room each metadata slot holds
    deferred_outcomes: list[str]


def _transfer_queue(
    kit: Kit,
    decode_reqs: list[Any],
    allocator: Any,
    slots: int,
    queue_defers: bool,
    release_timeout_s: float | None,
) -> _QueueParts:
    """The real ``DecodeTransferQueue`` holding ``decode_reqs``, with faked metadata buffers, metrics and scheduler."""
    import torch
    from sglang.srt.disaggregation.decode import DecodeTransferQueue

    metadata_rooms = torch.zeros((slots, 8), dtype=torch.int64)
    for decode_req in decode_reqs:
        metadata_rooms[decode_req.metadata_buffer_index, 0] = int(decode_req.req.bootstrap_room)

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
        **_metrics(kit, metrics),
    )
    queue = strict_instance(
        kit,
        DecodeTransferQueue,
        "transfer_queue",
        queue=list(decode_reqs),
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
        forced={
            "enable_deferred_kv_release": queue_defers,
            # the release timeout is the build's own unless the scenario needs another (reported with the build's)
            **({"deferred_kv_release_timeout": release_timeout_s} if release_timeout_s is not None else {}),
        },
    )
    return _QueueParts(queue, metrics, metadata_rooms, deferred_outcomes)


def _metrics(kit: Kit, collector: StrictFake) -> dict[str, Any]:
    """The scheduler's metrics reporter (:func:`harness.runtime.scheduler_metrics`: the build's default, off)
    and, only where metrics are on, its collector; a collector call nobody gated is a probe error."""
    parts = scheduler_metrics(kit)
    return parts | {"metrics_collector": collector if parts["metrics_reporter"].enable_metrics else None}


def build_decode_rank(
    kit: Kit,
    *,
    rid: str,
    prefill_ranks: int,
    queue_defers: bool,
    manager_defers: bool,
    backend: str = "mooncake",
    release_timeout_s: float | None = None,
    notifiable: bool = True,
    refuse_metadata_at: int | None = None,
) -> DecodeRank:
    """A decode rank with one request in the transfer queue, metadata published to prefill.

    ``notifiable=False`` models a receiver that never learnt where the prefill
    ranks are (no bootstrap info), so it has nobody to send an ABORT to and
    publishes nothing. ``refuse_metadata_at`` makes that prefill rank refuse
    the metadata once (:meth:`DecodeRank.publish_metadata`).
    """
    from sglang.srt.disaggregation.decode import DecodeRequest
    from sglang.srt.disaggregation.utils import ReqToMetadataIdxAllocator

    wire = Wire(kit)
    req = new_req(rid)  # a real Req with its own bootstrap room
    room = int(req.bootstrap_room)
    kv_mgr = _decode_manager(kit, backend, manager_defers)
    receiver = _receiver(kit, wire, kv_mgr, room, prefill_ranks, notifiable, backend)
    allocator = ReqToMetadataIdxAllocator(METADATA_SLOTS)
    slot = allocator.alloc()
    decode_req = DecodeRequest(req=req, kv_receiver=receiver, metadata_buffer_index=slot)
    parts = _transfer_queue(kit, [decode_req], allocator, METADATA_SLOTS, queue_defers, release_timeout_s)
    rank = DecodeRank(
        kit=kit,
        wire=wire,
        queue=parts.queue,
        kv_mgr=kv_mgr,
        receiver=receiver,
        decode_req=decode_req,
        release_kv_cache=kit.recorder("release_kv_cache"),
        metrics=parts.metrics,
        deferred_outcomes=parts.deferred_outcomes,
    )
    if notifiable:
        rank.publish_metadata(refused_by=refuse_metadata_at)
    return rank


@dataclass
class DecodeRooms:
    """One decode rank holding many rooms at once: one KV manager and transfer queue, a receiver per room.

    :meth:`admit` adds requests the way ``build_decode_rank`` builds its one: a real
    ``Req``, a real bootstrapped receiver, a metadata slot of the real allocator, the
    destination published to every prefill rank through the real ``send_metadata``.
    """

    kit: Kit
    wire: Wire
    kv_mgr: Any
    queue: Any  # DecodeTransferQueue
    metadata_rooms: Any
    release_kv_cache: Recorder
    prefill_ranks: int
    receiver_class_attrs: dict[str, Any]

    @property
    def allocator(self) -> Any:
        return self.queue.req_to_metadata_buffer_idx_allocator

    def admit(self, rids: list[str]) -> list[Any]:
        """New requests in the transfer queue, their metadata published; returns their ``DecodeRequest``s."""
        import numpy as np
        from sglang.srt.disaggregation.decode import DecodeRequest

        added = []
        for rid in rids:
            req = new_req(rid)
            room = int(req.bootstrap_room)
            receiver = _receiver(
                self.kit, self.wire, self.kv_mgr, room, self.prefill_ranks, True, "mooncake", self.receiver_class_attrs
            )
            slot = self.allocator.alloc()
            if slot is None:
                raise RuntimeError(f"no free metadata slot for {rid}: the rooms outgrew the allocator")
            self.metadata_rooms[slot, 0] = room
            decode_req = DecodeRequest(req=req, kv_receiver=receiver, metadata_buffer_index=slot)
            receiver.send_metadata(np.array([10, 11, 12, 13], dtype=np.int32), slot)
            prime(receiver)  # what earlier receivers read from the constructor, read now, not on the hot path
            self.queue.queue.append(decode_req)
            added.append(decode_req)
        return added

    def slot_free(self, decode_req: Any) -> bool:
        return int(decode_req.metadata_buffer_index) in self.allocator.free_slots

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """Swap ``release_kv_cache`` wherever the build imported it."""
        from sglang.srt.mem_cache import common

        with swapped_at_import_sites(common, "release_kv_cache", self.release_kv_cache):
            yield


def build_decode_rooms(kit: Kit, *, slots: int, prefill_ranks: int, release_timeout_s: float) -> DecodeRooms:
    """An empty Mooncake decode rank with deferred release forced on (queue and manager), room for ``slots`` requests.

    ``release_timeout_s`` is forced too (reported with the build's own default).
    """
    from sglang.srt.disaggregation.utils import ReqToMetadataIdxAllocator

    wire = Wire(kit)
    kv_mgr = _decode_manager(kit, "mooncake", manager_defers=True)
    allocator = ReqToMetadataIdxAllocator(slots)
    parts = _transfer_queue(kit, [], allocator, slots, True, release_timeout_s)
    return DecodeRooms(
        kit=kit,
        wire=wire,
        kv_mgr=kv_mgr,
        queue=parts.queue,
        metadata_rooms=parts.metadata_rooms,
        release_kv_cache=kit.recorder("release_kv_cache"),
        prefill_ranks=prefill_ranks,
        receiver_class_attrs=_receiver_class_attrs(kit, wire, prefill_ranks),
    )


# --- version adaptation: a prefill rank's drain ack, as decode's receive thread handles it -------------
def deliver_abort_ack(kv_mgr: Any, room: int, prefill_rank: int, abort_frames: list[bytes]) -> None:
    """A prefill rank's drain ack for the ABORT it received.

    0.5.22: ABORT and ABORT_ACK carry a generation and decode consumes the ack's
    wire form (``handle_abort_ack_message``). <= 0.5.21: decode's receive
    thread calls ``note_abort_ack(room, prefill_rank)`` inline.
    """
    from sglang.srt.disaggregation.common import conn

    if hasattr(conn.CommonKVManager, "handle_abort_ack_message"):  # 0.5.22
        from sglang.srt.disaggregation.common.conn import AbortAck, AbortNotification

        generation = AbortNotification.from_zmq(abort_frames).generation
        kv_mgr.handle_abort_ack_message(AbortAck(room, prefill_rank, generation).to_zmq())
    else:
        kv_mgr.note_abort_ack(room, prefill_rank)
