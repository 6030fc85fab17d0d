"""The two schedulers of a :class:`harness.pd_pair.Pair` and the queues they own.

Wired (the probes): each side is the server the build's own start-up builds
(:func:`harness.server.start`: plugins, start-up patches, the build's scheduler class and mixin
order, its ``init_disaggregation`` queues, metadata buffers and the back end's real KV manager),
over that rank's tiny CPU pools. Prefill (:func:`wired_prefill_side`): every request gets the
sender class the build's ``get_kv_class`` names; its ``send`` hands the page indices to the
loopback (:class:`harness.pd_pair.BuildStart`). Decode (:func:`wired_decode_side`): every request
gets the build's receiver class; the loopback plays the prefill rank's transfer engine
(:class:`harness.pd_pair.BuildEnd`). Only the transfer edge is faked (:mod:`harness.transport`).
One server per back end and deferred-release switch setting serves a probe's scenarios, put back
to its start-up state before each (:mod:`harness.kept`).

Bare (:func:`prefill_side`, :func:`decode_side`, the schedule search, which resets one pair per
schedule): a real ``Scheduler`` owning a real ``PrefillBootstrapQueue`` (its result step the real
``process_batch_result_disagg_prefill``, whose real ``send_kv_chunk`` reads the request's
``req_to_token`` row), and one owning a real ``DecodePreallocQueue`` and ``DecodeTransferQueue``,
built without their constructors, with the loopback's sender and receiver in the back end's role.
Every attribute not given here is answered by the build's own constructor code
(:mod:`harness.strict`) or fails the probe by name.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from difflab.probe.kit import Kit
from harness.gloo import single_rank_group
from harness.pd_pair import (
    BOOTSTRAP_HOST,
    BOOTSTRAP_PORT,
    PAGE,
    POOL_TOKENS,
    REQ_ROWS,
    BuildEnd,
    Pair,
    _backend,
    metadata_like,
)
from harness.requests import fake_output_streamer
from harness.scheduler import beam_coordinator
from harness.server import Published
from harness.strict import real_object

NUM_KV_HEADS = 1


def _metrics(kit: Kit, name: str) -> Any:
    """The metrics reporter without --enable-metrics (its stage recorder the real, disabled one, 0.5.20+)."""
    return kit.fake(name, enable_metrics=False, report_prefill_stats=kit.recorder(f"{name}.report"), **_stage_metrics())


# ---------------------------------------------------------------------------
# Version adaptations of the prefill door's reads, by feature.
#   capacity bound: max_total_num_tokens (<= 0.5.22); max_input_len from the module's
#       max_bootstrap_input_len (0.5.23)
#   tp_rank / pp_rank: create_sender hands them to senders whose constructor takes
#       dest_tp_ranks (<= 0.5.21)
# ---------------------------------------------------------------------------
@functools.cache
def _door_reads(capacity: int) -> dict[str, Any]:
    from sglang.srt.disaggregation import prefill
    from sglang.srt.disaggregation.base.conn import BaseKVSender

    reads: dict[str, Any] = {}
    if hasattr(prefill, "max_bootstrap_input_len"):
        reads["max_input_len"] = prefill.max_bootstrap_input_len(capacity=capacity, page_size=1, shard_size=1)
    else:
        reads["max_total_num_tokens"] = capacity
    if "dest_tp_ranks" in inspect.signature(BaseKVSender.__init__).parameters:
        reads.update(tp_rank=0, pp_rank=0)
    return reads


def _stage_metrics() -> dict[str, Any]:
    """The queue's stage-time recorder (0.5.20+): the real one, disabled as without --enable-metrics."""
    try:
        from sglang.srt.observability.scheduler_stage_metrics import SchedulerStageMetricsRecorder
    except ImportError:
        return {}
    return {"scheduler_stage_metrics": SchedulerStageMetricsRecorder(enabled=False)}


@dataclass
class PrefillSide:
    scheduler: Any
    queue: Any  # PrefillBootstrapQueue
    sent: dict[str, list[int | None]] = field(default_factory=dict)
    streamed: Callable[[str], list[int | None]] | None = None
    """What a client received (wired: read off the build's own output sockets); ``sent`` otherwise."""
    published: Published | None = None
    """The runtime context the side's start-up published (wired), put back while the side runs."""

    def active(self) -> contextlib.AbstractContextManager[Any]:
        return self.published.active() if self.published is not None else contextlib.nullcontext()

    def statuses(self, rid: str) -> list[int | None]:
        return self.streamed(rid) if self.streamed is not None else list(self.sent.get(rid, []))


