"""The two schedulers of a :class:`harness.pd_pair.Pair` and the queues they own.

Each side (the probes and the schedule search) is the server the build's own start-up builds
(:func:`harness.server.start`: plugins, start-up patches, the build's scheduler class and mixin
order, its ``init_disaggregation`` queues, metadata buffers and the back end's real KV manager),
over that rank's tiny CPU pools. Prefill (:func:`wired_prefill_side`): every request gets the
sender class the build's ``get_kv_class`` names; its ``send`` hands the page indices to the
loopback (:class:`harness.pd_pair.BuildStart`). Decode (:func:`wired_decode_side`): every request
gets the build's receiver class; the loopback plays the prefill rank's transfer engine
(:class:`harness.pd_pair.BuildEnd`). Only the transfer edge is faked (:mod:`harness.transport`).
One server per back end and deferred-release switch setting serves a probe's scenarios, put back
to its start-up state before each (:mod:`harness.kept`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from harness.pd_pair import (
    BOOTSTRAP_PORT,
    PAGE,
    POOL_TOKENS,
    REQ_ROWS,
    BuildEnd,
    Pair,
    metadata_like,
)
from harness.server import Published

NUM_KV_HEADS = 1

Report = Callable[..., None]
"""Where a wired side says what server it was: ``report(name, **fields)``, like ``Kit.event``."""


@dataclass
class PrefillSide:
    scheduler: Any
    queue: Any  # PrefillBootstrapQueue
    streamed: Callable[[str], list[int | None]]
    """What a client received, read off the build's own output sockets."""
    published: Published | None = None
    """The runtime context the side's start-up published, put back while the side runs."""

    def active(self) -> contextlib.AbstractContextManager[Any]:
        return self.published.active() if self.published is not None else contextlib.nullcontext()

    def statuses(self, rid: str) -> list[int | None]:
        return self.streamed(rid)


@dataclass
class DecodeSide:
    scheduler: Any
    prealloc: Any  # DecodePreallocQueue
    transfer: Any  # DecodeTransferQueue
    streamed: Callable[[str], list[int | None]]
    """What a client received, read off the build's own output sockets."""
    published: Published | None = None
    """The runtime context the side's start-up published, put back while the side runs."""

    def active(self) -> contextlib.AbstractContextManager[Any]:
        return self.published.active() if self.published is not None else contextlib.nullcontext()

    def admit(self, req: Any) -> None:
        """The request reaches decode through the scheduler's own dispatch."""
        self.scheduler._add_request_to_queue(req)

    def statuses(self, rid: str) -> list[int | None]:
        return self.streamed(rid)


# ---------------------------------------------------------------------------
# The decode side as the build's start-up wires it.
# ---------------------------------------------------------------------------
@contextlib.contextmanager
def wired_decode_side(
    pair: Pair, capacity: int, *, force_deferred: bool = False, report: Report | None = None
) -> Iterator[DecodeSide]:
    """The decode server the build's ``run_scheduler_process`` builds, over the pair's decode memory.

    Launch flags as an operator sets them for this tiny pool: ``--page-size`` the pair's page,
    ``--max-total-tokens`` ``capacity``, ``--max-running-requests`` the pair's request rows,
    ``--num-reserved-decode-tokens 0`` (the pool holds 32 tokens). Deferred release, where
    forced, is the build's own switch (reported with its default). Held for the block: the
    transfer edge, the virtual clock in the back-end modules, the receivers watched. One server
    per back end and switch setting serves a probe's scenarios (:func:`_kept_server`). What the
    server was (its scheduler, manager and receiver classes) is the ``decode_server`` event, or goes
    to ``report`` (the schedule search: one record, not one event per schedule).
    """
    from harness.decode_kv import _deferred_switch, _report_switch_forced

    if capacity != POOL_TOKENS:
        raise ValueError(f"the pair's decode pool holds {POOL_TOKENS} tokens, not {capacity}")
    kit, rank = pair.kit, pair.decode
    with contextlib.ExitStack() as stack:
        if force_deferred:
            _report_switch_forced(kit)
            stack.enter_context(_deferred_switch().override(True))
        kept = _kept_server(
            pair,
            rank,
            "decode",
            stack,
            max_total_tokens=capacity,
            max_running_requests=REQ_ROWS,
            num_reserved_decode_tokens=0,
        )
        transport, scheduler = kept.transport, kept.side.scheduler
        receivers: list[str] = []
        stack.enter_context(_watched_receivers(pair, receivers))
        stack.enter_context(_virtual_clock(pair))
        pair.prefill.metadata = metadata_like(rank.metadata, pair.prefill.metadata)
        prealloc, transfer = scheduler.disagg_decode_prealloc_queue, scheduler.disagg_decode_transfer_queue
        pair.end = BuildEnd(pair, prealloc.kv_manager, transport)
        pair.release_timeout_s = float(transfer.deferred_kv_release_timeout)  # the build's own default
        pair.waiting_timeout_s = float(prealloc.kv_manager.waiting_timeout)  # what its receivers compare
        yield DecodeSide(
            scheduler,
            prealloc,
            transfer,
            streamed=kept.side.seen["sockets"].streamed,
            published=kept.side.published,
        )
        (report or kit.event)(
            "decode_server",
            backend=pair.backend,
            built_by="run_scheduler_process",
            scheduler=type(scheduler).__qualname__,
            kv_manager=type(prealloc.kv_manager).__qualname__,
            receivers=sorted(set(receivers)),
            scenario=kept.scenarios,
        )


