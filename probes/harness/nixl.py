"""One NIXL prefill rank: the real KV manager's transfer worker and bootstrap thread.

The KV manager is the one a prefill server the build's own ``run_scheduler_process``
starts on NIXL constructs (:func:`_wired_manager`: whatever class the build's
``get_kv_class`` resolves, its real ``__init__`` against the faked agent of
:mod:`harness.transport`), with one room whose KV goes to one decode agent. Its real
``transfer_worker`` runs in the calling thread over a queue of real ``TransferKVChunk``
objects; the bootstrap thread its constructor asked for (recorded, not started) runs in
the calling thread over decode's control messages (ABORT). Faked are only the GPU/RDMA and
network edges:

- posting the room's writes -- ``send_kvcache`` (KV pages) and ``send_aux`` (the
  metadata/aux slot) -- are recorders that hand back a transfer handle; what NIXL answers
  for each handle (``agent.check_xfer_state``: ``DONE``, ``ERR``, ``PROC`` for ever, or a
  state that cannot be read) is the scenario's choice (:class:`Write`); anything else
  raised inside is recorded by ``kit.guard`` before the worker can wrap it. With
  ``real_send_aux`` the build's own ``send_aux`` posts the aux write instead, through the
  agent's ``get_xfer_descs`` / ``initialize_xfer`` / ``transfer``, and NIXL may refuse
  the post (:data:`REJECTED`: ``transfer`` answers ``ERR``);
- the agent's peer-metadata check (``check_remote_metadata``, asked after a failed batch
  from 0.5.22): the decode peer's metadata is still loaded;
- the zmq sockets: the control socket the bootstrap thread reads (the transport's
  :class:`harness.transport.ControlSocket`) and the PUSH socket to decode
  (:class:`harness.wire.Wire`) that carries the status messages and every ``ABORT_ACK``;
- decode's registration (``decode_kv_args_table``), as decode's registration message delivers it.

Every exception the worker caught and logged (a transport error at WARNING; anything else is
logged at ERROR, which the kit refuses) must be one the scenario staged or one SGLang raised
itself about the staged states; anything else is a probe error, never behaviour (the worker
poisons a room on any exception whose handles did not settle, from 0.5.22).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from difflab.probe.kit import EndOfScenario, Kit, ProbeFailure, Recorder
from harness.decode_kv import WarningLog
from harness.doors import backend_gap
from harness.features import Machinery
from harness.runtime import ensure_runtime
from harness.strict import strict_instance
from harness.transport import EndOfMessages, Transport
from harness.wire import Wire, tcp_endpoint

DECODE_IP = "192.0.2.20"
DECODE_PORT = 17020
DECODE_AGENT = "decode-agent-0"

UNREADABLE = "unreadable"
"""A handle whose state NIXL cannot report (``check_xfer_state`` raises)."""

REJECTED = "rejected"
"""A write NIXL refuses to post (``agent.transfer`` answers ``ERR``); only the build's own ``send_aux`` asks."""

_CAUGHT = re.compile(r"NIXL transport error for room (\d+): (.*)", re.S)
"""The worker's log line for an exception it caught (every release)."""

SGLANG_RAISES = ("NIXL transfer for room", "NIXL transfer encountered ERR", "KVSender failed to post")
"""How SGLang's own raises about the staged states begin (a timed-out settle, an ERR, a refused post)."""

_generations = itertools.count(1)


class _EndOfQueue(EndOfScenario):
    """Raised by the fake transfer queue once drained: ends the worker loop on every release."""


@dataclass
class Write:
    """One posted write of the room: what NIXL answers for its handle, and what happens while it is posted."""

    state: str = "DONE"
    """``DONE``, ``ERR``, ``PROC`` (still writing, for ever), :data:`UNREADABLE` or :data:`REJECTED`."""
    during: Callable[[], None] | None = None
    """Runs while the write is being posted (decode's ABORT arriving mid-write)."""