@dataclass
class DecodeSide:
    scheduler: Any
    prealloc: Any  # DecodePreallocQueue
    transfer: Any  # DecodeTransferQueue
    sent: dict[str, list[int | None]] = field(default_factory=dict)
    streamed: Callable[[str], list[int | None]] | None = None
    """What a client received (wired: read off the build's own output sockets); ``sent`` otherwise."""
    wired: bool = False
    published: Published | None = None
    """The runtime context the side's start-up published (wired), put back while the side runs."""

    def active(self) -> contextlib.AbstractContextManager[Any]:
        return self.published.active() if self.published is not None else contextlib.nullcontext()

    def admit(self, req: Any) -> None:
        """The request reaches decode: the scheduler's own dispatch when wired, the prealloc door otherwise."""
        if self.wired:
            self.scheduler._add_request_to_queue(req)
        else:
            self.prealloc.add(req)

    def statuses(self, rid: str) -> list[int | None]:
        return self.streamed(rid) if self.streamed is not None else list(self.sent.get(rid, []))


def prefill_side(pair: Pair, capacity: int) -> PrefillSide:
    """The prefill scheduler and its bootstrap queue; ``capacity`` is the door's token bound."""
    from collections import deque

    from sglang.srt.disaggregation.prefill import PrefillBootstrapQueue
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    kit, rank = pair.kit, pair.prefill
    streamer, sent = fake_output_streamer(kit)
    group = single_rank_group()
    scheduler = real_object(
        kit,
        Scheduler,
        "prefill_scheduler",
        output_streamer=streamer,
        tree_cache=rank.cache,
        token_to_kv_pool_allocator=rank.allocator,
        req_to_token_pool=rank.req_to_token,
        disagg_metadata_buffers=rank.metadata,
        req_to_metadata_buffer_idx_allocator=rank.slots,
        disagg_prefill_inflight_queue=[],
        disagg_prefill_pending_chunk_rids=set(),
        waiting_queue=[],
        chunked_req=None,
        spec_algorithm=SpeculativeAlgorithm.NONE,
        attn_cp_cpu_group=group,
        attn_tp_cpu_group=group,
        batch_result_processor=kit.fake(
            "batch_result_processor",
            snapshot_auxiliary_output_starts=kit.recorder("snapshot", returns=[]),
            move_logprobs_to_cpu=kit.recorder("move_logprobs_to_cpu"),
            consume_auxiliary_output=kit.recorder("consume_auxiliary_output"),
        ),
        metrics_reporter=_metrics(kit, "prefill metrics_reporter"),
        return_health_check_ipcs=deque(),
        enable_staging=False,
        beam_coordinator=beam_coordinator(kit),  # the real one; a request without a beam group is a no-op
        ps=kit.fake("prefill parallel state", pp_size=1, pp_rank=0, tp_rank=0, tp_size=1),
    )
    queue = real_object(
        kit,
        PrefillBootstrapQueue,
        "prefill_bootstrap_queue",
        scheduler=scheduler,
        queue=[],
        transfer_backend=_backend(pair.backend),
        kv_manager=kit.fake("prefill kv_manager", kv_args=kit.fake("kv_args", state_types=[])),
        bootstrap_port=BOOTSTRAP_PORT,
        req_to_metadata_buffer_idx_allocator=rank.slots,
        pp_size=1,
        **_stage_metrics(),
        **_door_reads(capacity),
    )
    object.__setattr__(scheduler, "disagg_prefill_bootstrap_queue", queue)
    return PrefillSide(scheduler, queue, sent)


