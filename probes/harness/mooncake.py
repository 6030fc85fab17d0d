"""One Mooncake prefill rank: the real KV manager's transfer worker and bootstrap thread.

The KV manager is the one a prefill server the build's own ``run_scheduler_process``
starts on Mooncake constructs (:func:`_wired_manager`: whatever class the build's
``get_kv_class`` resolves, its real ``__init__``), with one room whose KV goes to one
decode rank. Its real ``transfer_worker`` runs in the calling thread over a
queue of real ``TransferKVChunk`` objects; its real ``start_prefill_thread``
runs the bootstrap thread over decode's control messages (ABORT). Faked are
only the GPU/RDMA and network edges:

- the room's three RDMA writes -- ``send_kvcache`` (KV pages),
  ``maybe_send_extra`` (state buffers of hybrid/Mamba models) and ``send_aux``
  (the metadata/aux slot) -- are recorders whose return code the scenario
  chooses (0 = written); anything raised inside is recorded by ``kit.guard``
  before the worker can wrap it in a RuntimeError;
- the zmq sockets: decode's control socket the bootstrap thread reads from,
  and the PUSH socket to decode (:class:`harness.wire.Wire`) that carries the
  status messages and every ``ABORT_ACK``;
- decode's registration (``decode_kv_args_table``), as decode's ``send_kv_args`` delivers it;
- while the server starts: the transfer engine, the bootstrap server's HTTP API and the
  threads it starts (:mod:`harness.transport`).

Loops are ended the way no ``except Exception`` can intercept: the queue and
the control socket raise private ``BaseException`` subclasses once drained.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from difflab.probe.kit import EndOfScenario, Kit, ProbeFailure, Recorder
from harness.runtime import ensure_runtime
from harness.strict import strict_instance
from harness.wire import Wire, tcp_endpoint

DECODE_IP = "192.0.2.20"
DECODE_PORT = 17020
DECODE_SESSION = "decode-session-0"
PREFILL_PORT = 8998
THREAD_WAIT_S = 10.0


class _EndOfQueue(EndOfScenario):
    """Raised by the fake transfer queue once drained: ends the worker loop on every release."""


class _EndOfMessages(SystemExit):
    """Raised by the fake control socket once drained: ends the bootstrap thread quietly.

    A ``SystemExit`` subclass, because ``threading`` ignores ``SystemExit`` in
    a thread and the <= 0.5.20 loop never checks a stop flag.
    """

    ends_scenario = True


@dataclass
class PrefillRank:
    """The prefill rank of one scenario, with what it sent to decode."""

    kit: Kit
    wire: Wire
    mgr: Any  # MooncakeKVManager (prefill mode)
    room: int
    send_kvcache: Recorder
    send_state: Recorder
    send_aux: Recorder
    send_result: Callable[[], int] = lambda: 0
    """What the next KV write does (the scenario may deliver an ABORT meanwhile); 0 = success."""
    state_result: Callable[[], int] = lambda: 0
    """What the next state-buffer write does; 0 = success."""
    aux_result: Callable[[], int] = lambda: 0
    """What the next aux (metadata slot) write does; 0 = success."""
    thread_errors: list[str] = field(default_factory=list)

    @property
    def decode_endpoint(self) -> str:
        return tcp_endpoint(DECODE_IP, DECODE_PORT)

    def acks(self, since: int = 0) -> int:
        """ABORT_ACKs sent to decode (after the first ``since`` messages); a byte-identical repeat counts once.

        Decode keeps drain acks in a per-rank set, so a repeated ack changes nothing: the
        effect (decode learns the room drained) is what is counted, not the frames.
        """
        return self.wire.count_distinct(b"ABORT_ACK", self.decode_endpoint, since)

    def sent_so_far(self) -> int:
        """How many messages this rank has sent: the start of a window for :meth:`acks`."""
        return len(self.wire.sent)

    def deliver(self, *messages: list[bytes]) -> None:
        """Decode's control messages, handled by the real bootstrap thread; returns once all are handled."""
        pending = list(messages)
        drained = threading.Event()

        def recv_multipart(*args: Any, **kwargs: Any) -> list[bytes]:
            if pending:
                return pending.pop(0)
            drained.set()
            raise _EndOfMessages()

        self.mgr.server_socket = self.kit.fake("decode control socket", recv_multipart=recv_multipart)
        previous_hook = threading.excepthook

        def record(args: threading.ExceptHookArgs) -> None:
            if not isinstance(args.exc_value, SystemExit):
                self.thread_errors.append(f"bootstrap thread: {args.exc_type.__name__}: {args.exc_value}")

        threading.excepthook = record
        try:
            self.mgr.start_prefill_thread()
            if not drained.wait(THREAD_WAIT_S):
                raise ProbeFailure(f"bootstrap thread stopped before handling all messages: {self.thread_errors}")
        finally:
            threading.excepthook = previous_hook
        if self.thread_errors:
            raise ProbeFailure("; ".join(self.thread_errors))

    def run_worker(self, *chunks: Any) -> None:
        """Run the real transfer worker over ``chunks`` in this thread until the queue is drained."""
        pending = list(chunks)

        def get(*args: Any, **kwargs: Any) -> Any:
            if pending:
                return pending.pop(0)
            raise _EndOfQueue()

        queue = self.kit.fake("transfer queue", get=get)
        # send_kvcache is faked, so the worker never hands the executor anything.
        executor = self.kit.fake("transfer executor")
        with contextlib.suppress(_EndOfQueue):
            self.mgr.transfer_worker(queue, executor)

    def chunk(self, *, last: bool, state: bool = False, room: int | None = None) -> Any:
        """A real TransferKVChunk of this room (or ``room``): two pages of KV, plus a state slot if ``state``.

        The last chunk carries the aux index; ``state`` gives it one state-buffer
        index, as a hybrid (Mamba/SWA) model's last chunk does.
        """
        import numpy as np
        from sglang.srt.disaggregation.common.utils import TransferKVChunk

        return TransferKVChunk(
            room=self.room if room is None else room,
            prefill_kv_indices=np.array([3, 4], dtype=np.int32),
            index_slice=slice(0, 2),
            is_last_chunk=last,
            prefill_aux_index=0 if last else None,
            state_indices=[7] if state else None,
        )

    def session_alive(self) -> bool:
        """Does this rank still send to decode's Mooncake session? A new room's first chunk is written or refused.

        The worker refuses every transfer to a session it marked failed ("decode
        instance could be dead"), so this observes the session blacklist through
        behaviour: whether the next room's KV write is attempted.
        """
        other = self.room + 100_000
        self.open_room(other)
        before = self.send_kvcache.count
        saved, self.send_result = self.send_result, lambda: 0
        try:
            self.run_worker(self.chunk(last=False, room=other))
        finally:
            self.send_result = saved
        return self.send_kvcache.count > before

    def sender(self, room: int | None = None) -> Any:
        """The real ``MooncakeKVSender`` of this room (or ``room``), as ``req.disagg_kv_sender`` holds it."""
        from sglang.srt.disaggregation.common.utils import TraceNullContext
        from sglang.srt.disaggregation.mooncake.conn import MooncakeKVSender

        return strict_instance(
            self.kit,
            MooncakeKVSender,
            "kv_sender",
            kv_mgr=self.mgr,
            bootstrap_room=self.room if room is None else room,
            conclude_state=None,
            _owns_bootstrap_room=True,
            trace_ctx=TraceNullContext(),
        )

    def clear_sender(self) -> None:
        """The scheduler is done with the request: the real sender's ``clear()`` forgets the room."""
        self.sender().clear()

    def open_room(self, room: int | None = None, session: str = DECODE_SESSION) -> None:
        """A new request takes the room: Bootstrapping (sender created), then WaitingForInput (metadata in).

        ``session`` is the decode rank's Mooncake session the room's KV goes to (registered
        with :meth:`register_decode_session`; the default one is registered at build time).
        """
        import numpy as np
        from sglang.srt.disaggregation.base.conn import KVPoll
        from sglang.srt.disaggregation.mooncake.conn import TransferInfo

        room = self.room if room is None else room
        self.mgr.update_status(room, KVPoll.Bootstrapping)
        self.mgr.transfer_infos[room] = {
            session: TransferInfo(
                room=room,
                endpoint=DECODE_IP,
                dst_port=DECODE_PORT,
                mooncake_session_id=session,
                dst_kv_indices=np.array([10, 11, 12, 13], dtype=np.int32),
                dst_aux_index=0,
                dst_state_indices=[],
                required_dst_info_num=1,
                is_dummy=False,
            )
        }
        self.mgr.update_status(room, KVPoll.WaitingForInput)

    def register_decode_session(self, session: str) -> None:
        """Another decode rank registers its buffers (as its ``send_kv_args`` would): a session of its own."""
        self.mgr.decode_kv_args_table[session] = decode_registration(session)