@dataclass
class NixlPrefillRank:
    """The NIXL prefill rank of one scenario, with what it sent to decode."""

    kit: Kit
    wire: Wire
    transport: Transport
    mgr: Any  # NixlKVManager (prefill mode)
    room: int
    send_kvcache: Recorder
    send_aux: Recorder
    """The faked ``send_aux``, or with ``real_send_aux`` the agent's ``transfer`` (each post the build asked for)."""
    kv_write: Write = field(default_factory=Write)
    aux_write: Write = field(default_factory=Write)
    handles: dict[str, str] = field(default_factory=dict)
    """Posted handle -> the state NIXL reports for it."""

    @property
    def decode_endpoint(self) -> str:
        return tcp_endpoint(DECODE_IP, DECODE_PORT)

    def acks(self, since: int = 0) -> int:
        """ABORT_ACKs sent to decode (after the first ``since`` messages); a byte-identical repeat counts once."""
        return self.wire.count_distinct(b"ABORT_ACK", self.decode_endpoint, since)

    def abort(self) -> None:
        """Decode's ABORT for the room reaches the rank (its bootstrap thread reads it)."""
        self.deliver(abort_from_decode(self.room))

    def sent_so_far(self) -> int:
        return len(self.wire.sent)

    def deliver(self, *messages: list[bytes]) -> None:
        """Decode's control messages, handled by the build's own bootstrap thread body, run here."""
        loops = self.transport.threads.named("bootstrap_thread")
        if not loops:
            raise ProbeFailure(f"no bootstrap thread was started: {[t.label for t in self.transport.threads.recorded]}")
        self.transport.control.pending.extend(messages)
        with contextlib.suppress(EndOfMessages):
            loops[-1].run()
        if self.transport.control.pending:
            raise ProbeFailure("the bootstrap thread stopped before handling every message")

    def run_worker(self, *chunks: Any) -> None:
        """Run the real transfer worker over ``chunks`` in this thread until the queue is drained."""
        pending = list(chunks)

        def get(*args: Any, **kwargs: Any) -> Any:
            if pending:
                return pending.pop(0)
            raise _EndOfQueue()

        caught = WarningLog()
        logger = logging.getLogger(type(self.mgr).transfer_worker.__module__)
        logger.addHandler(caught)
        try:
            with contextlib.suppress(_EndOfQueue):
                self.mgr.transfer_worker(self.kit.fake("transfer queue", get=get))
        finally:
            logger.removeHandler(caught)
        self._check_caught(caught.messages)

    def _check_caught(self, messages: list[str]) -> None:
        """Every error the worker caught and logged as a transport error was staged, or is SGLang's own raise.

        The worker logs each exception it catches -- a transport error at WARNING, anything else
        at ERROR (which the kit refuses) -- before it fails or poisons the room; 0.5.19 - 0.5.22 also
        keep them in ``exceptions``, 0.5.23 no longer does, so the log is what every release shares.
        """
        for message in messages:
            caught = _CAUGHT.fullmatch(message)
            if caught is None:
                continue
            room, text = caught.groups()
            staged = text in self.kit.intended_messages
            if not (staged or text.startswith(SGLANG_RAISES)):
                raise ProbeFailure(f"the transfer worker caught an unstaged error for room {room}: {text}")
            self.kit.event("worker-caught", room=int(room), error=text, staged=staged)

    def write_room(self, *during: Callable[[], None]) -> dict[str, int]:
        """The room's last chunk through the real worker, every write succeeding; ``during`` runs mid-KV-write.

        Returns ``writes`` (KV writes posted) and, where ``during`` ran, ``acks_while_writing``:
        drain acks sent before the write settled -- one then would tell decode to reuse pages
        still being written.
        """
        seen: dict[str, int] = {}

        def steps() -> None:
            for step in during:
                step()
            seen["acks_while_writing"] = self.acks()

        self.kv_write = Write("DONE", during=steps if during else None)
        self.run_worker(self.chunk(last=True))
        if self.send_kvcache.count == 0:
            raise ProbeFailure("the worker never posted the room's KV write: nothing was being written")
        return {**seen, "writes": self.send_kvcache.count}

    def chunk(self, *, last: bool, room: int | None = None) -> Any:
        """A real TransferKVChunk of this room (or ``room``): two pages of KV; the last one carries the aux index."""
        import numpy as np
        from sglang.srt.disaggregation.common.utils import TransferKVChunk

        return TransferKVChunk(
            room=self.room if room is None else room,
            prefill_kv_indices=np.array([3, 4], dtype=np.int32),
            index_slice=slice(0, 2),
            is_last_chunk=last,
            prefill_aux_index=0 if last else None,
            state_indices=None,
        )

    def sender(self) -> Any:
        """The real ``NixlKVSender`` of this room, as ``req.disagg_kv_sender`` holds it."""
        from sglang.srt.disaggregation.nixl.conn import NixlKVSender

        return strict_instance(
            self.kit, NixlKVSender, "kv_sender", kv_mgr=self.mgr, bootstrap_room=self.room, _owns_bootstrap_room=True
        )

    def clear_sender(self) -> None:
        """The scheduler is done with the request: the real sender's ``clear()`` forgets the room."""
        self.sender().clear()

    def open_room(self, room: int | None = None) -> None:
        """A new request takes the room: Bootstrapping (sender created), then WaitingForInput (decode's indices in)."""
        import numpy as np
        from sglang.srt.disaggregation.base.conn import KVPoll
        from sglang.srt.disaggregation.nixl.conn import TransferInfo

        room = self.room if room is None else room
        self.mgr.update_status(room, KVPoll.Bootstrapping)
        self.mgr.transfer_infos[room] = {
            DECODE_AGENT: TransferInfo(
                room=room,
                endpoint=DECODE_IP,
                dst_port=DECODE_PORT,
                agent_name=DECODE_AGENT,
                dst_kv_indices=np.array([10, 11, 12, 13], dtype=np.int32),
                dst_aux_index=0,
                required_dst_info_num=1,
                dst_state_indices=[],
            )
        }
        self.mgr.update_status(room, KVPoll.WaitingForInput)

    # --- the agent and the posting of writes -------------------------------------------------
    def _post(self, kind: str, write: Write) -> str:
        handle = f"{kind}-{len(self.handles)}"
        self.handles[handle] = write.state
        if write.during is not None:
            write.during()
        return handle

    def check_xfer_state(self, handle: str) -> str:
        state = self.handles[handle]
        if state == UNREADABLE:
            raise self.kit.intended_failure("NIXL cannot report the state of a posted write")(handle)
        return "ERR" if state == REJECTED else state

    def transfer(self, handle: str) -> str:
        """NIXL's answer to posting a write the build's own ``send_aux`` prepared."""
        return "ERR" if self.handles[handle] == REJECTED else "PROC"


