"""One Mori prefill rank: the real KV manager's transfer worker, drainer and bootstrap thread.

The KV manager is the one a prefill server the build's own ``run_scheduler_process``
starts on Mori constructs (:func:`build_mori_rank`: whatever class the build's
``get_kv_class`` resolves, its real ``__init__``, deferred release switched on
through the build's own environment switch and reported with its default). A
room goes to one decode rank. The build's own code runs every step of a send:
``add_transfer_request`` queues a real ``TransferKVChunk`` on the room's shard;
the recorded shard worker (``_transfer_worker``) posts the room's writes through
the real ``send_kvcache`` / ``send_aux`` and waits for them; writes still in
flight go to the recorded drainer (``_drain_worker``), which waits for them and
releases the drain ack; decode's messages (its metadata, its ABORTs) reach the
recorded bootstrap thread over the manager's control socket. Faked are only
the GPU/RDMA and network edges:

- Mori's IO engine (:class:`Engine`): ``batch_write`` posts nothing and hands
  back one :class:`WriteStatus` per write, whose end (written, failed, still
  writing until the drainer waits on it) the scenario chooses, as it chooses
  what decode does meanwhile; ``wait_all`` settles the writes it waits for and
  answers with a status code (:class:`StatusCode`, swapped in for the stub the
  ``mori`` package is imported as);
- the zmq sockets: the control socket the bootstrap thread reads, the PUSH
  sockets to decode (:class:`harness.wire.Wire`) that carry the status
  messages, the aux data and every ``ABORT_ACK``;
- decode's registration (``decode_kv_args_table``), as decode's
  ``_register_kv_args`` delivers it (its engine and memory descriptors are fakes);
- while the server starts: the engine, the bootstrap server's HTTP API and the
  threads it starts (:mod:`harness.transport`; threads are recorded, not started,
  so a scenario runs their bodies in its own order, in its own thread).

Values the outcome could depend on are the build's own: the shard count, the
wait poll interval and the transfer SLA (``SGLANG_MORI_*``, read by the
constructor; the fake engine returns at once, so the poll interval costs
nothing), the aux path (TCP unless ``SGLANG_MORI_SEND_AUX_RDMA``). A fake that
is asked for something it does not have is a probe error naming it, never a
quiet default; the worker's ``except Exception`` cannot take it (a
``BaseException``).
"""

from __future__ import annotations

import contextlib
import enum
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from difflab.probe.kit import Kit, ProbeFailure
from harness.runtime import ensure_runtime, swapped
from harness.strict import strict_instance
from harness.transport import PushContext, RecordedThread, Transport
from harness.wire import Wire, tcp_endpoint

BACKEND = "mori"
DECODE_IP = "192.0.2.20"
DECODE_PORT = 17020
DECODE_ENGINE = "decode-engine-0"
POLLS_WITHOUT_PROGRESS = 3
"""``wait_all`` answers still-in-progress this often for writes nobody settles: then the probe stops."""

_generations = itertools.count(1)


class StatusCode(enum.Enum):
    """The codes Mori's ``IOEngine.wait_all`` answers (the build compares with SUCCESS and IN_PROGRESS)."""

    SUCCESS = "success"
    IN_PROGRESS = "in_progress"
    FAILED = "failed"


class _Unsettled(BaseException):  # noqa: N818 - a signal, not an error
    """The worker keeps polling writes the scenario never settles (a scenario or fake wired wrong)."""


@dataclass
class WriteStatus:
    """One posted RDMA write, as Mori's ``TransferStatus`` reports it.

    In progress until it settles: in ``wait_all`` (the shard worker's wait), or, if it
    ``lingers``, only when the drainer calls ``Wait()`` on it. It then ends written, or
    Failed if ``fails``.
    """

    index: int
    fails: bool = False
    lingers: bool = False
    state: StatusCode = StatusCode.IN_PROGRESS

    def settle(self) -> None:
        self.state = StatusCode.FAILED if self.fails else StatusCode.SUCCESS


