"""#36988: an aborted request's prefill result must retire it, not hand its KV to decode.

Scenario: a request is aborted while its prefill runs (``to_finish`` =
``FINISH_ABORT``, as ``Scheduler.abort_request`` does for a running request);
it holds a KV row, a metadata slot and a real ``FakeKVSender``. Its final
prefill result goes through the real
``SchedulerDisaggregationPrefillMixin.process_batch_result_disagg_prefill``
on a bare real ``Scheduler`` (hierarchical-cache storage on, so 0.5.20 also
tells the cache). The base appends the token, inserts the KV into the radix
tree, queues the request for transfer and sends its last chunk; the head
retires it once: KV released without insert, sender aborted, metadata slot
freed, cache told, the abort streamed.

Scenarios and observations:
- ``aborted``: final result of the aborted request. ``release_kv_cache``,
  ``release_without_insert``, ``radix_insert``, ``send_kv_chunk``,
  ``metadata_freed``, ``cache_aborts``, ``sender_abort``, ``streamed`` (what
  the client received: one HTTP status per response, ``[]`` for silence),
  ``inflight`` (in ``disagg_prefill_inflight_queue``),
  ``output_tokens``.
- ``delayed``: a second result for the same request after the first one
  (counts taken during the second call only): ``reenqueued``,
  ``send_kv_chunk``, ``release_kv_cache``, ``streamed``.

Control, equal on base and head: ``normal``, the final result of a request
that was not aborted, is cached, queued and sent once, nothing released.

Fakes: the KV release and radix-insert functions and the tree cache (GPU
memory), ``send_kv_chunk`` (the transfer), the batch-result processor and
metrics reporter (GPU tensors), the output streamer (ZMQ).
"""

from __future__ import annotations

import inspect
from collections import deque
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

from difflab.probe.kit import Call, Kit, Recorder
from harness.requests import (
    abort_while_running,
    drop_kv,
    fake_kv_sender,
    fake_output_streamer,
    hold_kv,
    new_req,
    set_scheduled_extent,
)
from harness.runtime import bare, cache_aborts, ensure_runtime, fake_tree_cache, swapped

PROMPT = 16


# ---------------------------------------------------------------------------
# Version adaptations, by feature.
#   radix insert of the finished prefill: maybe_cache_unfinished_req (<= 0.5.21),
#       checkpoint_kv_cache (0.5.22), both module globals of disaggregation.prefill
#   release_kv_cache(req, cache, is_insert=True) (<= 0.5.21) became
#       release_kv_cache(req, cache, *, checkpoint) (0.5.22): read the flag by binding
#       the call to the real signature
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