def mooncake_gap() -> str | None:
    """Why this build has no Mooncake back end to drive, or None (it is the server's default)."""
    from sglang.srt.server_args import DISAGG_TRANSFER_BACKEND_CHOICES

    if "mooncake" not in DISAGG_TRANSFER_BACKEND_CHOICES:
        return "this build ships no mooncake transfer back end"
    return None


def decode_registration(session: str) -> Any:
    """What a decode rank registers with prefill: its Mooncake session and where its buffers are."""
    from sglang.srt.disaggregation.mooncake.conn import KVArgsRegisterInfo

    return KVArgsRegisterInfo(
        room="None",
        endpoint=DECODE_IP,
        dst_port=DECODE_PORT,
        mooncake_session_id=session,
        dst_kv_ptrs=[0x30000, 0x40000],
        dst_aux_ptrs=[0x50000],
        dst_state_data_ptrs=[],
        dst_tp_rank=0,
        dst_attn_tp_size=1,
        dst_kv_item_len=256,
        dst_state_item_lens=[],
        dst_state_dim_per_tensor=[],
        dst_kv_layer_ids=[0],
        dst_state_layer_ids=[],
    )


def _wired_manager(kit: Kit) -> Any:
    """The KV manager of a prefill server the build's own start-up builds on Mooncake (fresh per call).

    ``run_scheduler_process`` starts a prefill side with ``--disaggregation-transfer-backend
    mooncake`` (:mod:`harness.server`); its bootstrap queue's manager is the one the build's
    ``init_disaggregation`` constructs, deferred release switched on through the build's own
    environment switch (reported with its default). Faked while it starts
    (:mod:`harness.transport`): the transfer engine, the bound control socket, the bootstrap
    server's HTTP API, and the threads it starts (its bootstrap thread and transfer workers
    are recorded, not run: a scenario runs them in its own order).
    """
    from sglang.srt.environ import envs

    from harness.decode_kv import DEFERRED_SWITCH, SWITCH_NAME, _import_transport
    from harness.server import start
    from harness.transport import Transport

    _import_transport("mooncake")
    switch = getattr(envs, DEFERRED_SWITCH)
    kit.forced_flag(SWITCH_NAME, True, switch.get(), "sglang/srt/environ.py", [DEFERRED_SWITCH])
    transport = Transport(kit, "mooncake", prefill_ranks=1)
    with switch.override(True), transport.contexts():
        side = start(kit, "prefill", backend="mooncake")
    return side.scheduler.disagg_prefill_bootstrap_queue.kv_manager