@dataclass
class Engine:
    """Mori's IO engine as the prefill rank's transfer path reaches it: posts, waits, moves nothing.

    ``failing`` (the first N writes of the room end Failed) and ``lingering`` (the last N are
    still writing when the worker's wait returns) are the scenario's; ``on_post``,
    ``on_wait`` and ``on_drain`` run once, while the writes are being posted, while the
    worker waits for them, and while the drainer waits for a write still in flight:
    where decode's ABORT arrives.
    """

    kit: Kit
    failing: int = 0
    lingering: int = 0
    on_post: Callable[[], None] | None = None
    on_wait: Callable[[], None] | None = None
    on_drain: Callable[[], None] | None = None
    posted: list[WriteStatus] = field(default_factory=list)
    _uids: Iterator[int] = field(default_factory=lambda: itertools.count(1))
    _stalled: int = 0

    def fake(self) -> Any:
        """The strict fake the manager holds as ``engine`` (only what a send uses)."""
        return self.kit.fake(
            "mori IOEngine",
            allocate_transfer_uid=lambda: next(self._uids),
            batch_write=self.kit.recorder("mori.batch_write", side_effect=self._batch_write),
            wait_all=self.kit.recorder("mori.wait_all", side_effect=self._wait_all),
        )

    def plan(self, *, failing: int = 0, lingering: int = 0) -> None:
        """The next room's writes: how many fail, how many are still writing after the worker's wait."""
        self.failing, self.lingering, self.posted, self._stalled = failing, lingering, [], 0

    def _once(self, name: str) -> None:
        hook = getattr(self, name)
        if hook is not None:
            setattr(self, name, None)
            hook()

    def _batch_write(self, src: Any, src_offsets: Any, dst: Any, dst_offsets: Any, sizes: Any, uids: list[int]) -> Any:
        statuses = []
        for _ in uids:
            status = WriteStatus(index=len(self.posted))
            self.posted.append(status)
            statuses.append(self._status(status))
        self._once("on_post")
        return statuses

    def _shape(self) -> None:
        """Which of the room's posted writes fail and which linger (known once all are posted)."""
        for status in self.posted:
            status.fails = status.index < self.failing
            status.lingers = status.index >= len(self.posted) - self.lingering

    def _wait_all(self, statuses: list[Any], timeout_ms: int = 0) -> StatusCode:
        self._shape()
        self._once("on_wait")
        for status in self.posted:
            if not status.lingers and status.state is StatusCode.IN_PROGRESS:
                status.settle()
        states = {s.state for s in self.posted}
        if StatusCode.FAILED in states:
            return StatusCode.FAILED
        if StatusCode.IN_PROGRESS in states:
            self._stalled += 1
            if self._stalled >= POLLS_WITHOUT_PROGRESS:
                raise _Unsettled("wait_all: the scenario never settles the writes the worker waits for")
            return StatusCode.IN_PROGRESS
        return StatusCode.SUCCESS

    def _wait(self, status: WriteStatus) -> None:
        self._shape()
        if status.state is StatusCode.IN_PROGRESS:
            self._once("on_drain")
            status.settle()

    def _status(self, status: WriteStatus) -> Any:
        return self.kit.fake(
            "mori TransferStatus",
            InProgress=lambda: status.state is StatusCode.IN_PROGRESS,
            Failed=lambda: status.state is StatusCode.FAILED,
            Message=lambda: f"probe: write {status.index} failed on the RDMA queue pair",
            Wait=lambda: self._wait(status),
        )