def _kept_server(pair: Pair, rank: Any, mode: str, stack: contextlib.ExitStack, **flags: Any) -> Any:
    """The side of ``mode`` over ``rank``'s memory: started now, or the probe's kept one put back.

    One per probe, back end, deferred-release switch setting and rank (:mod:`harness.kept`): a
    start is ~30-40 ms of CPU and the pair's probes run 16-20 scenarios per release. Its
    transfer edge is entered on ``stack`` for the scenario (the receivers' sockets on decode);
    the rank's tree cache, metadata buffers and slot allocator become the server's own.
    """
    from harness.decode_kv import _deferred_switch, _import_transport
    from harness.kept import kept_side, kept_transport
    from harness.server import Memory, start
    from harness.transport import Transport

    key = (id(pair.kit), mode, pair.backend, bool(_deferred_switch().get()), id(rank))
    _import_transport(pair.backend)
    transport = kept_transport(key) or Transport(pair.kit, pair.backend, prefill_ranks=1)
    stack.enter_context(transport.contexts())
    if mode == "decode":
        stack.enter_context(transport.receiver_sockets())
    memory = Memory(
        pools=lambda rows, tokens: (rank.req_to_token, rank.allocator, rank.kv),
        tree_cache=lambda req_pool, allocator: rank.cache,
        disable_radix_cache=True,
    )

    def launch() -> Any:
        return start(
            pair.kit,
            mode,
            backend=pair.backend,
            memory=memory,
            page_size=PAGE,
            disaggregation_bootstrap_port=BOOTSTRAP_PORT,
            **flags,
        )

    kept, _ = kept_side(key, transport, launch, skip=(rank.kv, rank.req_to_token, rank.allocator))
    scheduler = kept.side.scheduler
    rank.cache = scheduler.tree_cache
    rank.metadata = scheduler.disagg_metadata_buffers
    rank.slots = scheduler.req_to_metadata_buffer_idx_allocator
    return kept


# ---------------------------------------------------------------------------
# The prefill side as the build's start-up wires it.
# ---------------------------------------------------------------------------
@contextlib.contextmanager
def wired_prefill_side(pair: Pair, *, report: Report | None = None) -> Iterator[PrefillSide]:
    """The prefill server the build's ``run_scheduler_process`` builds, over the pair's prefill memory.

    Launch flags as an operator sets them for this tiny pool: ``--page-size`` the pair's page,
    ``--max-total-tokens`` what the pool holds (the bootstrap door's bound), ``--max-running-requests``
    the pair's request rows, ``--disable-radix-cache`` (the pair's prefill cache is the disabled
    one); the environment is the decode server's (its deferred-release switch included). The
    scheduler, its ``PrefillBootstrapQueue``, metadata buffers and the back end's prefill KV
    manager are the build's ``init_disaggregation``'s; each request gets the sender class the
    build's ``get_kv_class`` names (:func:`_watched_senders`). Held for the block: the transfer
    edge (:mod:`harness.transport`: engine, bound socket, bootstrap HTTP, threads). One server
    per back end and switch setting serves a probe's scenarios (:func:`_kept_server`). What the
    server was is the ``prefill_server`` event, or goes to ``report``.
    """
    from harness.pd_pair import BuildStart

    kit = pair.kit
    with contextlib.ExitStack() as stack:
        kept = _kept_server(
            pair,
            pair.prefill,
            "prefill",
            stack,
            max_total_tokens=POOL_TOKENS,
            max_running_requests=REQ_ROWS,
            disable_radix_cache=True,
        )
        senders: list[str] = []
        stack.enter_context(_watched_senders(pair, senders))
        scheduler = kept.side.scheduler
        queue = scheduler.disagg_prefill_bootstrap_queue
        pair.start = BuildStart(pair, queue.kv_manager)
        yield PrefillSide(scheduler, queue, streamed=kept.side.seen["sockets"].streamed, published=kept.side.published)
        (report or kit.event)(
            "prefill_server",
            backend=pair.backend,
            built_by="run_scheduler_process",
            scheduler=type(scheduler).__qualname__,
            kv_manager=type(queue.kv_manager).__qualname__,
            senders=sorted(set(senders)),
            scenario=kept.scenarios,
        )


