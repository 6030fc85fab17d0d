"""#43719 (b) -- a failed room's prefill KV is quarantined, not inserted into the radix tree.

Scenario: a prefill request holds its prompt's KV and is in flight to decode.
The real Mooncake ``transfer_worker`` fails the write (``send_kvcache``
returns non-zero), concluding the room Failed. The scheduler's own
inflight-queue poll (``process_disagg_prefill_inflight_queue``) then polls the
real ``MooncakeKVSender`` on ``req.disagg_kv_sender``, meets Failed and
concludes the request the way this build does it (its
``handle_inflight_transfer_failure``, or whatever the poll calls instead);
SGLang's real ``release_kv_cache`` decides what happens to the KV, against a
fake radix tree and pools (GPU memory).

Observations: ``failed.radix_inserted`` -- the tree was asked to keep the
failed room's KV as a reusable prefix (``cache_finished_req(is_insert=True)``
/ ``insert_req`` / ``checkpoint``); a later request could then be served KV
that a timed-out transfer may still be reading or that never completed.
``failed.kv_returned_to_pool`` -- the request's KV row went back to the pool
now; ``failed.quarantined`` -- a quarantine-named method of the tree was
called. With the fix the KV is not inserted (released without insert, or
held in quarantine). No release up to 0.5.23 carries it: every
release shows ``failed.radix_inserted = true``; a git commit with the fix
would show ``false``.

Controls (equal on both sides): the request ends aborted with HTTP 500, and
the poll hands it back as done (``failed.concluded``).
"""

from __future__ import annotations

from typing import Any

from difflab.probe.kit import Kit
from harness.features import Machinery
from harness.mooncake import build_prefill_rank
from harness.radix import TreeCache, fake_prefill_tree_cache
from harness.requests import abort_status, hold_kv, new_req
from harness.server import start

PROMPT_TOKENS = 16


# --- version adaptations (one place, detected by feature) -----------------------
# The fix changes how the scheduler concludes a failed in-flight transfer; older releases have no such step.
MACHINERY = Machinery(
    "in-flight transfer failure handling",
    "sglang.srt.disaggregation.prefill",
    "SchedulerDisaggregationPrefillMixin.handle_inflight_transfer_failure",
)


def radix_inserted(tree: TreeCache) -> bool:
    """Did the tree keep the request's KV? The tree's keep-API by release:

    <= 0.5.20 ``cache_finished_req(req, is_insert=...)`` (always called; the flag decides),
    0.5.21 ``insert_req(req, up_to=...)``, 0.5.22 ``checkpoint(req, up_to=...)``.
    """
    by_flag = any(call.kwargs.get("is_insert") for call in tree.calls["cache_finished_req"].calls)
    return by_flag or tree.count("insert_req") > 0 or tree.count("checkpoint") > 0


def kv_returned_to_pool(tree: TreeCache) -> bool:
    """<= 0.5.20 the cache frees the row inside ``cache_finished_req``; 0.5.21+ ``req_to_token_pool.free``."""
    return tree.count("cache_finished_req") > 0 or tree.count("req_to_token_pool.free") > 0


# --- scenario --------------------------------------------------------------------
def failed(kit: Kit) -> dict[str, Any]:
    """The room's transfer failed: what does the scheduler's inflight-queue poll do with the prefill KV?

    The prefill scheduler is the one the build's start-up builds (:mod:`harness.server`:
    its class order, start-up and plugin patches, metrics reporter); the request sits
    in that scheduler's own inflight queue and its own ``process_disagg_prefill_inflight_queue``
    (the event-loop step that polls every in-flight sender) concludes it -- through the
    build's handler, a copy of it, or a fix placed in the poll itself. The radix tree
    the request's KV goes to is the probe's recorder (GPU memory).
    """
    req = new_req("pr43719b-001", PROMPT_TOKENS)
    hold_kv(req, tokens=PROMPT_TOKENS)

    rank = build_prefill_rank(kit, room=int(req.bootstrap_room))
    rank.send_result = lambda: -1  # the RDMA write fails (Mooncake timeout)
    rank.run_worker(rank.chunk(last=True))
    req.disagg_kv_sender = rank.sender()

    scheduler = start(kit, "prefill", backend="fake").scheduler
    tree = fake_prefill_tree_cache(kit)
    scheduler.tree_cache = tree.fake  # the GPU-memory edge the probe watches
    req.metadata_buffer_index = scheduler.req_to_metadata_buffer_idx_allocator.alloc()
    scheduler.disagg_prefill_inflight_queue.append(req)
    done = scheduler.process_disagg_prefill_inflight_queue()
    return {
        "failed.radix_inserted": radix_inserted(tree),
        "failed.kv_returned_to_pool": kv_returned_to_pool(tree),
        "failed.quarantined": bool(tree.quarantine_uses),
        "failed.abort_status": abort_status(req),
        "failed.concluded": [r.rid for r in done] == [req.rid],
    }


def succeeded(kit: Kit) -> dict[str, Any]:
    """Control: a room whose transfer succeeded is concluded the way the inflight queue does it.

    ``process_disagg_prefill_inflight_queue`` hands a finished request's KV to the
    real ``release_kv_cache`` with insertion on: the tree keeps it as a prefix, on
    every release. It shows the tree fake recognises an insert at all, so a
    ``failed.radix_inserted = false`` cannot come from a fake that never sees one.
    """
    import inspect

    from sglang.srt.mem_cache import common

    req = new_req("pr43719b-002", PROMPT_TOKENS)
    hold_kv(req, tokens=PROMPT_TOKENS)
    tree = fake_prefill_tree_cache(kit)
    # release_kv_cache(req, cache, is_insert=True) (<= 0.5.21) / (req, cache, *, checkpoint) (0.5.22+)
    keep = {"checkpoint": True} if "checkpoint" in inspect.signature(common.release_kv_cache).parameters else {}
    common.release_kv_cache(req, tree.fake, **keep)
    return {"succeeded.radix_inserted": radix_inserted(tree)}


def observe(kit: Kit) -> dict[str, Any]:
    MACHINERY.require(kit)
    # The worker marks the Mooncake session dead after the failed write, at ERROR.
    kit.allow_log(r"^Session decode-session-0 failed\.$")
    return {**failed(kit), **succeeded(kit)}