@dataclass
class MoriRank:
    """The Mori prefill rank of one probe, its room's decode peer, and what it sent there."""

    kit: Kit
    transport: Transport
    wire: Wire
    mgr: Any  # MoriKVManager (prefill mode)
    engine: Engine
    room: int = 0

    @property
    def decode_endpoint(self) -> str:
        return tcp_endpoint(DECODE_IP, DECODE_PORT)

    # --- decode's messages --------------------------------------------------------------
    def deliver(self, *messages: list[bytes]) -> None:
        """Decode's messages, handled by the real bootstrap thread in this thread."""
        self.transport.deliver(*messages, loop="bootstrap_worker")
        if self.kit.raised:
            raise ProbeFailure("; ".join(self.kit.raised))

    def abort(self) -> None:
        """Decode's ABORT for the room, with its return address and abort generation (0.5.22 wire form)."""
        from sglang.srt.disaggregation.common.conn import AbortNotification

        notification = AbortNotification(
            room=self.room, decode_ip=DECODE_IP, decode_port=DECODE_PORT, generation=next(_generations)
        )
        self.deliver(notification.to_zmq())

    def open_room(self, room: int | None = None) -> None:
        """A new request takes the room: Bootstrapping (its sender), then decode's metadata (WaitingForInput).

        The metadata arrives as decode's receiver sends it (``MORI_GUARD``, room, return
        address, engine key, destination pages, aux slot, no state, one decode peer) and the
        bootstrap thread's own handler files it.
        """
        import numpy as np
        from sglang.srt.disaggregation.base.conn import KVPoll
        from sglang.srt.disaggregation.mori.conn import MORI_GUARD

        self.room = self.room if room is None else room
        self.mgr.update_status(self.room, KVPoll.Bootstrapping)
        pages = np.array([10, 11, 12, 13], dtype=np.int32).tobytes()
        frames = [MORI_GUARD, str(self.room), DECODE_IP, str(DECODE_PORT), DECODE_ENGINE]
        self.deliver([f if isinstance(f, bytes) else f.encode("ascii") for f in frames] + [pages, b"0", b"", b"1", b""])
        if self.mgr.check_status(self.room) != KVPoll.WaitingForInput:
            raise ProbeFailure(f"room {self.room} is not waiting for input after decode's metadata")

    # --- the send -------------------------------------------------------------------------
    def send(self, *, failing: int = 0, lingering: int = 0, **hooks: Callable[[], None]) -> None:
        """The room's last chunk, queued as the sender queues it and sent by the shard worker and drainer.

        ``failing`` / ``lingering``: see :class:`Engine`; ``hooks``: ``on_post``, ``on_wait``,
        ``on_drain``.
        """
        import numpy as np
        from sglang.srt.disaggregation.mori import conn

        self.engine.plan(failing=failing, lingering=lingering)
        for name, hook in hooks.items():
            setattr(self.engine, name, hook)
        self.mgr.add_transfer_request(
            bootstrap_room=self.room,
            kv_indices=np.array([3, 4], dtype=np.int32),
            index_slice=slice(0, 2),
            is_last_chunk=True,
            aux_index=0,
        )
        with swapped(conn, "StatusCode", StatusCode):
            self._run_workers()
            self._run_drainer()
        if self.kit.raised:
            raise ProbeFailure("; ".join(self.kit.raised))

    def _threads(self, fragment: str) -> list[RecordedThread]:
        found = [t for t in self.transport.threads.named(fragment) if t.started]
        if not found:
            raise ProbeFailure(f"the manager started no {fragment} thread: {self.transport.threads.recorded}")
        return found

    def _run_workers(self) -> None:
        """Every shard worker until its queue is empty, stopped with the build's own sentinel (``None``)."""
        for thread in self._threads("_transfer_worker"):
            thread.args[0].put(None)
            thread.run()

    def _run_drainer(self) -> None:
        """One drainer over what the shard workers handed it, then the build's sentinel (``None``)."""
        self.mgr._drain_queue.put_nowait(None)
        self._threads("_drain_worker")[0].run()

    def clear_sender(self) -> None:
        """The scheduler is done with the request: the real ``MoriKVSender.clear()`` forgets the room."""
        from sglang.srt.disaggregation.common.utils import TraceNullContext
        from sglang.srt.disaggregation.mori.conn import MoriKVSender

        strict_instance(
            self.kit,
            MoriKVSender,
            "kv_sender",
            kv_mgr=self.mgr,
            bootstrap_room=self.room,
            conclude_state=None,
            _owns_bootstrap_room=True,
            trace_ctx=TraceNullContext(),
        ).clear()

    # --- what decode received --------------------------------------------------------------
    def sent_so_far(self) -> int:
        return len(self.wire.sent)

    def acks(self, since: int = 0) -> int:
        """ABORT_ACKs for the room sent to decode (after the first ``since`` messages); a repeat counts once."""
        room = str(self.room).encode("ascii")
        return len(
            {
                tuple(f)
                for ep, f in self.wire.sent[since:]
                if ep == self.decode_endpoint and f[:1] == [b"ABORT_ACK"] and f[1:2] == [room]
            }
        )

    def statuses(self) -> list[int]:
        """Transfer statuses this rank reported to decode for the room, read with the build's own parser."""
        found = []
        for endpoint, frames in self.wire.sent:
            parsed = self.mgr.parse_kv_status_message(frames) if endpoint == self.decode_endpoint else None
            if parsed is not None and parsed[0] == self.room:
                found.append(int(parsed[1]))
        return found

    def decode_told_failed(self) -> bool:
        from sglang.srt.disaggregation.base.conn import KVPoll

        return int(KVPoll.Failed) in self.statuses()

    def writes(self) -> int:
        """RDMA writes posted for the room's last send."""
        return len(self.engine.posted)