def decode_side(pair: Pair, capacity: int, *, force_deferred: bool = False) -> DecodeSide:
    """The decode scheduler, its pre-allocation queue and transfer queue over the decode rank's memory."""
    from sglang.srt.disaggregation.decode import DecodePreallocQueue, DecodeTransferQueue
    from sglang.srt.disaggregation.utils import DisaggregationMode
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    kit, rank = pair.kit, pair.decode
    streamer, sent = fake_output_streamer(kit)
    scheduler = real_object(
        kit,
        Scheduler,
        "decode_scheduler",
        output_streamer=streamer,
        tree_cache=rank.cache,
        running_batch=kit.fake("running_batch", reqs=[]),
        enable_hisparse=False,
        enable_decode_hicache=False,
        enable_priority_scheduling=False,
        # what the decode event loop's queue step and abort_request read besides the queues
        disaggregation_mode=DisaggregationMode.DECODE,
        waiting_queue=[],
        chunked_req=None,
        mm_receiver=None,
        dllm_config=None,
        last_batch=None,
        enable_continuous_input_polling=False,
        grammar_manager=kit.fake("grammar_manager", abort_requests=kit.recorder("abort_requests")),
        ps=kit.fake("parallel state", pp_size=1),
        metrics_reporter=_metrics(kit, "decode metrics_reporter"),
        kv_checksum_computer=None,
        # 0.5.20+: the handoff token's reasoning-token accounting (no reasoning parser here)
        batch_result_processor=kit.fake(
            "decode batch_result_processor", _maybe_update_reasoning_tokens=kit.recorder("reasoning_tokens")
        ),
    )
    transfer = real_object(
        kit,
        DecodeTransferQueue,
        "decode_transfer_queue",
        queue=[],
        gloo_group=single_rank_group(),
        req_to_metadata_buffer_idx_allocator=rank.slots,
        tp_rank=0,
        metadata_buffers=rank.metadata,
        scheduler=scheduler,
        tree_cache=rank.cache,
        spec_algorithm=SpeculativeAlgorithm.NONE,
        enable_staging=False,
        staging_handler=None,
        enable_host_receive=False,
        forced={"enable_deferred_kv_release": True} if force_deferred else None,
    )
    prealloc = real_object(
        kit,
        DecodePreallocQueue,
        "decode_prealloc_queue",
        scheduler=scheduler,
        queue=[],
        pending_reqs=[],
        retracted_queue=[],
        req_to_token_pool=rank.req_to_token,
        token_to_kv_pool_allocator=rank.allocator,
        token_to_kv_pool=rank.kv,
        tree_cache=rank.cache,
        req_to_metadata_buffer_idx_allocator=rank.slots,
        metadata_buffers=rank.metadata,
        transfer_queue=transfer,
        max_total_num_tokens=capacity,
        num_reserved_decode_tokens=0,
        transfer_backend=_backend(pair.backend),
        gloo_group=single_rank_group(),
        tp_rank=0,
        pp_size=1,
        kv_manager=kit.fake(
            "decode kv_manager",
            kv_args=kit.fake("decode kv_args", state_types=[]),
            prefill_info_table={
                f"{BOOTSTRAP_HOST}:{BOOTSTRAP_PORT}": kit.fake("prefill_info", dp_size=1, follow_bootstrap_room=True)
            },
        ),
    )
    pair.release_timeout_s = float(transfer.deferred_kv_release_timeout)  # the build's own default
    object.__setattr__(scheduler, "disagg_decode_prealloc_queue", prealloc)
    object.__setattr__(scheduler, "disagg_decode_transfer_queue", transfer)
    return DecodeSide(scheduler, prealloc, transfer, sent)


# ---------------------------------------------------------------------------
# The decode side as the build's start-up wires it.
# ---------------------------------------------------------------------------
@contextlib.contextmanager
def wired_decode_side(pair: Pair, capacity: int, *, force_deferred: bool = False) -> Iterator[DecodeSide]:
    """The decode server the build's ``run_scheduler_process`` builds, over the pair's decode memory.

    Launch flags as an operator sets them for this tiny pool: ``--page-size`` the pair's page,
    ``--max-total-tokens`` ``capacity``, ``--max-running-requests`` the pair's request rows,
    ``--num-reserved-decode-tokens 0`` (the pool holds 32 tokens). Deferred release, where
    forced, is the build's own switch (reported with its default). Held for the block: the
    transfer edge, the virtual clock in the back-end modules, the receivers watched. One server
    per back end and switch setting serves a probe's scenarios (:func:`_kept_server`).
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
            wired=True,
            published=kept.side.published,
        )
        kit.event(
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
def wired_prefill_side(pair: Pair) -> Iterator[PrefillSide]:
    """The prefill server the build's ``run_scheduler_process`` builds, over the pair's prefill memory.

    Launch flags as an operator sets them for this tiny pool: ``--page-size`` the pair's page,
    ``--max-total-tokens`` what the pool holds (the bootstrap door's bound), ``--max-running-requests``
    the pair's request rows, ``--disable-radix-cache`` (the pair's prefill cache is the disabled
    one); the environment is the decode server's (its deferred-release switch included). The
    scheduler, its ``PrefillBootstrapQueue``, metadata buffers and the back end's prefill KV
    manager are the build's ``init_disaggregation``'s; each request gets the sender class the
    build's ``get_kv_class`` names (:func:`_watched_senders`). Held for the block: the transfer
    edge (:mod:`harness.transport`: engine, bound socket, bootstrap HTTP, threads). One server
    per back end and switch setting serves a probe's scenarios (:func:`_kept_server`).
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
        kit.event(
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