class _Prefill:
    """One bare scheduler and its recorded collaborators, built fresh per scenario."""

    def __init__(self, kit: Kit, stack: ExitStack) -> None:
        from sglang.srt.disaggregation import prefill
        from sglang.srt.disaggregation.utils import ReqToMetadataIdxAllocator
        from sglang.srt.managers.scheduler import Scheduler
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        self.kit = kit
        self.inserts = _release_inserts(prefill.release_kv_cache)
        self.release = kit.recorder("release_kv_cache", side_effect=lambda req, *a, **k: drop_kv(req))
        self.radix_insert = kit.recorder(_radix_insert_name(prefill))
        stack.enter_context(swapped(prefill, "release_kv_cache", self.release))
        stack.enter_context(swapped(prefill, _radix_insert_name(prefill), self.radix_insert))

        self.slots = ReqToMetadataIdxAllocator(4)
        self.metadata_free = kit.recorder("metadata.free", side_effect=self.slots.free)
        self.slots.free = self.metadata_free
        self.send = kit.recorder("send_kv_chunk")
        self.sender_abort: dict[str, Recorder] = {}
        output_streamer, self.sent = fake_output_streamer(kit)
        self.tree_cache, self.cache_abort = fake_tree_cache(kit)
        self.scheduler = bare(
            kit,
            Scheduler,
            batch_result_processor=kit.fake(
                "batch_result_processor",
                snapshot_auxiliary_output_starts=kit.recorder("snapshot", returns=[]),
                move_logprobs_to_cpu=kit.recorder("move_logprobs_to_cpu"),
                consume_auxiliary_output=kit.recorder("consume_auxiliary_output"),
            ),
            spec_algorithm=SpeculativeAlgorithm.NONE,
            tree_cache=self.tree_cache,
            disagg_prefill_inflight_queue=[],
            disagg_prefill_pending_chunk_rids=set(),
            send_kv_chunk=self.send,
            output_streamer=output_streamer,
            metrics_reporter=kit.fake("metrics_reporter", report_prefill_stats=kit.recorder("report")),
            return_health_check_ipcs=deque(),  # real maybe_send_health_check_signal: none pending
            req_to_metadata_buffer_idx_allocator=self.slots,
            enable_hicache_storage=True,
            enable_overlap=False,
            chunked_req=None,
        )

    def prefilled(self, rid: str) -> Any:
        """A bootstrapped request whose prefill ran: KV row, metadata slot, a real fake-backend sender."""
        req = new_req(rid, prompt_len=PROMPT)
        hold_kv(req, PROMPT)
        req.metadata_buffer_index = self.slots.alloc()
        req.disagg_kv_sender = fake_kv_sender(self.kit.fake("kv_manager"), req)
        self.sender_abort[req.rid] = self.kit.recorder("sender.abort", side_effect=req.disagg_kv_sender.abort)
        req.disagg_kv_sender.abort = self.sender_abort[req.rid]
        req.pending_bootstrap = False
        set_scheduled_extent(req, 0, PROMPT)
        return req

    def result(self, req: Any) -> None:
        """Deliver one prefill result for ``req`` through the real method."""
        import torch
        from sglang.srt.disaggregation.prefill import SchedulerDisaggregationPrefillMixin
        from sglang.srt.managers.utils import GenerationBatchResult

        batch = self.kit.fake("batch", reqs=[req], spec_info=None, prefill_stats=None, dp_cooperation_info=None)
        result = GenerationBatchResult(next_token_ids=torch.tensor([11]))
        SchedulerDisaggregationPrefillMixin.process_batch_result_disagg_prefill(self.scheduler, batch, result)

    def counts(self, req: Any) -> dict[str, Any]:
        """Cumulative effects on ``req`` so far."""
        return {
            "release_kv_cache": self.release.count,
            "release_without_insert": sum(1 for c in self.release.calls if not self.inserts(c)),
            "radix_insert": self.radix_insert.count,
            "send_kv_chunk": self.send.count,
            "send_last_chunk": sum(1 for c in self.send.calls if c.kwargs.get("last_chunk") is True),
            "metadata_freed": self.metadata_free.count,
            "cache_aborts": cache_aborts(self.cache_abort),
            "sender_abort": self.sender_abort[req.rid].count,
            "streamed": list(self.sent.get(req.rid, [])),
            "inflight": self.scheduler.disagg_prefill_inflight_queue.count(req),
            "output_tokens": len(req.output_ids),
            "retired": req.finished(),
        }


def _scenario(kit: Kit, name: str, body: Callable[[_Prefill], dict[str, Any]]) -> dict[str, Any]:
    with ExitStack() as stack:
        observed = body(_Prefill(kit, stack))
    return {f"{name}.{key}": value for key, value in observed.items()}


def _aborted(p: _Prefill) -> dict[str, Any]:
    req = p.prefilled("aborted")
    abort_while_running(req)
    p.result(req)
    seen = p.counts(req)
    seen["inflight"] = seen["inflight"] > 0
    return seen


def _delayed(p: _Prefill) -> dict[str, Any]:
    req = p.prefilled("delayed")
    abort_while_running(req)
    p.result(req)
    before = p.counts(req)
    p.result(req)
    after = p.counts(req)
    return {
        "reenqueued": after["inflight"] > before["inflight"],
        "streamed": after["streamed"][len(before["streamed"]) :],
        **{k: after[k] - before[k] for k in ("send_kv_chunk", "release_kv_cache", "sender_abort")},
    }


def _normal(p: _Prefill) -> dict[str, Any]:
    req = p.prefilled("normal")
    p.result(req)
    seen = p.counts(req)
    seen["inflight"] = seen["inflight"] > 0
    return seen


def observe(kit: Kit) -> dict[str, Any]:
    ensure_runtime()
    fields: dict[str, Any] = {}
    for name, body in (
        ("aborted", _aborted),
        ("delayed", _delayed),
        ("normal", _normal),
    ):
        fields.update(_scenario(kit, name, body))
    return fields