@contextlib.contextmanager
def _watched_senders(pair: Pair, classes: list[str]) -> Iterator[None]:
    """The build's sender class, each instance's hand-off to the transfer engine played by the loopback.

    ``get_kv_class`` is the build's own, as the prefill queue module looks it up; a sender it
    names is constructed as the build constructs it (its manager the build's). Its ``send`` --
    where the real one queues the chunk for the RDMA engine -- posts the page indices the
    build's ``send_kv_chunk`` gave it on the loopback (:meth:`harness.pd_pair.Pair.sent`);
    its ``abort`` is noted, then runs unchanged. ``classes`` collects each sender's class name.
    A sender that takes its page indices as a pinned host tensor copied off the GPU (0.5.23's
    Mooncake) is told it does not: there is no GPU, and the build's other path gives the same pages.
    """
    from sglang.srt.disaggregation import prefill
    from sglang.srt.disaggregation.utils import KVClassType

    from harness.runtime import swapped

    real = prefill.get_kv_class

    def get_kv_class(backend: Any, kind: Any) -> Any:
        cls = real(backend, kind)
        if kind != KVClassType.SENDER:
            return cls

        def build(*args: Any, **kwargs: Any) -> Any:
            sender = cls(*args, **kwargs)
            classes.append(type(sender).__qualname__)
            room, abort = int(sender.bootstrap_room), sender.abort
            pair.senders[room] = sender

            def send(kv_indices: Any, *rest: Any, **more: Any) -> None:
                pair.sent(room, kv_indices, getattr(sender, "num_kv_indices", None))

            def aborted() -> Any:
                pair.start.aborted.add(room)
                pair.sender_aborted(room)
                return abort()

            object.__setattr__(sender, "send", send)
            object.__setattr__(sender, "abort", aborted)
            if getattr(sender, "supports_host_tensor_indices", False):
                # GPU: the page indices' pinned-memory copy off the device (0.5.23's Mooncake sender
                # takes them so) needs CUDA; on a CPU the build's own numpy path hands them over.
                object.__setattr__(sender, "supports_host_tensor_indices", False)
            return sender

        return build

    with swapped(prefill, "get_kv_class", get_kv_class):
        yield


@contextlib.contextmanager
def _watched_receivers(pair: Pair, classes: list[str]) -> Iterator[None]:
    """The build's receiver class, each instance's ``send_metadata`` watched: the loopback learns the destination.

    ``get_kv_class`` is the build's own, as the decode queue module looks it up; a receiver it
    names is constructed as the build constructs it, and only its published page indices and
    metadata slot are read (then the build's ``send_metadata`` runs unchanged). ``classes``
    collects the class name of every receiver made.
    """
    from sglang.srt.disaggregation import decode
    from sglang.srt.disaggregation.utils import KVClassType

    from harness.runtime import swapped

    real = decode.get_kv_class

    def get_kv_class(backend: Any, kind: Any) -> Any:
        cls = real(backend, kind)
        if kind != KVClassType.RECEIVER:
            return cls

        def build(*args: Any, **kwargs: Any) -> Any:
            receiver = cls(*args, **kwargs)
            classes.append(type(receiver).__qualname__)
            room, publish = int(receiver.bootstrap_room), receiver.send_metadata

            def send_metadata(kv_indices: Any, aux_index: Any = None, *rest: Any, **more: Any) -> Any:
                pair.publish(room, kv_indices, aux_index)
                return publish(kv_indices, aux_index, *rest, **more)

            object.__setattr__(receiver, "send_metadata", send_metadata)
            return receiver

        return build

    with swapped(decode, "get_kv_class", get_kv_class):
        yield


@contextlib.contextmanager
def _virtual_clock(pair: Pair) -> Iterator[None]:
    """The back-end modules' ``time`` is the pair's clock (their waiting timeouts follow the lab's clock)."""
    import importlib

    from harness.runtime import swapped
    from harness.transport import CONN_MODULES

    clock = pair.time()
    with contextlib.ExitStack() as stack:
        for name in CONN_MODULES:
            if not name.startswith(("common", pair.backend)):
                continue
            module = importlib.import_module(f"sglang.srt.disaggregation.{name}")
            if hasattr(module, "time"):
                stack.enter_context(swapped(module, "time", clock))
        yield
