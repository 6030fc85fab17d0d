"""One prefill rank and one decode rank of the build, their real KV memory, a loopback wire between them.

Each rank holds SGLang's own memory objects at a tiny size on the CPU: a
``ReqToTokenPool``, an ``MHATokenToKVPool`` (one layer, one head), a
``PagedTokenToKVPoolAllocator`` over it, a ``ChunkCache`` (the decode side of PD
without a radix cache; the prefill side with it disabled), ``MetadataBuffers`` and a
``ReqToMetadataIdxAllocator``. Page contents are tensors and are never zeroed
between requests, as in production.

The requests move through the build's own queue methods: the prefill door
(``PrefillBootstrapQueue.add``), the bootstrap poll (``pop_bootstrapped``), the
prefill result step (``process_batch_result_disagg_prefill`` with the real
``send_kv_chunk``), the in-flight poll, the decode door (``DecodePreallocQueue.add``),
the decode pre-allocation (``pop_preallocated``), the transfer poll (``pop_transferred``)
and the KV release (``release_kv_cache``). Both sides are the servers the
build's own start-up builds: :func:`harness.pd_sides.wired_prefill_side` and
:func:`harness.pd_sides.wired_decode_side` run ``run_scheduler_process`` in prefill and
decode mode (scheduler class, ``init_disaggregation`` queues, metadata buffers, the back
end's KV managers; per request the sender and receiver classes the build's
``get_kv_class`` names), each stepped with its own published runtime context
(:class:`harness.server.Published`), one server per back end and switch setting kept
across a probe's scenarios and put back to its start-up state before each
(:mod:`harness.kept`). So are the schedule search's (:mod:`harness.pd_machine`): its
thousands of schedules run on the two kept servers, put back before each.

Faked are the model, the GPU and the network only:

- the model forward: :meth:`Pair.prefill_forward` allocates through the real
  allocator and pool as the scheduler would and writes the request's own marker into
  every slot it got; :meth:`Pair.attend` is the fake attention: it reads exactly the
  slots ``req_to_token`` maps for the request's sequence, and nothing else;
- the transfer engines and the network between the ranks (:class:`harness.pages.Loopback`
  moves the pages): page contents are copied exactly as the prefill sender's page indices
  and the decode receiver's published destination say. The senders,
  receivers and KV managers are the back end's own and what each rank's transfer threads
  would conclude goes through its manager (:class:`BuildStart`, :class:`BuildEnd`); only
  the sender's hand-off to the RDMA engine (``send``) is the loopback's;
- the zmq/HTTP side: the output streamer records the status each client received.

Not shown on a CPU (the GPU tier's): RDMA timing, attention kernels, several ranks.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from difflab.probe.kit import Kit, MissingFakeAttribute
from harness.pages import Foreign, Ledger, Loopback, PagedBuffers, marker, owner_of
from harness.requests import set_scheduled_extent
from harness.runtime import ensure_runtime, swapped
from harness.strict import real_object

PAGE = 4
POOL_TOKENS = 32  # 8 pages per rank
REQ_ROWS = 4
CONTEXT = 64
METADATA_SLOTS = 4
BOOTSTRAP_HOST = "192.0.2.10"
BOOTSTRAP_PORT = 8998

FIRST_ROOM = 8192

NEED_SORT = False
"""The pair's allocators hand freed pages back first (``need_sort=False``: freed pages go to the
front of the free list). A PD server builds its allocator with ``need_sort=True``
(``mem_cache/kv_cache_configurator.py``, ``need_sort=get_disagg().disaggregation_mode in
("decode", "prefill")``): freed pages wait in ``release_pages`` and come back, sorted, only once
the free list runs out. With the server's order the pair's two-request race scenarios give the
victim fresh pages (no reuse, no leak); the same race needs pool pressure there. This is the
lab's choice, not the build's, and every pair probe names it (:func:`memory_event`)."""


class BuildStart:
    """The prefill end of a wired pair: the build's own senders over the back end's own prefill KV manager.

    Built by :func:`harness.pd_sides.wired_prefill_side`. The loopback plays decode's
    registration and the transfer engine only: what the prefill rank's bootstrap thread and
    transfer workers would conclude about a room -- decode registered its destination
    (``WaitingForInput``), every page landed (``Success``), the send failed (``Failed``, with
    its reason) -- goes through the build's manager (``update_status``, ``record_failure``);
    each sender's own ``poll``, ``init``, ``abort``, ``clear`` and ``failure_exception`` then
    answer from there. Only ``send`` (handing a chunk to the RDMA engine) is the loopback's:
    the page indices the build's ``send_kv_chunk`` gives it go on the wire
    (:meth:`Pair.sent`).
    """

    def __init__(self, pair: Pair, kv_mgr: Any) -> None:
        self.pair, self.kv_mgr = pair, kv_mgr
        self.aborted: set[int] = set()

    def published(self, room: int) -> None:
        from sglang.srt.disaggregation.base.conn import KVPoll

        if room in self.kv_mgr.request_status:
            self.kv_mgr.update_status(room, KVPoll.WaitingForInput)

    def failed(self, room: int, reason: str) -> None:
        from sglang.srt.disaggregation.base.conn import KVPoll

        if room in self.kv_mgr.request_status:
            self.kv_mgr.record_failure(room, reason)
            self.kv_mgr.update_status(room, KVPoll.Failed)

    def landed(self, room: int) -> int | None:
        from sglang.srt.disaggregation.base.conn import KVPoll

        if room in self.aborted:
            return None
        if room in self.kv_mgr.request_status:
            self.kv_mgr.update_status(room, KVPoll.Success)
        return self.pair.senders[room].aux_index


class BuildEnd:
    """The decode end of a wired pair: the build's own KV manager and receivers.

    Built by :func:`harness.pd_sides.wired_decode_side`.

    The loopback plays the prefill rank and its transfer engine only. What decode's receive
    path would conclude about a room -- every page landed (``Success``), or the prefill rank
    reported the room ``Failed`` -- goes through the build's manager (``update_status``,
    ``record_failure``), as :mod:`pr41404_deferred_release` reports a prefill failure. Decode's
    ABORTs are read off the wire the build's receivers send them on (:meth:`heard`), and a
    drain ack reaches decode's own receive loop in the build's wire form
    (:func:`harness.decode_kv.abort_ack_frames`).
    """

    def __init__(self, pair: Pair, kv_mgr: Any, transport: Any) -> None:
        self.pair, self.kv_mgr, self.transport = pair, kv_mgr, transport
        self.aborts: dict[int, list[bytes]] = {}
        transport.wire.listeners.append(self.heard)

    @property
    def defers(self) -> bool:
        return bool(self.kv_mgr.enable_deferred_decode_kv_release)

    def heard(self, endpoint: str, frames: list[bytes]) -> None:
        """A message decode sent the prefill rank: an ABORT reaches it (the loopback drops, then acks)."""
        if len(frames) > 1 and frames[0] == b"ABORT":
            room = int(frames[1])
            self.aborts[room] = frames
            self.pair.abort_room(room)

    def _open(self, room: int) -> bool:
        from sglang.srt.disaggregation.base.conn import KVPoll

        status = self.kv_mgr.request_status.get(room)
        return status is not None and status not in (KVPoll.Success, KVPoll.Failed)

    def landed(self, room: int) -> None:
        from sglang.srt.disaggregation.base.conn import KVPoll

        if self._open(room):
            self.kv_mgr.update_status(room, KVPoll.Success)

    def failed(self, room: int, reason: str) -> None:
        from sglang.srt.disaggregation.base.conn import KVPoll

        if self._open(room):
            self.kv_mgr.record_failure(room, reason)
            self.kv_mgr.update_status(room, KVPoll.Failed)

    def ack(self, room: int) -> None:
        from harness.decode_kv import abort_ack_frames

        self.transport.deliver(abort_ack_frames(room, 0, self.aborts[room]))

    def timed_out(self, room: int, req: Any) -> bool:
        """Decode's own receiver gave up waiting: the abort it finished with names the build's timeout."""
        return "timed out" in str(getattr(req.finished_reason, "message", ""))


@dataclass
class Rank:
    """One rank's real KV memory."""

    kv: Any  # MHATokenToKVPool
    req_to_token: Any  # ReqToTokenPool
    allocator: Any  # PagedTokenToKVPoolAllocator
    cache: Any  # ChunkCache
    metadata: Any  # MetadataBuffers
    slots: Any  # ReqToMetadataIdxAllocator

    def reset(self) -> None:
        """Back to a fresh rank's state (a new schedule of the search; never between requests of one)."""
        from sglang.srt.disaggregation.utils import ReqToMetadataIdxAllocator

        self.allocator.clear()
        self.req_to_token.clear()
        self.req_to_token.req_to_token.zero_()
        for buf in (self.kv.get_key_buffer(0), self.kv.get_value_buffer(0)):
            buf.zero_()
        for name in _metadata_fields(self.metadata):
            getattr(self.metadata, name).zero_()
        self.slots = ReqToMetadataIdxAllocator(METADATA_SLOTS)
        self.cache = _disabled_tree_cache(self.req_to_token, self.allocator)

    def buffers(self) -> PagedBuffers:
        return PagedBuffers([self.kv.get_key_buffer(0), self.kv.get_value_buffer(0)], PAGE)

    def free_pages(self) -> set[int]:
        pages = [self.allocator.free_pages]
        if getattr(self.allocator, "release_pages", None) is not None:
            pages.append(self.allocator.release_pages)
        return {int(p) for t in pages for p in t.tolist()}

    def pages_of(self, req: Any) -> set[int]:
        """The pages the request's ``req_to_token`` row maps for everything allocated to it."""
        return {s // PAGE for s in self.row(req, int(req.kv.kv_allocated_len))}

    def row(self, req: Any, length: int) -> list[int]:
        return [int(s) for s in self.req_to_token.req_to_token[req.kv.req_pool_idx, :length].tolist()]


@functools.cache
def _metadata_buffers_kwargs() -> dict[str, Any]:
    import inspect

    import torch
    from sglang.srt.disaggregation.utils import MetadataBuffers

    params = inspect.signature(MetadataBuffers).parameters
    kwargs: dict[str, Any] = {"hidden_size": 8, "hidden_states_dtype": torch.float32}
    if "max_sampling_mask_tokens" in params and params["max_sampling_mask_tokens"].default is inspect.Parameter.empty:
        kwargs["max_sampling_mask_tokens"] = 0
    return kwargs


def metadata_like(schema: Any, current: Any) -> Any:
    """Prefill's metadata buffers in decode's wire schema (the build requires P and D to match), ``current``'s size.

    Each tensor of ``schema`` (decode's ``MetadataBuffers``, as the build's start-up made it) is
    remade with ``current``'s row count, zeroed; every other attribute is ``schema``'s.
    """
    import copy

    import torch

    rows = getattr(current, _metadata_fields(current)[0]).shape[0]
    made = copy.copy(schema)
    for name in _metadata_fields(schema):
        tensor = getattr(schema, name)
        setattr(made, name, torch.zeros((rows, *tensor.shape[1:]), dtype=tensor.dtype, device=tensor.device))
    return made


def _metadata_buffers(size: int) -> Any:
    from sglang.srt.disaggregation.utils import MetadataBuffers

    return MetadataBuffers(size=size, **_metadata_buffers_kwargs())


# ---------------------------------------------------------------------------
# Version adaptation: the tree cache a scheduler builds with the radix cache disabled
# (the decode side of PD by default).
#   ChunkCache(params)                                   (<= 0.5.21, mem_cache/chunk_cache.py)
#   UnifiedRadixCache(params, disable=True, FULL only)   (0.5.22: registry.create_unified_radix_cache)
# ---------------------------------------------------------------------------
def _disabled_tree_cache(r2t: Any, allocator: Any) -> Any:
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams

    params = {"disable": True, "req_to_token_pool": r2t, "token_to_kv_pool_allocator": allocator, "page_size": PAGE}
    try:
        from sglang.srt.mem_cache.chunk_cache import ChunkCache
    except ImportError:
        from sglang.srt.mem_cache.unified_cache.components import ComponentType
        from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

        return UnifiedRadixCache(CacheInitParams(**params, tree_components=(ComponentType.FULL,)))
    return ChunkCache(CacheInitParams(**params))


def _rank() -> Rank:
    import torch
    from sglang.srt.disaggregation.utils import ReqToMetadataIdxAllocator
    from sglang.srt.mem_cache.allocator import PagedTokenToKVPoolAllocator
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool

    kv = MHATokenToKVPool(
        size=POOL_TOKENS,
        page_size=PAGE,
        dtype=torch.float32,
        head_num=1,
        head_dim=2,
        layer_num=1,
        device="cpu",
        enable_memory_saver=False,
    )
    r2t = ReqToTokenPool(size=REQ_ROWS, max_context_len=CONTEXT, device="cpu", enable_memory_saver=False)
    allocator = PagedTokenToKVPoolAllocator(POOL_TOKENS, PAGE, torch.float32, "cpu", kv, need_sort=NEED_SORT)
    cache = _disabled_tree_cache(r2t, allocator)
    return Rank(kv, r2t, allocator, cache, _metadata_buffers(METADATA_SLOTS), ReqToMetadataIdxAllocator(METADATA_SLOTS))


def memory_event(kit: Kit) -> None:
    """Name the pair's memory sizes and the allocator order the lab chose (see :data:`NEED_SORT`)."""
    kit.event(
        "memory",
        page_size=PAGE,
        pages_per_rank=POOL_TOKENS // PAGE,
        request_rows=REQ_ROWS,
        need_sort=NEED_SORT,
        server_need_sort=True,
        chosen_by="lab: freed pages are handed out again first (a PD server sorts them back in once the free list"
        " runs out)",
    )


@dataclass
class Read:
    """What the fake attention read for one decode step of one request."""

    rid: str
    pages: list[int]
    foreign: list[Foreign]
    canaries: set[int]
    canary_pages: dict[int, list[int]] = field(default_factory=dict)


@dataclass
class Pair:
    """A prefill rank and a decode rank wired through a loopback, fresh per scenario."""

    kit: Kit
    backend: str
    prefill: Rank
    decode: Rank
    ledger: Ledger
    wire: Loopback = field(init=False)
    end: BuildEnd = field(init=False)
    """Set by :func:`harness.pd_sides.wired_decode_side` (the build's decode KV manager)."""
    start: BuildStart = field(init=False)
    """Set by :func:`harness.pd_sides.wired_prefill_side` (the build's prefill KV manager)."""
    senders: dict[int, Any] = field(default_factory=dict)  # the build's own sender of each room
    room_rid: dict[int, str] = field(default_factory=dict)
    numbers: dict[str, int] = field(default_factory=dict)
    dst_aux: dict[int, Any] = field(default_factory=dict)
    decisions: list[str] = field(default_factory=list)
    timed_out: set[int] = field(default_factory=set)
    reads: list[Read] = field(default_factory=list)
    acked: set[int] = field(default_factory=set)
    acks_in_flight: list[int] = field(default_factory=list)
    failed_rooms: set[int] = field(default_factory=set)
    acks_failed_send: bool | None = None  # this build's Mooncake answer (pd_search), None: never asked
    deferred_by_default: bool | None = None  # the back end's manager's own default in this build
    release_timeout_s: float = 30.0
    clock: float = 0.0
    waiting_timeout_s: float = 300.0
    stack: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)

    def __post_init__(self) -> None:
        self.wire = Loopback(
            self.prefill.buffers(), self.decode.buffers(), self.ledger, on_last=self._landed, on_settled=self.settled
        )
        self.wire.decisions = self.decisions
        self.aborted_rooms: set[int] = set()
        self._time: VirtualTime | None = None

    def time(self) -> VirtualTime:
        """The ``time`` module every swapped SGLang module reads: this pair's clock."""
        if self._time is None:
            self._time = VirtualTime(self)
        return self._time

    # -- the prefill sender's hand-off and decode's published destination ---------------------
    def publish(self, room: int, kv_indices: Any, aux_index: Any) -> None:
        """Decode published where the room's pages and metadata go (its receiver's ``send_metadata``)."""
        self.wire.publish(room, [int(p) for p in kv_indices])
        self.dst_aux[room] = aux_index
        self.start.published(room)

    def sent(self, room: int, kv_indices: Any, num_pages: int | None) -> bool:
        """The prefill sender hands a chunk to the transfer engine: posted on the wire, or dropped (False).

        ``num_pages`` is what the build's ``init`` told the sender the room holds.
        """
        if num_pages is None:
            raise MissingFakeAttribute(f"room {room}: the build sent KV before the sender's init")
        if room in self.aborted_rooms:
            # Decode's ABORT reached this rank first: the chunk is dropped, the room concluded Failed.
            self.decisions.append(f"room {room}: chunk dropped, decode aborted the room")
            self.start.failed(room, f"room {room}: decode aborted the room")
            return False
        self.wire.post(room, self.room_rid[room], [int(p) for p in kv_indices], num_pages)
        return True

    def sender_aborted(self, room: int) -> None:
        self.decisions.append(f"room {room}: prefill sender aborted; decode not notified")

    # -- an ABORT reached the prefill rank: drop unposted chunks, ack once drained ---------
    def abort_room(self, room: int) -> None:
        self.aborted_rooms.add(room)
        self.decisions.append(f"room {room}: decode's ABORT reached the prefill rank")
        self.maybe_ack(room)

    def maybe_ack(self, room: int) -> None:
        """The prefill rank acks a drained abort once nothing it posted for the room is in flight.

        The ack travels back asynchronously: it reaches decode at the next
        :meth:`deliver_acks` (before decode's next poll), not inside the call that sent the ABORT.
        """
        drained = not self.wire.pending(room) or (room in self.failed_rooms and self.acks_failed_send is True)
        if room in self.aborted_rooms and drained and room not in self.acked:
            self.acked.add(room)
            self.acks_in_flight.append(room)
            self.decisions.append(f"room {room}: prefill acked the drain (no write in flight)")

    def fail_send(self, write: Any) -> None:
        """The transfer engine reports the room's send failed; the write itself may still be in flight."""
        room = write.room
        self.failed_rooms.add(room)
        self.decisions.append(f"room {room}: send reported failed, decode told Failed; the write stays in flight")
        reason = f"room {room}: the transfer engine reported the send failed"
        self.start.failed(room, reason)
        self.end.failed(room, reason)
        self.maybe_ack(room)

    def prefill_fault(self, room: int) -> None:
        """The prefill rank concludes the room Failed (a prefill fault); what it already posted stays on the wire.

        Unlike :meth:`fail_send`, nothing says the posted write failed: the prefill rank acks
        an ABORT of the room only once that write has landed (:meth:`maybe_ack`).
        """
        self.decisions.append(f"room {room}: prefill rank concluded the room Failed; its posted writes stay in flight")
        reason = f"room {room}: the prefill rank concluded the room Failed"
        self.start.failed(room, reason)
        self.end.failed(room, reason)

    def deliver_acks(self) -> None:
        for room in self.acks_in_flight:
            self.end.ack(room)
        self.acks_in_flight.clear()

    def settled(self, room: int) -> None:
        """A held write of ``room`` landed or failed: the prefill rank may now ack a drain."""
        self.maybe_ack(room)

    # -- the wire's completion: the last chunk landed, metadata copied, both ends Success ----
    def _landed(self, room: int) -> None:
        src = self.start.landed(room)
        if src is None:
            return
        dst = self.dst_aux.get(room)
        for name in _metadata_fields(self.prefill.metadata):
            getattr(self.decode.metadata, name)[dst] = getattr(self.prefill.metadata, name)[src]
        self.end.landed(room)

    # -- requests ------------------------------------------------------------
    def request(self, rid: str, prompt_len: int, *, max_new_tokens: int = 4) -> tuple[Any, Any]:
        """The same client request as the prefill and the decode scheduler each receive it (two real ``Req``)."""
        from array import array

        from sglang.srt.managers.schedule_batch import Req
        from sglang.srt.sampling.sampling_params import SamplingParams

        room = FIRST_ROOM + len(self.room_rid)  # per pair: the same schedule gives the same rooms
        self.room_rid[room] = rid
        self.numbers[rid] = len(self.numbers) + 1
        made = []
        for _ in range(2):
            made.append(
                Req(
                    rid=rid,
                    origin_input_text="",
                    origin_input_ids=array("q", range(prompt_len)),
                    sampling_params=SamplingParams(max_new_tokens=max_new_tokens),
                    bootstrap_host=BOOTSTRAP_HOST,
                    bootstrap_port=BOOTSTRAP_PORT,
                    bootstrap_room=room,
                )
            )
        return made[0], made[1]

    # -- the fake model ------------------------------------------------------
    def prefill_fits(self, req: Any) -> bool:
        """Whether the prefill pools can take the request now (the real scheduler would wait otherwise)."""
        need = -(-len(req.origin_input_ids) // PAGE) * PAGE
        return self.prefill.allocator.available_size() >= need and self.prefill.req_to_token.available_size() > 0

    def prefill_forward(self, req: Any) -> None:
        """Allocate the request's KV through the real pools and write its marker into every slot it got."""
        import torch

        length = len(req.origin_input_ids)
        rank = self.prefill
        rows = rank.req_to_token.alloc([req])
        if rows is None:
            raise RuntimeError("prefill request rows exhausted")
        need = -(-length // PAGE) * PAGE
        slots = rank.allocator.alloc(need)
        if slots is None:
            raise RuntimeError(f"prefill KV pool cannot hold {req.rid}'s {length} tokens")
        # The whole last page stays the request's (a paged allocator hands out and frees whole pages).
        rank.req_to_token.write((req.kv.req_pool_idx, slice(0, length)), slots[:length].to(torch.int32))
        req.kv.kv_allocated_len = length
        req.kv.kv_committed_len = length
        set_scheduled_extent(req, 0, length)
        value = float(marker(self.numbers[req.rid]))
        for buf in (rank.kv.get_key_buffer(0), rank.kv.get_value_buffer(0)):
            buf[slots[:length]] = value

    def attend(self, req: Any) -> Read:
        """The fake attention of one decode step: every slot req_to_token maps for the sequence, nothing else."""
        seqlen = len(req.origin_input_ids) + max(len(req.output_ids) - 1, 0)
        slots = self.decode.row(req, seqlen)
        pages = sorted({s // PAGE for s in slots})
        values = self.decode.kv.get_key_buffer(0)[slots, 0, 0].tolist() if slots else []
        own = self.numbers[req.rid]
        canary_pages: dict[int, set[int]] = {}
        for slot, value in zip(slots, values, strict=True):
            n = owner_of(value)
            if n is not None and n != own:
                canary_pages.setdefault(n, set()).add(slot // PAGE)
        read = Read(
            rid=req.rid,
            pages=pages,
            foreign=self.ledger.foreign(req.rid, pages),
            canaries=set(canary_pages),
            canary_pages={n: sorted(p) for n, p in canary_pages.items()},
        )
        self.reads.append(read)
        return read

    def note_decode_allocation(self, before: set[int], holder: str) -> list[int]:
        """Pages the decode allocator handed out since ``before`` (a new generation each)."""
        taken = sorted(before - self.decode.free_pages())
        self.ledger.allocated(taken, holder)
        return taken

    def owner(self, number: int) -> str:
        return next(rid for rid, n in self.numbers.items() if n == number)


def _metadata_fields(buffers: Any) -> list[str]:
    import torch

    return [name for name, value in vars(buffers).items() if isinstance(value, torch.Tensor) and value.dim() >= 1]


def _backend(name: str) -> Any:
    from sglang.srt.disaggregation.utils import TransferBackend

    return TransferBackend(name)


_DEFERRED: dict[tuple[int, str], bool] = {}


def missing_backend(backend: str) -> str | None:
    """Why the pair cannot play ``backend`` in this build (it ships no such back end), or None.

    The back end's classes are looked up as a server looks them up (``get_kv_class``,
    :func:`harness.decode_kv.transport_classes`; its RDMA library stubbed).
    """
    from sglang.srt.server_args import DISAGG_TRANSFER_BACKEND_CHOICES

    from harness.decode_kv import transport_classes

    if backend not in DISAGG_TRANSFER_BACKEND_CHOICES:
        return (
            f"this build ships no {backend} transfer back end (choices: {', '.join(DISAGG_TRANSFER_BACKEND_CHOICES)})"
        )
    try:
        transport_classes(backend)
    except ModuleNotFoundError as exc:
        if (exc.name or "").startswith(f"sglang.srt.disaggregation.{backend}"):
            return f"this build has no module {exc.name}"
        raise
    return None


def _deferred_default(kit: Kit, backend: str) -> bool:
    key = (id(kit), backend)
    if key not in _DEFERRED:
        _DEFERRED[key] = _evaluate_deferred_default(kit, backend)
    return _DEFERRED[key]


def _evaluate_deferred_default(kit: Kit, backend: str) -> bool:
    """Whether this build's ``backend`` manager defers decode KV release, from its own constructor code.

    A back end without the deferred-release machinery in this build (:func:`harness.decode_kv.deferral_gap`:
    Mori up to 0.5.21) cannot defer: False, and the reason is the ``deferral`` event.
    """
    from sglang.srt.disaggregation.utils import DisaggregationMode

    from harness.decode_kv import deferral_gap, transport_classes

    gap = deferral_gap(backend)
    if gap is not None:
        kit.event("deferral", backend=backend, defers=False, reason=gap)
        return False
    cls, _ = transport_classes(backend)
    manager = real_object(kit, cls, f"{backend} decode kv_manager", disaggregation_mode=DisaggregationMode.DECODE)
    return bool(manager.enable_deferred_decode_kv_release)


_RANKS: list[Rank] = []


def build_pair(kit: Kit, backend: str = "mooncake", *, reuse_memory: bool = False) -> Pair:
    """A fresh pair: both ranks' memory, the loopback, the build's timeout (its sides: :mod:`harness.pd_sides`).

    ``reuse_memory``: the two ranks' real pools are built once per process and reset to a fresh
    rank's state for each scenario or schedule (:meth:`Rank.reset`); the kept servers are
    keyed by rank, so they serve every pair of the process.
    """
    ensure_runtime()
    from sglang.srt.environ import envs

    if reuse_memory:
        if not _RANKS:
            _RANKS.extend((_rank(), _rank()))
        for rank in _RANKS:
            rank.reset()
        prefill, decode = _RANKS
    else:
        prefill, decode = _rank(), _rank()
    pair = Pair(kit=kit, backend=backend, prefill=prefill, decode=decode, ledger=Ledger())
    pair.deferred_by_default = _deferred_default(kit, backend)
    pair.waiting_timeout_s = float(envs.SGLANG_DISAGGREGATION_WAITING_TIMEOUT.get())
    return pair


class VirtualTime:
    """decode.py's ``time`` module with the pair's clock: deferred-release deadlines follow the lab's clock.

    The base is a whole second, so a deadline the clock jumps exactly (``now - start >= timeout``
    after ``clock += timeout``) is met exactly: with a fractional base the subtraction can round
    below the timeout. One instance per pair (:meth:`Pair.time`), so every module reads one clock.
    """

    def __init__(self, pair: Pair) -> None:
        import time as real

        self._pair, self._real, self._base = pair, real, float(int(real.time()))

    def monotonic(self) -> float:
        return self._base + self._pair.clock

    def time(self) -> float:
        return self._base + self._pair.clock

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def _cpu_extend_kernel() -> Any:
    """The paged allocator's GPU (triton) extend kernel, answered by the build's own CPU reference of it."""
    from sglang.srt.mem_cache.allocator import paged

    class Launch:
        def __getitem__(self, grid: Any) -> Any:
            def run(prefix: Any, seq: Any, last: Any, free: Any, out: Any, _bs2: int, page: int) -> None:
                paged.alloc_extend_naive(prefix, seq, last, free, out, page, out.device)

            return run

    return Launch()


class OneRank:
    """``torch.distributed`` as a one-rank group answers it, without the gloo round trip.

    The pair is one prefill rank and one decode rank (tensor parallel 1): every
    all-reduce of poll states or hold flags is over a group of one, whose result is the
    input. The schedule search uses this (a real gloo all-reduce costs ~1.6 ms a call);
    the probes keep the real single-rank gloo group.
    """

    def __init__(self) -> None:
        import torch.distributed as real

        self._real = real

    def all_reduce(self, tensor: Any, op: Any = None, group: Any = None, async_op: bool = False) -> None:
        if async_op:
            raise MissingFakeAttribute("an asynchronous all-reduce was asked of the one-rank group")

    def get_world_size(self, group: Any = None) -> int:
        return 1

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


@contextlib.contextmanager
def one_rank_collectives() -> Iterator[None]:
    """The disaggregation modules' ``dist`` answered by :class:`OneRank` (see there)."""
    from sglang.srt.disaggregation import decode, prefill, utils

    with contextlib.ExitStack() as stack:
        for module in (utils, decode, prefill):
            if hasattr(module, "dist"):
                stack.enter_context(swapped(module, "dist", OneRank()))
        yield


@contextlib.contextmanager
def on_cpu(pair: Pair) -> Iterator[None]:
    """The pair's CPU stand-ins where the build's modules look them up, for a scenario.

    The paged allocator's triton kernel is answered by the build's ``alloc_extend_naive`` (the same
    allocation on a CPU; 0.5.22+ take that path themselves without triton), and the decode module's
    ``time`` is the pair's clock.
    """
    from sglang.srt.disaggregation import decode
    from sglang.srt.mem_cache.allocator import paged

    with contextlib.ExitStack() as stack:
        stack.enter_context(swapped(paged, "alloc_extend_kernel", _cpu_extend_kernel()))
        stack.enter_context(swapped(decode, "time", pair.time()))
        yield
