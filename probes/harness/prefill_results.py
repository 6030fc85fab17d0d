"""The prefill side the build's start-up built, receiving prefill results through its own dispatch.

:class:`WiredPrefill` hands batches of results to the scheduler's own
``process_batch_result`` (which the build resolves to its disaggregated prefill step);
each request holds a KV row, a slot of the metadata allocator the build's
``init_disaggregation`` made and a real ``FakeKVSender`` (the 'fake' transfer back end).
Faked are the KV release and radix-insert functions (GPU memory; swapped where
``disaggregation/prefill.py`` imported them, as SGLang's tests do, and in every other
module of the build bound to the same function) and what
:mod:`harness.server` fakes (model, GPU, process groups, ZMQ sockets).
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from typing import Any

from difflab.probe.kit import Call, Kit, Recorder
from harness.requests import drop_kv, fake_kv_sender, hold_kv, new_req, set_scheduled_extent
from harness.runtime import cache_aborts, swapped, swapped_at_import_sites

PROMPT = 16


# ---------------------------------------------------------------------------
# Version adaptations, by feature.
#   radix insert of the finished prefill: maybe_cache_unfinished_req (<= 0.5.21),
#       checkpoint_kv_cache (0.5.22), both module globals of disaggregation.prefill
#   release_kv_cache(req, cache, is_insert=True) (<= 0.5.21) became
#       release_kv_cache(req, cache, *, checkpoint) (0.5.22): read the flag by binding
#       the call to the real signature
#   the optimistic re-queue asks the tree cache supports_mamba() (0.5.21 only; the
#       fake answers it on every release, a strict fake forbids missing names only)
# ---------------------------------------------------------------------------
def _radix_insert_name(prefill: Any) -> str:
    return "checkpoint_kv_cache" if hasattr(prefill, "checkpoint_kv_cache") else "maybe_cache_unfinished_req"


def _release_inserts(release_kv_cache: Callable[..., Any]) -> Callable[[Call], bool]:
    signature = inspect.signature(release_kv_cache)
    flag = "checkpoint" if "checkpoint" in signature.parameters else "is_insert"

    def inserts(call: Call) -> bool:
        bound = signature.bind(*call.args, **call.kwargs)
        bound.apply_defaults()
        return bool(bound.arguments[flag])

    return inserts


_SIDES: dict[int, Any] = {}


def wired_prefill(kit: Kit) -> Any:
    """The prefill side the build's start-up builds (:mod:`harness.server`), once per probe."""
    from harness.server import start

    if id(kit) not in _SIDES:
        side = start(kit, "prefill")
        # Forced as before (a KV-storage tier is what 0.5.20 tells the cache an abort for),
        # reported beside the verdict with the value the build's own start-up gave it.
        built = side.scheduler.enable_hicache_storage
        side.scheduler.enable_hicache_storage = True
        kit.forced_flag(
            "scheduler.enable_hicache_storage",
            True,
            built,
            "Scheduler.__init__ as the build's start-up ran it (hicache_storage_backend unset)",
            [],
        )
        _SIDES[id(kit)] = side
    return _SIDES[id(kit)]


