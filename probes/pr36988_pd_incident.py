"""The incident itself: can a request decode over KV pages another request wrote?

One prefill rank and one decode rank of the build (:mod:`harness.pd_pair`), each
with SGLang's real KV memory at a tiny size on the CPU (8 pages of 4 tokens;
contents never zeroed), the build's own queue methods on both sides and a
loopback wire that copies page contents exactly as the real sender's page
indices and the real receiver's published destination say.

``incident`` (the published incident, step by step):

1. ``long`` (24 tokens, 6 pages) is admitted at both doors, decode reserves its
   pages (``pop_preallocated``), prefill bootstraps, runs and sends it
   (``process_batch_result_disagg_prefill`` -> ``send_kv_chunk``), decode takes the
   transfer (``pop_transferred``), decodes one step and finishes: its pages go
   back to the real allocator, still holding its KV.
2. ``overlong`` (28 tokens) arrives. Prefill's intake rejects it (the real
   ``Req.set_finish_with_abort``: the prompt becomes the one-token placeholder);
   decode accepts it and reserves pages for the full prompt -- the allocator
   hands back ``long``'s freed pages.
3. Whatever the build's prefill does with the rejected request happens through
   its own door and result step; decode polls its transfer queue; if nothing
   lands, time passes (the lab's clock) until the build's own
   ``SGLANG_DISAGGREGATION_WAITING_TIMEOUT``, and decode polls again.
4. If decode took the transfer, its attention reads every page ``req_to_token``
   maps for the request: the ownership check and the canary check run there.

Fields: ``incident.leaked`` (decode read a page another request wrote),
``incident.foreign_pages``, ``incident.canary`` (the decoded context holds
``long``'s marker), ``incident.handoff_pages`` (pages the prefill sender sent),
``incident.reserved_pages`` (pages decode reserved), ``incident.prefill_admitted``
(the prefill door kept the request), ``incident.client_status`` (the first status
the client gets: prefill's abort when it streamed one, else decode's answer),
``incident.decode_status`` (200 when decode decoded it, its abort status, or
null), ``incident.decode_waited_timeout``. Controls: ``long.*`` (the first
request reads only its own pages on every release), ``incident.reserved_pages``.

Ordering chosen by the lab (named in the observation's ``ordering`` event):
decode reserves before prefill bootstraps; the first request finishes before the
second arrives. What the loopback decided (page order, completion) is the
``loopback`` event. Back end: the loopback stands in for the chosen back end's
sender and receiver; the deferred-release switch is that back end's manager's
own default in this build.
"""

from __future__ import annotations

import re
from typing import Any

from difflab.probe.kit import Kit
from harness.features import Machinery
from harness.pd_flow import Flow
from harness.pd_pair import PAGE, build_pair, memory_event, on_cpu
from harness.pd_sides import wired_decode_side, wired_prefill_side

LONG = 24
OVERLONG = 28
PREFILL_LIMIT = 26  # prefill's intake bound: ``long`` fits, ``overlong`` does not
DECODE_CAPACITY = 32
REJECTION = f"Input length ({OVERLONG} tokens) exceeds the maximum allowed length ({PREFILL_LIMIT} tokens)."

MACHINERY = Machinery(
    "disaggregated prefill result processing",
    "sglang.srt.disaggregation.prefill",
    "SchedulerDisaggregationPrefillMixin.process_batch_result_disagg_prefill",
)

ORDERING = (
    "both doors admit a request before decode pre-allocates, prefill bootstraps after decode published its pages",
    "long finishes and frees its decode pages before overlong arrives",
    "when nothing lands, the clock jumps by the build's waiting timeout before the next decode poll",
)


def _request(flow: Flow, rid: str, prompt: int, *, rejection: str | None = None) -> dict[str, Any]:
    """One request through both sides, each step the build's own; the same fields for every request."""
    pair = flow.pair
    flow.arrive(rid, prompt, reject_on_prefill=rejection)
    admitted = flow.p_reqs[rid] in flow.prefill.queue.queue
    flow.preallocate()
    decode_req = flow.d_reqs[rid]
    reserved = len({s // PAGE for s in pair.decode.row(decode_req, prompt)}) if decode_req.kv.req_pool_idx else 0
    if rid in flow.bootstrap():
        flow.prefill_run(rid)
    transferred = rid in flow.poll_transfers()
    waited = False
    if not transferred and decode_req.finished_reason is None:
        flow.wait_out(pair.waiting_timeout_s)
        waited = True
        transferred = rid in flow.poll_transfers()
    read = flow.decode_step(rid) if transferred else None
    if transferred:
        flow.finish(rid)
    decode_status = flow.decode_outcome(rid)
    prefill_streamed = flow.status("prefill", rid)
    return {
        f"{rid}.leaked": bool(read and read.foreign),
        f"{rid}.foreign_pages": len(read.foreign) if read else 0,
        f"{rid}.canary": bool(read and read.canaries),
        f"{rid}.pages": len(read.pages) if read else 0,
        f"{rid}.handoff_pages": sum(len(w.src_pages) for w in pair.wire.posted if w.writer == rid),
        f"{rid}.reserved_pages": reserved,
        f"{rid}.prefill_admitted": admitted,
        f"{rid}.client_status": next((s for s in prefill_streamed if s is not None), decode_status),
        f"{rid}.decode_status": decode_status,
        f"{rid}.decode_waited_timeout": waited and pair.end.timed_out(int(decode_req.bootstrap_room), decode_req),
    }


def _incident(kit: Kit, backend: str) -> dict[str, Any]:
    pair = build_pair(kit, backend, reuse_memory=True)
    with (
        on_cpu(pair),
        wired_decode_side(pair, DECODE_CAPACITY) as decode,
        wired_prefill_side(pair) as prefill,
    ):
        flow = Flow(pair, prefill, decode)
        fields = _request(flow, "long", LONG)
        kit.allow_log(re.escape("Decode transfer failed for request"))
        fields |= {
            k.replace("overlong.", "incident."): v
            for k, v in _request(flow, "overlong", OVERLONG, rejection=REJECTION).items()
        }
        kit.event("ordering", steps=list(ORDERING))
        kit.event("loopback", backend=backend, decisions=list(pair.decisions))
        kit.event("leaks", found=[vars(leak) for leak in flow.leaks])
        kit.event(
            "waiting_timeout",
            seconds=pair.waiting_timeout_s,
            source="SGLANG_DISAGGREGATION_WAITING_TIMEOUT, as the decode KV manager read it",
        )
    return fields


def observe(kit: Kit) -> dict[str, Any]:
    MACHINERY.require(kit)
    memory_event(kit)
    return _incident(kit, "mooncake")
