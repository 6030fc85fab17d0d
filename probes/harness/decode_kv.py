"""The decode side of a PD pair on a chosen transport back end, as the build's own server wires it.

:func:`decode_side` starts a decode server with the build's ``run_scheduler_process``
(:mod:`harness.server`), the back end chosen through ``ServerArgs.disaggregation_transfer_backend``
as a launch flag chooses it (``mooncake`` by default, ``nixl``, ``mori``). The scheduler, its
``DecodePreallocQueue`` / ``DecodeTransferQueue`` and the back end's KV manager are what the
build's ``init_disaggregation`` constructs -- whatever class the build resolves at call time
(a subclass, a class-order override, a start-up or plugin patch). Each request enters through
the scheduler's ``_add_request_to_queue``; the build's prealloc queue creates its receiver
(the build's ``get_kv_class``), bootstraps it against the prefill server and preallocates its
pages in the scheduler's own event-loop step (``process_decode_queue``), which also polls the
transfer queue and resolves held releases. A client abort goes through the built scheduler's
``abort_request``.

Faked: the transfer edge (:mod:`harness.transport`: engine, sockets, bootstrap HTTP, threads)
and GPU memory (``release_kv_cache``, swapped in every module of the build that imported it,
as SGLang's tests patch it at its import site; it returns the request's row and pages).
Values the outcome depends on come from the build: deferred release is switched on through
the build's own environment switch (reported with its default); the release timeout is the
transfer queue's own unless a scenario forces one, reported beside the verdict with the
value the build's constructor set.

A bench that keeps a side across its timed runs leaves the block once the side is built
and holds the faked edges again around each run (:meth:`DecodeSide.edges`), so sides of
several loads never share a transport.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from difflab.probe.kit import Kit, ProbeFailure, Recorder
from harness.clock import LabClock
from harness.requests import new_req
from harness.runtime import swapped_at_import_sites
from harness.transport import Transport
from harness.wire import tcp_endpoint

PREFILL_IP = "192.0.2.10"
PREFILL_BASE_PORT = 17100


def prefill_endpoint(rank: int) -> str:
    return tcp_endpoint(PREFILL_IP, PREFILL_BASE_PORT + rank)


class WarningLog(logging.Handler):
    """Collects WARNING records of one logger (the kit only collects ERRORs)."""

    def __init__(self) -> None:
        super().__init__(level=logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


# --- the decode server as the build's start-up wires it ---------------------------------------------
DEFERRED_SWITCH = "SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE"
"""Deferred release is switched on as an operator does (False by default up to 0.5.20, True from 0.5.21)."""
SWITCH_NAME = "environ.enable_deferred_decode_kv_release"
"""How the forced switch is reported (the note reads "deferred decode KV release is ... by default")."""


@dataclass
class DecodeSide:
    """One decode server on one transport back end, built by the build's own ``run_scheduler_process``.

    The scheduler, its prealloc and transfer queues and the back end's KV manager are the ones the
    build's ``init_disaggregation`` constructs (:mod:`harness.server`); each request gets the receiver
    the build's prealloc queue creates for it, bootstrapped and preallocated by the scheduler's own
    event-loop step. Only the transfer edge is faked (:mod:`harness.transport`), plus GPU memory
    (``release_kv_cache``, swapped in every module of the build that imported it).
    """

    kit: Kit
    backend: str
    transport: Transport
    side: Any  # harness.server.Side
    release_kv_cache: Recorder
    switch_forced: bool = True
    rows: _RowsBack | None = None
    """What ``release_kv_cache`` gives back to the pools (its recorder's effect)."""
    warnings: WarningLog = field(default_factory=WarningLog)
    clock: LabClock | None = None
    """The process's clocks while the side's edges are held: a release timeout passes by :meth:`wait`."""

    @property
    def scheduler(self) -> Any:
        return self.side.scheduler

    @property
    def queue(self) -> Any:
        """The scheduler's own ``DecodeTransferQueue`` (or whatever its start-up built in that place)."""
        return self.scheduler.disagg_decode_transfer_queue

    @property
    def kv_mgr(self) -> Any:
        return self.scheduler.disagg_decode_prealloc_queue.kv_manager

    def step(self) -> list[Any]:
        """One pass of the decode event loop's queue step (``process_decode_queue``).

        Returns what that pass handed to decoding (the scheduler's waiting queue).
        """
        before = list(self.scheduler.waiting_queue)
        self.scheduler.process_decode_queue()
        return [r for r in self.scheduler.waiting_queue if all(r is not b for b in before)]

    def admit(self, rid: str, *, refuse_metadata_at: int | None = None, room: int | None = None) -> DecodeRank:
        """A new request through the scheduler's dispatch, bootstrapped and preallocated by its event loop.

        ``refuse_metadata_at`` makes that prefill rank's socket refuse the request's metadata once (a
        transient ZMQ error): the ranks before it hold the destination, the rest do not; the same
        pass of the event loop then meets the failed room in the transfer queue. ``room``: the
        request gets that bootstrap room (an id the tokenizer's random draw gives again) instead
        of a fresh one.
        """
        req = new_req(rid)
        if room is not None:
            req.bootstrap_room = room
        rank = DecodeRank(self, req)
        if refuse_metadata_at is not None:
            import zmq

            failure = self.kit.intended_failure(
                f"prefill rank {refuse_metadata_at}'s socket refuses the metadata once", zmq.ZMQError
            )
            self.transport.wire.refuse_next(
                prefill_endpoint(refuse_metadata_at), failure(zmq.EAGAIN), about=str(rank.room).encode("ascii")
            )
        self.scheduler._add_request_to_queue(req)
        created = [d for d in self.scheduler.disagg_decode_prealloc_queue.queue if d.req is req]
        if not created:
            raise ProbeFailure(f"{rid} was not admitted to the prealloc queue")
        rank.decode_req = created[0]
        handed = self.step()
        if handed:
            raise ProbeFailure(f"a request was handed to decoding before any KV arrived: {handed!r}")
        if refuse_metadata_at is None and all(d is not rank.decode_req for d in self.queue.queue):
            prealloc = self.scheduler.disagg_decode_prealloc_queue
            raise ProbeFailure(
                f"{rid} did not reach the transfer queue (prealloc queue: {len(prealloc.queue)} waiting, "
                f"{prealloc.token_to_kv_pool_allocator.available_size()} KV tokens and "
                f"{prealloc.req_to_metadata_buffer_idx_allocator.available_size()} metadata slots free)"
            )
        return rank

    @contextlib.contextmanager
    def edges(self) -> Iterator[None]:
        """The faked edges this side was started with, held while the block runs.

        The transport (:meth:`Transport.contexts`, the receivers' sockets), GPU memory
        (``release_kv_cache``) and, where forced, the deferred-release switch.
        """
        from sglang.srt.mem_cache import common

        with contextlib.ExitStack() as stack:
            if self.switch_forced:
                stack.enter_context(_deferred_switch().override(True))
            stack.enter_context(self.transport.contexts())
            stack.enter_context(self.transport.receiver_sockets())
            stack.enter_context(swapped_at_import_sites(common, "release_kv_cache", self.release_kv_cache))
            if self.clock is not None:
                stack.enter_context(self.clock.running())
            yield

    def wait(self, seconds: float, why: str) -> None:
        """``seconds`` pass for the build's clocks (no sleep: the event loop's next pass sees them gone)."""
        if self.clock is None:
            raise ProbeFailure("this decode side was built without the lab clock: nothing can wait")
        self.clock.advance(seconds, why)

    def forget(self, reqs: Iterable[Any]) -> None:
        """Released requests the side stops tracking: a bench reusing it sends fresh ``Req`` objects."""
        if self.rows is not None:
            self.rows.freed.difference_update(id(req) for req in reqs)

    @contextlib.contextmanager
    def forced(self, owner: Any, name: str, attribute: str, value: Any) -> Iterator[None]:
        """``attribute`` of a built object set to ``value`` for one scenario, reported with what the build set."""
        built = getattr(owner, attribute)
        self.kit.forced_flag(f"{name}.{attribute}", value, built, f"{type(owner).__name__}.__init__ (as built)", [])
        setattr(owner, attribute, value)
        try:
            yield
        finally:
            setattr(owner, attribute, built)


@dataclass
class DecodeRank:
    """One request on a :class:`DecodeSide`, and what a scenario observes of it."""

    side: DecodeSide
    req: Any
    decode_req: Any = None
    """The ``DecodeRequest`` the build's prealloc queue made for ``req`` when it was admitted."""

    @property
    def room(self) -> int:
        return int(self.req.bootstrap_room)

    @property
    def receiver(self) -> Any:
        return self.decode_req.kv_receiver

    @property
    def slot(self) -> int:
        return int(self.decode_req.metadata_buffer_index)

    def release_count(self) -> int:
        """``release_kv_cache`` calls for this request (GPU memory returned)."""
        return sum(1 for call in self.side.release_kv_cache.calls if call.args and call.args[0] is self.req)

    def slot_free(self) -> bool:
        return self.slot in self.side.queue.req_to_metadata_buffer_idx_allocator.free_slots

    def held(self) -> bool:
        """The request's pages and metadata slot are held: neither released nor freed yet (observed by effect)."""
        return self.release_count() == 0 and not self.slot_free()

    def aborts(self, endpoint: str | None = None) -> list[list[bytes]]:
        """The ABORTs decode sent about this room (optionally to one prefill rank)."""
        room = str(self.room).encode("ascii")
        return [f for f in self.side.transport.wire.messages(b"ABORT", endpoint) if len(f) > 1 and f[1] == room]

    def abort_messages(self) -> int:
        """ABORTs about this room; the same message to the same rank again counts once (prefill treats it alike)."""
        room = str(self.room).encode("ascii")
        return len(
            {
                (ep, tuple(f))
                for ep, f in self.side.transport.wire.sent
                if f and f[0] == b"ABORT" and len(f) > 1 and f[1] == room
            }
        )

    def streamed(self) -> list[int | None]:
        """What this request's client received (its abort's HTTP status per output, None otherwise)."""
        return self.side.side.seen["sockets"].streamed(self.req.rid)

    def client_abort(self) -> None:
        """The client aborts the request: the built scheduler's own ``abort_request`` with a real ``AbortReq``."""
        from sglang.srt.managers.io_struct import AbortReq

        self.side.scheduler.abort_request(AbortReq(rid=self.req.rid))


def _deferred_switch() -> Any:
    from sglang.srt.environ import envs

    return getattr(envs, DEFERRED_SWITCH)


def _report_switch_forced(kit: Kit) -> None:
    """Deferred release is forced on through the build's own switch: reported with the build's default."""
    kit.forced_flag(SWITCH_NAME, True, _deferred_switch().get(), "sglang/srt/environ.py", [DEFERRED_SWITCH])


class _RowsBack:
    """``release_kv_cache``'s effect on the pools: a released request's row and pages are free again (once).

    What the real call does beyond that (the radix tree, the request's own bookkeeping) is the
    GPU-memory edge the probe records instead; the row and pages go back so one side serves
    more requests than it has rows, as a server does.
    """

    def __init__(self) -> None:
        self.scheduler: Any = None
        self.freed: set[int] = set()

    def __call__(self, req: Any, *args: Any, **kwargs: Any) -> None:
        row = req.kv.req_pool_idx
        if self.scheduler is None or row is None or id(req) in self.freed:
            return
        self.freed.add(id(req))
        pool = self.scheduler.req_to_token_pool
        pages = pool.req_to_token[row, : req.kv.kv_allocated_len]
        if len(pages):
            self.scheduler.token_to_kv_pool_allocator.free(pages)
        pool.free_rows([row])


@contextlib.contextmanager
def decode_side(
    kit: Kit, backend: str, *, prefill_ranks: int, switch_forced: bool = True, **fields: Any
) -> Iterator[DecodeSide]:
    """A decode server on ``backend``, its transport faked, while the block runs.

    Deferred release is switched on through the build's switch (reported), unless
    ``switch_forced`` is False: then the build's default decides. ``fields``: more server
    arguments, as launch flags set them.
    """
    from sglang.srt.disaggregation import decode

    from harness.server import start

    _import_transport(backend)
    transport = Transport(kit, backend, prefill_ranks)
    rows = _RowsBack()
    release = kit.recorder("release_kv_cache", side_effect=rows)
    if switch_forced:
        _report_switch_forced(kit)
    side = DecodeSide(kit, backend, transport, None, release, switch_forced, rows, clock=LabClock(kit))
    with side.edges():
        side.side = start(kit, "decode", backend=backend, **fields)
        rows.scheduler = side.scheduler
        decode.logger.addHandler(side.warnings)
        try:
            yield side
        finally:
            decode.logger.removeHandler(side.warnings)


# --- back-end adaptations (one place): what each transport's decode side needs faked --------------
BACKENDS = ("mooncake", "nixl", "mori")
"""The transports driven here, Mooncake (the server's default) first. Ascend needs an NPU; ``fake`` moves no KV."""

TRANSPORT_PACKAGES = {"mori": "mori"}
"""A back end whose conn module imports its RDMA library at module level: that library is stubbed (the transport)."""


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


# --- version adaptation: a prefill rank's drain ack, as decode's receive thread handles it -------------
def deliver_abort_ack(side: DecodeSide, room: int, prefill_rank: int, abort_frames: list[bytes]) -> None:
    """A prefill rank's drain ack for the ABORT it received, read by decode's own receive loop.

    The frames go to the thread the build's decode KV manager started to read its socket
    (:meth:`harness.transport.Transport.deliver`), so the build's parsing of the ack (its tag,
    how many frames it wants, whether deferred release is on) decides what is noted.
    """
    side.transport.deliver(abort_ack_frames(room, prefill_rank, abort_frames))


def abort_ack_frames(room: int, prefill_rank: int, abort_frames: list[bytes]) -> list[bytes]:
    """The ack's wire form as the build's prefill rank sends it (``_send_abort_ack``).

    0.5.22: the build's own ``AbortAck`` encoder, echoing the generation the ABORT carried.
    <= 0.5.21: three frames, ``ABORT_ACK``, the room and the sending prefill rank.
    """
    from sglang.srt.disaggregation.common import conn

    if hasattr(conn, "AbortAck"):  # 0.5.22
        generation = conn.AbortNotification.from_zmq(abort_frames).generation
        return conn.AbortAck(room, prefill_rank, generation).to_zmq()
    return [b"ABORT_ACK", str(room).encode("ascii"), str(prefill_rank).encode("ascii")]
