"""#36988: an aborted request's prefill result must retire it, not hand its KV to decode.

A request aborted while its prefill runs (``to_finish`` = ``FINISH_ABORT``, as
``Scheduler.abort_request`` does for a running request) still gets its
prefill results. Each result goes through the real
``SchedulerDisaggregationPrefillMixin.process_batch_result_disagg_prefill``
on a bare real ``Scheduler``; the request holds a KV row, a metadata slot and
a real ``FakeKVSender``. The base treats an aborted result as a normal one
(token appended, KV inserted into the radix tree, request queued for
transfer, last chunk sent; a middle chunk only forgets its pending send, or
is re-queued when bootstrap is still pending). The head retires the request
exactly once, on every path, when its last in-flight result is back: KV
released without insert, sender aborted (best effort), metadata slot freed,
cache told, the abort streamed to the client once.

Scenarios (one fresh scheduler each) and what they observe:
- ``aborted``: the final result of an aborted request. ``release_kv_cache``,
  ``release_without_insert``, ``radix_insert``, ``send_kv_chunk``,
  ``metadata_freed``, ``cache_aborts``, ``sender_abort``, ``retired``
  (``finished()``), ``streamed`` (what the client received: one HTTP status
  per response, ``[]`` for silence), ``inflight`` (in
  ``disagg_prefill_inflight_queue``), ``output_tokens``.
- ``final_pending``: the same while bootstrap is still pending (optimistic
  prefill): the head retires it before the force-retry hook; the base queues it.
- ``delayed``: a second result for the same request after the first
  (deltas of the second call): ``reenqueued``, ``send_kv_chunk``,
  ``release_kv_cache``, ``sender_abort``, ``streamed`` and ``ignored`` (the
  second result changed nothing the probe can see: no send, release, sender
  abort, stream, queueing, cache or slot effect). The base
  re-enqueues and re-sends; the head's retirement is idempotent.
- ``grammar``: a live request whose grammar rejects the sampled token
  (``accept_token`` raises ``ValueError``; the release turns it into a 500).
  The base checked the grammar after caching, queueing and sending, so the
  rejected request's KV went to decode; the head checks first and retires it.
- ``mid_last``: the result of an aborted request's last in-flight middle
  chunk (no next chunk launched): the base only forgets the pending chunk
  send and leaks everything else; the head retires it.
- ``mid_still``: an aborted middle chunk whose final chunk is still in
  flight: the head waits (``pending_chunk_cleared`` false: the final chunk's
  send is still owed) and retires on the final result (``final_retired``).
- ``mid_pending``: an aborted middle chunk while bootstrap is pending: the
  base re-queues it (``requeued``: waiting queue or bootstrap queue, with a
  radix insert), the head retires it (abort is terminal). Both sides free
  its KV row once (with insert on the base, without on the head); a port
  that checks the abort first but does not retire frees nothing, so the
  retirement fields read base-like there while ``requeued`` reads head-like.
- ``sender_fails``: the final result of an aborted request whose
  ``sender.abort()`` raises (the transport is gone): the head still releases
  locally and streams the abort. The raise is a declared intended failure;
  the head's ``Failed to notify KV sender of abort`` log is expected.
  ``escaped`` (diagnostic, not in the matrix) says the transport's exception
  left the result loop -- a scheduler crash.

Controls, equal on base and head: ``normal`` (a live request's final result
is cached, queued and sent once, nothing released or streamed);
``duplicate`` (a live request's result delivered twice: the second is not
ignored, so ``ignored`` can read false); ``yielded`` (a live middle chunk
with bootstrap pending is re-queued on both sides); per scenario, the
effects both sides share (``mid_last`` sends nothing and forgets its pending
chunk, ``mid_still`` releases nothing before its final result, ``grammar``
keeps its token and its 500).

Forced switch: ``Scheduler.enable_hicache_storage``. On 0.5.20 the retirement
tells the tree cache (``tree_cache.finish(ABORT)``) only with hierarchical
cache storage on; from 0.5.21 it always does. The scenarios run with storage
on, so ``cache_aborts`` observes that effect on 0.5.20 as well; the build's
own default (off unless ``--hicache-storage-backend`` is given) is reported
beside the verdict. Under that default 0.5.20 leaves ``cache_aborts`` at 0
while every other field reads as here.

Fakes: the KV release and radix-insert functions and the tree cache (GPU
memory), ``send_kv_chunk`` (the transfer), the grammar backend, the
batch-result processor and metrics reporter (GPU tensors), the output
streamer (ZMQ), the bootstrap queue (a list).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

from difflab.probe.kit import Kit
from harness.features import Machinery
from harness.prefill_results import PROMPT, WiredPrefill
from harness.requests import abort_while_running
from harness.runtime import ensure_runtime

CHUNK = 8  # a middle chunk covers prompt tokens [0, CHUNK)


# The machinery the fix changes: disaggregated prefill's batch-result step (absent before PD existed).
MACHINERY = Machinery(
    "disaggregated prefill result processing",
    "sglang.srt.disaggregation.prefill",
    "SchedulerDisaggregationPrefillMixin.process_batch_result_disagg_prefill",
)


RETIREMENT = ("release_kv_cache", "release_without_insert", "metadata_freed", "cache_aborts", "sender_abort")
OUTCOME = ("retired", "streamed", "inflight", "send_kv_chunk", "radix_insert")


def _scenario(kit: Kit, name: str, body: Callable[[WiredPrefill], dict[str, Any]]) -> dict[str, Any]:
    with ExitStack() as stack:
        observed = body(WiredPrefill(kit, stack))
    return {f"{name}.{key}": value for key, value in observed.items()}


def _final(p: WiredPrefill, rid: str, *, aborted: bool) -> dict[str, Any]:
    req = p.prefilled(rid)
    if aborted:
        abort_while_running(req)
    p.result(req)
    return p.seen(req, *RETIREMENT, *OUTCOME, "send_last_chunk", "output_tokens")


def _final_pending(p: WiredPrefill) -> dict[str, Any]:
    req = p.prefilled("final-pending")
    req.pending_bootstrap = True  # optimistic prefill: the decode side has not bootstrapped yet
    abort_while_running(req)
    p.result(req)
    return p.seen(req, "inflight", "radix_insert", "release_without_insert", "send_kv_chunk", "streamed")


def _twice(p: WiredPrefill, rid: str, *, aborted: bool) -> dict[str, Any]:
    req = p.prefilled(rid)
    if aborted:
        abort_while_running(req)
    p.result(req)
    before = p.counts(req)
    p.result(req)
    after = p.counts(req)
    return {
        "reenqueued": after["inflight"] > before["inflight"],
        "streamed": after["streamed"][len(before["streamed"]) :],
        **{k: after[k] - before[k] for k in ("send_kv_chunk", "release_kv_cache", "sender_abort")},
        "ignored": after == before,
    }


def _grammar(p: WiredPrefill) -> dict[str, Any]:
    rejected = p.kit.intended_failure("the grammar rejects the sampled token", ValueError)

    def accept_token(token: int) -> None:
        raise rejected(f"token {token} is not allowed here")

    req = p.prefilled("grammar")
    req.grammar = p.kit.fake("grammar", accept_token=p.kit.recorder("grammar.accept_token", side_effect=accept_token))
    p.result(req)
    return p.seen(req, "inflight", "send_kv_chunk", "radix_insert", "release_without_insert", "streamed", "retired") | {
        "output_tokens": len(req.output_ids)
    }


def _mid_last(p: WiredPrefill) -> dict[str, Any]:
    # Abort stopped the chunking: no next chunk was launched after [0, CHUNK).
    req = p.middle_chunk("mid-last", start=0, end=CHUNK)
    abort_while_running(req)
    p.result(req)
    seen = p.seen(req, *RETIREMENT, "retired", "streamed", "send_kv_chunk", "inflight")
    return seen | {"pending_chunk_cleared": not p.counts(req)["pending_chunk"]}


def _mid_still(p: WiredPrefill) -> dict[str, Any]:
    # The final chunk [CHUNK, PROMPT) was launched before the abort and is still in flight.
    req = p.middle_chunk("mid-still", start=CHUNK, end=PROMPT)
    abort_while_running(req)
    p.result(req)
    middle = p.counts(req)
    p.result(req)  # the final chunk's result
    return {
        "pending_chunk_cleared": not middle["pending_chunk"],
        "release_kv_cache": middle["release_kv_cache"],
        "retired": middle["retired"],
        "final_retired": req.finished(),
    }


def _mid_pending(p: WiredPrefill) -> dict[str, Any]:
    req = p.middle_chunk("mid-pending", start=0, end=CHUNK, pending_bootstrap=True)
    abort_while_running(req)
    p.result(req)
    return p.seen(req, "requeued", "radix_insert", "release_without_insert", "sender_abort", "retired", "streamed")


def _yielded(p: WiredPrefill) -> dict[str, Any]:
    req = p.middle_chunk("yielded", start=0, end=CHUNK, pending_bootstrap=True)
    p.result(req)
    return p.seen(req, "requeued", "retired", "streamed")


def _sender_fails(p: WiredPrefill) -> dict[str, Any]:
    unreachable = p.kit.intended_failure("the KV transport cannot deliver the abort")
    req = p.prefilled("sender-fails")

    def abort() -> None:
        raise unreachable("prefill peer unreachable")

    p.sender_abort[req.rid].side_effect = p.kit.guard(abort, "sender.abort")
    p.kit.allow_log(re.escape(f"Failed to notify KV sender of abort for {req.rid}"))
    abort_while_running(req)
    try:
        p.result(req)
        escaped = False
    except unreachable:
        escaped = True
    return p.seen(req, "release_kv_cache", "release_without_insert", "metadata_freed", "retired", "streamed") | {
        "escaped": escaped
    }


SCENARIOS: tuple[tuple[str, Callable[[WiredPrefill], dict[str, Any]]], ...] = (
    ("aborted", lambda p: _final(p, "aborted", aborted=True)),
    ("normal", lambda p: _final(p, "normal", aborted=False)),
    ("final_pending", _final_pending),
    ("delayed", lambda p: _twice(p, "delayed", aborted=True)),
    ("duplicate", lambda p: _twice(p, "duplicate", aborted=False)),
    ("grammar", _grammar),
    ("mid_last", _mid_last),
    ("mid_still", _mid_still),
    ("mid_pending", _mid_pending),
    ("yielded", _yielded),
    ("sender_fails", _sender_fails),
)


def observe(kit: Kit) -> dict[str, Any]:
    MACHINERY.require(kit)
    ensure_runtime()
    fields: dict[str, Any] = {}
    for name, body in SCENARIOS:
        fields.update(_scenario(kit, name, body))
    return fields