# --- version adaptation: decode's ABORT on the wire -------------------------------
def abort_from_decode(room: int) -> list[bytes]:
    """Decode's ABORT for ``room`` as this release's decode puts it on the wire.

    0.5.22: ``AbortNotification`` with the decode rank's abort generation, which its drain
    ack must echo. <= 0.5.21: four frames (room, decode ip, decode port).
    """
    from sglang.srt.disaggregation.common import conn

    if hasattr(conn, "AbortNotification"):  # 0.5.22
        return conn.AbortNotification(
            room=room, decode_ip=DECODE_IP, decode_port=DECODE_PORT, generation=next(_generations)
        ).to_zmq()
    return [b"ABORT", str(room).encode("ascii"), DECODE_IP.encode("ascii"), str(DECODE_PORT).encode("ascii")]


def decode_registration() -> Any:
    """What the decode agent registers with prefill: its agent, its buffers, one TP rank like prefill's."""
    from sglang.srt.disaggregation.nixl.conn import KVArgsRegisterInfo

    return KVArgsRegisterInfo(
        room="None",
        endpoint=DECODE_IP,
        dst_port=DECODE_PORT,
        agent_name=DECODE_AGENT,
        agent_metadata=b"decode-agent-metadata",
        dst_kv_ptrs=[0x30000, 0x40000],
        dst_kv_mem_kinds=["VRAM", "VRAM"],
        dst_aux_ptrs=[0x50000],
        dst_state_data_ptrs=[],
        gpu_id=0,
        decode_tp_size=1,
        decode_tp_rank=0,
        dst_kv_item_len=256,
        dst_kv_item_lens=[256, 256],
        dst_homogeneous_mem_kind="VRAM",
    )


def _wired_manager(kit: Kit) -> tuple[Any, Transport]:
    """The KV manager of a prefill server the build's own start-up builds on NIXL (fresh per call).

    As :func:`harness.mooncake._wired_manager`, with ``--disaggregation-transfer-backend nixl``:
    deferred release switched on through the build's own environment switch (reported with
    its default); the agent, the bound control socket, the bootstrap server's HTTP API and the
    threads it starts faked (:mod:`harness.transport`). The transport is returned for the
    threads it recorded (the bootstrap thread a scenario runs) and its control socket.
    """
    from sglang.srt.environ import envs

    from harness.decode_kv import DEFERRED_SWITCH, SWITCH_NAME, _import_transport
    from harness.server import start

    _import_transport("nixl")
    switch = getattr(envs, DEFERRED_SWITCH)
    kit.forced_flag(SWITCH_NAME, True, switch.get(), "sglang/srt/environ.py", [DEFERRED_SWITCH])
    transport = Transport(kit, "nixl", prefill_ranks=1)
    with switch.override(True), transport.contexts():
        side = start(kit, "prefill", backend="nixl")
    return side.scheduler.disagg_prefill_bootstrap_queue.kv_manager, transport