def build_prefill_rank(kit: Kit, *, room: int) -> PrefillRank:
    """A prefill rank whose room is waiting for input, decode registered and deferred release on.

    The manager is the wired prefill server's (:func:`_wired_manager`); the probe replaces
    only its edges: the three RDMA writes, the sockets to decode, decode's registration.
    """
    ensure_runtime()
    wire = Wire(kit)
    decode = tcp_endpoint(DECODE_IP, DECODE_PORT)
    holder: list[PrefillRank] = []
    send = kit.recorder("send_kvcache", side_effect=lambda *args, **kwargs: holder[0].send_result())
    send_state = kit.recorder("maybe_send_extra", side_effect=lambda *args, **kwargs: holder[0].state_result())
    send_aux = kit.recorder("send_aux", side_effect=lambda *args, **kwargs: holder[0].aux_result())
    mgr = _wired_manager(kit)
    edges = {
        # decode's registration, as its send_kv_args would have delivered it
        "decode_kv_args_table": {DECODE_SESSION: decode_registration(DECODE_SESSION)},
        # the wire to decode
        "_socket_cache": wire.sockets(decode),
        "_monitor_cache": {},
        "_socket_send_locks": Wire.locks(decode),
        "_zmq_ctx": kit.fake("prefill zmq.Context"),
        # the RDMA writes (GPU memory)
        "send_kvcache": send,
        "maybe_send_extra": send_state,
        "send_aux": send_aux,
    }
    for name, value in edges.items():
        setattr(mgr, name, value)
    rank = PrefillRank(
        kit=kit, wire=wire, mgr=mgr, room=room, send_kvcache=send, send_state=send_state, send_aux=send_aux
    )
    holder.append(rank)
    rank.open_room()
    return rank