class WiredPrefill:
    """The wired prefill side's scheduler receiving results through its own ``process_batch_result``.

    Shared by the scenarios of one probe; each scenario gets fresh recorders (so counts
    are per scenario) on the side's real collaborators: the metadata-slot allocator its
    ``init_disaggregation`` built, its inflight and bootstrap queues, its output streamer
    writing to a fake socket, its ``send_kv_chunk`` (spied on the instance, the build's
    method runs), the tree cache the harness's KV build recorded. The KV release and radix
    insert are swapped where the build defines them and everywhere it imported them.
    """

    def __init__(self, kit: Kit, stack: ExitStack, side: Any = None) -> None:
        """``side``: a prefill side :func:`harness.server.start` built; the probe's shared one if None."""
        from sglang.srt.disaggregation import prefill

        self.kit = kit
        self.side = side if side is not None else wired_prefill(kit)
        self.scheduler = self.side.scheduler
        self.inserts = _release_inserts(prefill.release_kv_cache)
        self.release = kit.recorder("release_kv_cache", side_effect=lambda req, *a, **k: drop_kv(req))
        self.radix_insert = kit.recorder(_radix_insert_name(prefill))
        _swap_everywhere(stack, prefill, "release_kv_cache", self.release)
        _swap_everywhere(stack, prefill, _radix_insert_name(prefill), self.radix_insert)
        self.slots = self.scheduler.req_to_metadata_buffer_idx_allocator
        real_free = type(self.slots).free.__get__(self.slots)
        self.metadata_free = kit.recorder("metadata.free", side_effect=real_free)
        stack.enter_context(_on_instance(self.slots, "free", self.metadata_free))
        real_send = type(self.scheduler).send_kv_chunk.__get__(self.scheduler)
        self.send = kit.recorder("send_kv_chunk", side_effect=real_send)
        stack.enter_context(_on_instance(self.scheduler, "send_kv_chunk", self.send))
        self.cache_abort = self.side.seen["cache_abort"]
        self._cache_before = cache_aborts(self.cache_abort)
        self.sender_abort: dict[str, Recorder] = {}
        self.bootstrap_queue = self.scheduler.disagg_prefill_bootstrap_queue.queue
        self.kv_manager = self.scheduler.disagg_prefill_bootstrap_queue.kv_manager

    def results(self, reqs: list[Any]) -> None:
        """Deliver one batch's prefill results (a sampled token per request) through the scheduler's own step."""
        import time

        batch = _extend_batch(self.kit, reqs)
        # Stamped as run_batch stamps the batch it launched.
        self.scheduler.forward_ct += 1
        batch.forward_iter = self.scheduler.forward_ct
        batch.launch_ts = time.monotonic()
        batch.extend_num_tokens = PROMPT * len(reqs)
        self.scheduler.process_batch_result(batch, _result(reqs))

    def result(self, req: Any) -> None:
        self.results([req])

    def counts(self, req: Any) -> dict[str, Any]:
        """Effects on ``req`` so far in this scenario."""
        return {
            "release_kv_cache": self.release.count,
            "release_without_insert": sum(1 for c in self.release.calls if not self.inserts(c)),
            "radix_insert": self.radix_insert.count,
            "send_kv_chunk": self.send.count,
            "send_last_chunk": sum(1 for c in self.send.calls if c.kwargs.get("last_chunk") is True),
            "metadata_freed": self.metadata_free.count,
            "cache_aborts": cache_aborts(self.cache_abort) - self._cache_before,
            "sender_abort": self.sender_abort[req.rid].count,
            "streamed": self.side.seen["sockets"].streamed(req.rid),
            "inflight": self.scheduler.disagg_prefill_inflight_queue.count(req),
            "requeued": req in self.scheduler.waiting_queue or req in self.bootstrap_queue,
            "pending_chunk": req.rid in self.scheduler.disagg_prefill_pending_chunk_rids,
            "output_tokens": len(req.output_ids),
            "retired": req.finished(),
        }

    def prefilled(self, rid: str, tokens: int = PROMPT) -> Any:
        """A bootstrapped request whose prefill ran ``tokens`` tokens: KV row, metadata slot, a real sender."""
        req = new_req(rid, prompt_len=PROMPT)
        hold_kv(req, tokens)
        req.metadata_buffer_index = self.slots.alloc()
        req.disagg_kv_sender = fake_kv_sender(self.kv_manager, req)
        self.sender_abort[req.rid] = self.kit.recorder("sender.abort", side_effect=req.disagg_kv_sender.abort)
        req.disagg_kv_sender.abort = self.sender_abort[req.rid]
        req.pending_bootstrap = False
        set_scheduled_extent(req, 0, PROMPT)
        return req

    def middle_chunk(self, rid: str, *, start: int, end: int, pending_bootstrap: bool = False) -> Any:
        """A chunked request with one middle chunk in flight that prefills prompt tokens ``[start, end)``."""
        req = self.prefilled(rid, tokens=end)
        set_scheduled_extent(req, start, end)
        req.inflight_middle_chunks = 1
        req.pending_bootstrap = pending_bootstrap
        if not pending_bootstrap:
            self.scheduler.disagg_prefill_pending_chunk_rids.add(req.rid)  # its chunk's KV send is owed
        return req

    def seen(self, req: Any, *names: str) -> dict[str, Any]:
        """The named effects so far, ``inflight`` as a yes/no."""
        counts = self.counts(req)
        counts["inflight"] = counts["inflight"] > 0
        return {name: counts[name] for name in names}


def _swap_everywhere(stack: ExitStack, module: Any, name: str, value: Any) -> None:
    """``module.name`` swapped where the build defines it and in every module of the build that imported it.

    SGLang's tests patch it where ``disaggregation/prefill.py`` imported it; a build may call
    it from elsewhere too (a helper moved to a module of its own imports it itself).
    """
    import sys

    original = getattr(module, name)
    owner = sys.modules.get(getattr(original, "__module__", None) or "")
    if owner is not None and getattr(owner, name, None) is original:
        stack.enter_context(swapped_at_import_sites(owner, name, value))
    else:  # the build rebound it in this module alone: swap that binding
        stack.enter_context(swapped(module, name, value))


@contextlib.contextmanager
def _on_instance(obj: Any, name: str, value: Any) -> Iterator[None]:
    """``obj.name`` is ``value`` on this instance only, for one scenario (the class's method stays as built)."""
    object.__setattr__(obj, name, value)
    try:
        yield
    finally:
        obj.__dict__.pop(name, None)


def _extend_batch(kit: Kit, reqs: list[Any]) -> Any:
    """A real ``ScheduleBatch`` in EXTEND mode holding ``reqs``; every other field is the build's default."""
    from sglang.srt.managers.schedule_batch import ScheduleBatch
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    batch = ScheduleBatch(reqs=reqs, forward_mode=ForwardMode.EXTEND)
    batch.prefill_stats = _prefill_stats(reqs)
    return batch


def _prefill_stats(reqs: list[Any]) -> Any:
    """The stats the scheduler attaches to a prefill batch it formed (``PrefillStats.from_adder``): all new tokens."""
    from sglang.srt.managers.scheduler_components import metrics_reporter

    offered: dict[str, Any] = {
        "log_input_tokens": PROMPT * len(reqs),
        "log_hit_tokens": 0,
        "new_token_ratio": 0.0,
        "num_new_seqs": len(reqs),
    }
    counter = getattr(metrics_reporter, "QueueCount", None)
    accepted = inspect.signature(metrics_reporter.PrefillStats).parameters
    if "num_running_reqs" in accepted:
        offered["num_running_reqs"] = counter.from_reqs([], False) if counter is not None else 0
    return metrics_reporter.PrefillStats(**{k: v for k, v in offered.items() if k in accepted})


def _result(reqs: list[Any]) -> Any:
    import torch
    from sglang.srt.managers.utils import GenerationBatchResult

    return GenerationBatchResult(next_token_ids=torch.full((len(reqs),), 11))