def build_prefill_rank(kit: Kit, *, room: int, real_send_aux: bool = False) -> NixlPrefillRank:
    """A NIXL prefill rank whose room is waiting for input, decode registered and deferred release on.

    The manager is the wired prefill server's (:func:`_wired_manager`); the probe replaces
    only its edges: posting the writes and the agent's answers about them, the sockets to
    decode, decode's registration. With ``real_send_aux`` the build's own ``send_aux``
    stays and only the agent under it answers.
    """
    ensure_runtime()
    wire = Wire(kit)
    decode = tcp_endpoint(DECODE_IP, DECODE_PORT)
    holder: list[NixlPrefillRank] = []
    send = kit.recorder("send_kvcache", side_effect=lambda *a, **k: holder[0]._post("kv", holder[0].kv_write))
    aux_post = kit.recorder("send_aux", side_effect=lambda *a, **k: holder[0]._post("aux", holder[0].aux_write))
    initialize = kit.recorder(
        "agent.initialize_xfer", side_effect=lambda *a, **k: holder[0]._post("aux", holder[0].aux_write)
    )
    transfer = kit.recorder("agent.transfer", side_effect=lambda handle: holder[0].transfer(handle))
    mgr, transport = _wired_manager(kit)
    agent = kit.fake(
        "nixl agent",
        check_xfer_state=lambda handle: holder[0].check_xfer_state(handle),
        check_remote_metadata=kit.recorder("agent.check_remote_metadata", returns=True),
        get_xfer_descs=lambda addrs, mem_kind: ("descs", mem_kind, len(addrs)),
        initialize_xfer=initialize,
        transfer=transfer,
    )
    edges = {
        "agent": agent,
        "decode_kv_args_table": {DECODE_AGENT: decode_registration()},
        "_socket_cache": wire.sockets(decode),
        "_monitor_cache": {},
        "_socket_send_locks": Wire.locks(decode),
        "_zmq_ctx": kit.fake("prefill zmq.Context"),
        "send_kvcache": send,
    }
    if not real_send_aux:
        edges["send_aux"] = aux_post
    for name, value in edges.items():
        setattr(mgr, name, value)
    rank = NixlPrefillRank(
        kit=kit,
        wire=wire,
        transport=transport,
        mgr=mgr,
        room=room,
        send_kvcache=send,
        send_aux=transfer if real_send_aux else aux_post,
    )
    holder.append(rank)
    rank.open_room()
    return rank


@contextlib.contextmanager
def settle_deadline(kit: Kit, seconds: float) -> Iterator[None]:
    """NIXL's wait for a failed batch's other handles to settle, shortened to ``seconds`` (forced, reported).

    ``NIXL_ERR_SETTLE_TIMEOUT_S`` (5 s from 0.5.20) bounds how long the worker waits, once a
    handle reported ERR, for its siblings still writing; past it the room is left unsettled.
    Only the wait's length changes, not which branch the worker takes. 0.5.19 has no such
    wait (the worker raises at the first ERR), so nothing is forced there.
    """
    from sglang.srt.disaggregation.nixl import conn

    from harness.runtime import swapped

    name = "NIXL_ERR_SETTLE_TIMEOUT_S"
    if not hasattr(conn, name):
        yield
        return
    kit.forced_flag(f"nixl.{name}", seconds, getattr(conn, name), "sglang/srt/disaggregation/nixl/conn.py", [])
    with swapped(conn, name, seconds):
        yield


# --- what every NIXL prefill probe shares -----------------------------------------------------
BACKEND = "nixl"

DRAIN_ACK = Machinery(
    "NIXL drain-acknowledged abort (deferred KV release)",
    "sglang.srt.disaggregation.nixl.conn",
    "NixlKVManager._handle_abort_notification",
)
"""The machinery the NIXL prefill probes judge: <= 0.5.18 has no drain ack at all."""


def observe_scenarios(
    kit: Kit, scenarios: tuple[Callable[[Kit], dict[str, Any]], ...], *, prefixed: bool = True
) -> dict[str, Any]:
    """Each scenario on a NIXL prefill rank of its own, its fields ``nixl:<scenario>.<field>``.

    ``prefixed=False``: the scenarios name their fields themselves. A build without NIXL (or
    without the drain ack) is not applicable, named.
    """
    DRAIN_ACK.require(kit)
    gap = backend_gap(BACKEND)
    if gap is not None:
        return kit.backend_not_applicable(BACKEND, gap)
    fields: dict[str, Any] = {}
    for scenario in scenarios:
        seen = scenario(kit)
        fields.update({f"{scenario.__name__}.{k}": v for k, v in seen.items()} if prefixed else seen)
    return kit.on_backend(BACKEND, fields)