def mori_gap() -> str | None:
    """Why this build has no Mori prefill rank that holds a drain ack, or None.

    A build without Mori, or one whose Mori KV manager cannot defer (up to 0.5.21: it
    acks no drain at all, so there is no ack for a failed write to withhold).
    """
    from harness.decode_kv import deferral_gap

    gap = deferral_gap(BACKEND)
    return None if gap is None else f"no Mori prefill rank that holds a drain ack: {gap}"


def decode_registration(kit: Kit, mgr: Any) -> Any:
    """What decode's ``_register_kv_args`` gives prefill: its engine, and one descriptor per buffer prefill has.

    One decode TP rank of the prefill's width, same layer layout; descriptors are fakes
    (the engine they would be read by is one).
    """
    from sglang.srt.disaggregation.mori.conn import KVArgsRegisterInfo

    def descs(kind: str, count: int) -> list[Any]:
        return [kit.fake(f"decode {kind} memory descriptor {i}") for i in range(count)]

    return KVArgsRegisterInfo(
        endpoint=DECODE_IP,
        dst_port=DECODE_PORT,
        engine_desc=kit.fake("decode engine descriptor", key=DECODE_ENGINE),
        dst_kv_mem_descs=descs("kv", len(mgr.kv_mem_descs)),
        dst_aux_mem_descs=descs("aux", len(mgr.kv_args.aux_data_ptrs)),
        dst_state_mem_descs=[],
        gpu_id=0,
        decode_tp_size=mgr.attn_tp_size,
        decode_tp_rank=0,
        dst_kv_item_len=mgr.kv_args.kv_item_lens[0],
        dst_state_item_lens=[],
        dst_state_dim_per_tensor=[],
    )


@contextlib.contextmanager
def _started(kit: Kit, transport: Transport) -> Iterator[Any]:
    """The prefill server the build's start-up builds on Mori, deferred release on through the build's switch."""
    from sglang.srt.environ import envs

    from harness.decode_kv import DEFERRED_SWITCH, SWITCH_NAME, _import_transport
    from harness.server import start

    _import_transport(BACKEND)
    switch = getattr(envs, DEFERRED_SWITCH)
    kit.forced_flag(SWITCH_NAME, True, switch.get(), "sglang/srt/environ.py", [DEFERRED_SWITCH])
    with switch.override(True), transport.contexts():
        yield start(kit, "prefill", backend=BACKEND)


def build_mori_rank(kit: Kit) -> MoriRank:
    """A Mori prefill rank, decode registered; its edges replaced (engine, sockets), its code the build's."""
    ensure_runtime()
    transport = Transport(kit, BACKEND, prefill_ranks=1)
    with _started(kit, transport) as side:
        mgr = side.scheduler.disagg_prefill_bootstrap_queue.kv_manager
    wire = Wire(kit)
    engine = Engine(kit)
    decode = tcp_endpoint(DECODE_IP, DECODE_PORT)
    edges = {
        "engine": engine.fake(),  # the RDMA engine
        # the wire to decode: status messages and acks (the cached socket), aux data (a context)
        "_socket_cache": wire.sockets(decode),
        "_monitor_cache": {},
        "_socket_send_locks": Wire.locks(decode),
        "_zmq_ctx": PushContext(kit, wire),
        # decode's registration, as its _register_kv_args would have delivered it
        "decode_kv_args_table": {DECODE_ENGINE: decode_registration(kit, mgr)},
    }
    for name, value in edges.items():
        setattr(mgr, name, value)
    return MoriRank(kit=kit, transport=transport, wire=wire, mgr=mgr, engine=engine)
