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
``send_kv_chunk``), the decode door (``DecodePreallocQueue.add``), the decode
pre-allocation (``pop_preallocated``), the transfer poll (``pop_transferred``) and
the KV release (``release_kv_cache``). The queues are built without their
constructors (:mod:`harness.strict`: every attribute the pair does not give comes
from the build's own constructor code, or the probe errors).

Faked are the model, the GPU and the network only:

- the model forward: :meth:`Pair.prefill_forward` allocates through the real
  allocator and pool as the scheduler would and writes the request's own marker into
  every slot it got; :meth:`Pair.attend` is the fake attention: it reads exactly the
  slots ``req_to_token`` maps for the request's sequence, and nothing else;
- the transfer back end: the build's ``get_kv_class`` is asked for the back end's
  sender and receiver as the queues ask, and answers with the loopback pair
  (:class:`harness.pages.Loopback`), which copies page contents exactly as the sender's
  page indices and the receiver's published destination say;
- the zmq/HTTP side: the output streamer records the status each client received.

Not shown on a CPU (the GPU tier's): RDMA timing, attention kernels, several ranks.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from difflab.probe.kit import Kit, MissingFakeAttribute
from harness.pages import Foreign, Ledger, Loopback, PagedBuffers, marker, markers_in
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

_rooms = itertools.count(8192)


class _Strict:
    """Loopback endpoints answer only what they define: a read of anything else is a probe error."""

    def __getattr__(self, item: str) -> Any:
        if item.startswith("__"):
            raise AttributeError(item)
        raise MissingFakeAttribute(f"the loopback {type(self).__name__} was asked for {item!r}")


class LoopbackSender(_Strict):
    """The prefill end of the wire in the role of the back end's sender (any release's signature)."""

    def __init__(self, pair: Pair, **kwargs: Any) -> None:
        self.pair = pair
        self.room = int(kwargs["bootstrap_room"])
        self.num_pages: int | None = None
        self.aux_index: int | None = None
        self.state: str = "WaitingForInput"
        self.aborted = False
        self.supports_host_tensor_indices = False  # 0.5.23 asks; page indices come as numpy, as other senders take them
        pair.senders[self.room] = self

    def init(self, num_kv_indices: int, aux_index: int | None = None) -> None:
        self.num_pages = int(num_kv_indices)
        self.aux_index = aux_index

    def pop_decode_prefix_len(self) -> int:
        return 0

    def should_send_kv_chunk(self, num_pages: int, last_chunk: bool) -> bool:
        return True

    def get_max_transfer_tokens(self) -> None:
        return None

    def send(self, kv_indices: Any, state_indices: Any = None, num_kv_tokens: Any = None) -> None:
        assert self.num_pages is not None, "send before init"
        rid = self.pair.room_rid[self.room]
        self.pair.wire.post(self.room, rid, [int(p) for p in kv_indices], self.num_pages)
        self.state = "Transferring"

    def poll(self) -> Any:
        from sglang.srt.disaggregation.base.conn import KVPoll

        return getattr(KVPoll, self.state)

    def abort(self) -> None:
        # Mooncake's sender abort concludes locally; it notifies nobody on the decode side.
        self.aborted = True
        self.state = "Failed"
        self.pair.decisions.append(f"room {self.room}: prefill sender aborted; decode not notified")

    def failure_exception(self) -> None:
        raise RuntimeError(f"loopback sender for room {self.room} failed")

    def clear(self) -> None:
        pass

    def get_transfer_metric(self) -> Any:
        from sglang.srt.disaggregation.base.conn import KVTransferMetric

        return KVTransferMetric()


class LoopbackReceiver(_Strict):
    """The decode end of the wire in the role of the back end's receiver."""

    def __init__(self, pair: Pair, **kwargs: Any) -> None:
        self.pair = pair
        self.room = int(kwargs["bootstrap_room"])
        self.state = "Bootstrapping"
        self.waited_since = pair.clock
        self.require_staging = False
        self.abort_notified = False
        self.conclude_state: Any = None
        self.supports_host_destination = False
        self.kv_mgr = pair.manager
        # one prefill rank (tp 1): the rank an ABORT goes to and an ack comes from
        self.bootstrap_infos: list[Any] = [{"rank_ip": BOOTSTRAP_HOST, "rank_port": BOOTSTRAP_PORT}]
        pair.receivers[self.room] = self

    def init(self, prefill_dp_rank: int = 0) -> None:
        self.state = "WaitingForInput"

    def send_metadata(self, kv_indices: Any, aux_index: Any = None, state_indices: Any = None, **_: Any) -> None:
        self.aux_index = aux_index
        self.pair.wire.publish(self.room, [int(p) for p in kv_indices])
        self.pair.dst_aux[self.room] = aux_index
        self.state = "Transferring"
        self.waited_since = self.pair.clock

    def poll(self) -> Any:
        from sglang.srt.disaggregation.base.conn import KVPoll

        if self.state == "Transferring" and self.pair.clock - self.waited_since >= self.pair.waiting_timeout_s:
            self.state = "Failed"
            self.pair.timed_out.add(self.room)
        return getattr(KVPoll, self.state)

    def failure_exception(self) -> None:
        raise RuntimeError(f"loopback receiver for room {self.room}: KV transfer timed out")

    def clear(self) -> None:
        pass

    def abort(self) -> None:
        """Decode aborts the room (a client abort): Failed, and with deferred release the prefill rank is told."""
        self.state = "Failed"
        if self.kv_mgr.enable_deferred_decode_kv_release:
            self.ensure_abort_notified()

    def ensure_abort_notified(self, *, force_arm: bool = False) -> None:
        """ABORT to the prefill rank, once: it drops what it has not posted and acks when drained."""
        if self.abort_notified:
            return
        self.abort_notified = True
        self.pair.abort_room(self.room)

    def is_abort_release_safe(self) -> bool:
        return self.kv_mgr.is_abort_release_safe(self.room, len(self.bootstrap_infos))


class LoopbackManager(_Strict):
    """The decode KV manager's deferred-release bookkeeping, in the role of the back end's.

    ``enable_deferred_decode_kv_release`` is the value the back end's real manager class
    computes in this build (its constructor code, evaluated by :mod:`harness.strict`).
    """

    def __init__(self, enable_deferred: bool) -> None:
        self.enable_deferred_decode_kv_release = enable_deferred
        self.acks: dict[int, int] = {}

    def is_abort_release_safe(self, bootstrap_room: int, required_acks: int) -> bool:
        return self.acks.get(bootstrap_room, 0) >= required_acks

    def clear_deferred_abort_state(self, bootstrap_room: int) -> None:
        self.acks.pop(bootstrap_room, None)


@dataclass
class Rank:
    """One rank's real KV memory."""

    kv: Any  # MHATokenToKVPool
    req_to_token: Any  # ReqToTokenPool
    allocator: Any  # PagedTokenToKVPoolAllocator
    cache: Any  # ChunkCache
    metadata: Any  # MetadataBuffers
    slots: Any  # ReqToMetadataIdxAllocator

    def buffers(self) -> PagedBuffers:
        return PagedBuffers([self.kv.get_key_buffer(0), self.kv.get_value_buffer(0)], PAGE)

    def free_pages(self) -> set[int]:
        pages = [self.allocator.free_pages]
        if getattr(self.allocator, "release_pages", None) is not None:
            pages.append(self.allocator.release_pages)
        return {int(p) for t in pages for p in t.tolist()}

    def row(self, req: Any, length: int) -> list[int]:
        return [int(s) for s in self.req_to_token.req_to_token[req.kv.req_pool_idx, :length].tolist()]


def _metadata_buffers(size: int) -> Any:
    import inspect

    import torch
    from sglang.srt.disaggregation.utils import MetadataBuffers

    params = inspect.signature(MetadataBuffers).parameters
    kwargs: dict[str, Any] = {"size": size, "hidden_size": 8, "hidden_states_dtype": torch.float32}
    if "max_sampling_mask_tokens" in params and params["max_sampling_mask_tokens"].default is inspect.Parameter.empty:
        kwargs["max_sampling_mask_tokens"] = 0
    return MetadataBuffers(**kwargs)


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
    allocator = PagedTokenToKVPoolAllocator(POOL_TOKENS, PAGE, torch.float32, "cpu", kv, need_sort=False)
    cache = _disabled_tree_cache(r2t, allocator)
    return Rank(kv, r2t, allocator, cache, _metadata_buffers(METADATA_SLOTS), ReqToMetadataIdxAllocator(METADATA_SLOTS))


@dataclass
class Read:
    """What the fake attention read for one decode step of one request."""

    rid: str
    pages: list[int]
    foreign: list[Foreign]
    canaries: set[int]


@dataclass
class Pair:
    """A prefill rank and a decode rank wired through a loopback, fresh per scenario."""

    kit: Kit
    backend: str
    prefill: Rank
    decode: Rank
    ledger: Ledger
    manager: LoopbackManager
    wire: Loopback = field(init=False)
    senders: dict[int, LoopbackSender] = field(default_factory=dict)
    receivers: dict[int, LoopbackReceiver] = field(default_factory=dict)
    room_rid: dict[int, str] = field(default_factory=dict)
    numbers: dict[str, int] = field(default_factory=dict)
    dst_aux: dict[int, Any] = field(default_factory=dict)
    decisions: list[str] = field(default_factory=list)
    timed_out: set[int] = field(default_factory=set)
    reads: list[Read] = field(default_factory=list)
    acked: set[int] = field(default_factory=set)
    clock: float = 0.0
    waiting_timeout_s: float = 300.0
    stack: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)

    def __post_init__(self) -> None:
        self.wire = Loopback(self.prefill.buffers(), self.decode.buffers(), self.ledger, on_last=self._landed)
        self.wire.decisions = self.decisions
        self.aborted_rooms: set[int] = set()

    # -- an ABORT reached the prefill rank: drop unposted chunks, ack once drained ---------
    def abort_room(self, room: int) -> None:
        self.aborted_rooms.add(room)
        self.decisions.append(f"room {room}: decode's ABORT reached the prefill rank")
        self.maybe_ack(room)

    def maybe_ack(self, room: int) -> None:
        """The prefill rank acks a drained abort: nothing it posted for the room is still in flight."""
        if room in self.aborted_rooms and not self.wire.pending(room) and room not in self.acked:
            self.acked.add(room)
            self.manager.acks[room] = self.manager.acks.get(room, 0) + 1
            self.decisions.append(f"room {room}: prefill acked the drain (no write in flight)")

    # -- the wire's completion: the last chunk landed, metadata copied, both ends Success ----
    def _landed(self, room: int) -> None:
        sender = self.senders[room]
        if sender.aborted:
            return
        src, dst = sender.aux_index, self.dst_aux.get(room)
        for name in _metadata_fields(self.prefill.metadata):
            getattr(self.decode.metadata, name)[dst] = getattr(self.prefill.metadata, name)[src]
        sender.state = "Success"
        receiver = self.receivers.get(room)
        if receiver is not None and receiver.state == "Transferring":
            receiver.state = "Success"

    # -- requests ------------------------------------------------------------
    def request(self, rid: str, prompt_len: int, *, max_new_tokens: int = 4) -> tuple[Any, Any]:
        """The same client request as the prefill and the decode scheduler each receive it (two real ``Req``)."""
        from array import array

        from sglang.srt.managers.schedule_batch import Req
        from sglang.srt.sampling.sampling_params import SamplingParams

        room = next(_rooms)
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
        rank.req_to_token.write((req.kv.req_pool_idx, slice(0, length)), slots[:length].to(torch.int32))
        if need > length:
            rank.allocator.free(slots[length:])
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
        keys = self.decode.kv.get_key_buffer(0)
        values = [float(keys[s, 0, 0]) for s in slots]
        own = self.numbers[req.rid]
        read = Read(
            rid=req.rid,
            pages=pages,
            foreign=self.ledger.foreign(req.rid, pages),
            canaries=markers_in(values) - {own},
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


def _kv_class(pair: Pair) -> Any:
    from sglang.srt.disaggregation.utils import KVClassType

    def get_kv_class(backend: Any, kind: Any) -> Any:
        if kind == KVClassType.SENDER:
            return lambda **kw: LoopbackSender(pair, **kw)
        if kind == KVClassType.RECEIVER:
            return lambda **kw: LoopbackReceiver(pair, **kw)
        raise MissingFakeAttribute(f"the pair was asked for a {kind} of back end {backend}")

    return get_kv_class


def _backend(name: str) -> Any:
    from sglang.srt.disaggregation.utils import TransferBackend

    return TransferBackend(name)


_MANAGERS = {
    "mooncake": ("sglang.srt.disaggregation.mooncake.conn", "MooncakeKVManager"),
    "nixl": ("sglang.srt.disaggregation.nixl.conn", "NixlKVManager"),
    "mori": ("sglang.srt.disaggregation.mori.conn", "MoriKVManager"),
}


def _deferred_default(kit: Kit, backend: str) -> bool:
    """Whether this build's ``backend`` manager defers decode KV release, from its own constructor code."""
    import importlib

    from sglang.srt.disaggregation.utils import DisaggregationMode

    module, name = _MANAGERS[backend]
    cls = getattr(importlib.import_module(module), name)
    manager = real_object(kit, cls, f"{backend} decode kv_manager", disaggregation_mode=DisaggregationMode.DECODE)
    return bool(manager.enable_deferred_decode_kv_release)


def build_pair(kit: Kit, backend: str = "mooncake") -> Pair:
    """A fresh pair: both ranks' memory, the queues of both sides, the loopback, the build's timeout."""
    ensure_runtime()
    from sglang.srt.environ import envs

    manager = LoopbackManager(_deferred_default(kit, backend))
    pair = Pair(kit=kit, backend=backend, prefill=_rank(), decode=_rank(), ledger=Ledger(), manager=manager)
    pair.waiting_timeout_s = float(envs.SGLANG_DISAGGREGATION_WAITING_TIMEOUT.get())
    return pair


def _cpu_extend_kernel() -> Any:
    """The paged allocator's GPU (triton) extend kernel, answered by the build's own CPU reference of it."""
    from sglang.srt.mem_cache.allocator import paged

    class Launch:
        def __getitem__(self, grid: Any) -> Any:
            def run(prefix: Any, seq: Any, last: Any, free: Any, out: Any, _bs2: int, page: int) -> None:
                paged.alloc_extend_naive(prefix, seq, last, free, out, page, out.device)

            return run

    return Launch()


@contextlib.contextmanager
def wired(pair: Pair) -> Iterator[None]:
    """The back end's classes answered by the loopback where both queue modules look them up.

    Also: the paged allocator's triton kernel replaced by the build's ``alloc_extend_naive``
    (the same allocation on a CPU; 0.5.22+ take that path themselves without triton).
    """
    from sglang.srt.disaggregation import decode, prefill
    from sglang.srt.mem_cache.allocator import paged

    with contextlib.ExitStack() as stack:
        stack.enter_context(swapped(prefill, "get_kv_class", _kv_class(pair)))
        stack.enter_context(swapped(decode, "get_kv_class", _kv_class(pair)))
        stack.enter_context(swapped(paged, "alloc_extend_kernel", _cpu_extend_kernel()))
        yield
