"""A failed room's pages reused while a write the room posted is still in flight, on the CPU pair.

Same pair as :mod:`pr36988_pd_incident` (real KV memory and queues of both ranks, the
decode server the build's start-up builds on each transport back end, the loopback wire
in the prefill rank's role). The donor's room fails at the
prefill rank -- a prefill fault, not a failed send: the prefill rank concludes the room
Failed and tells decode, while the chunk it already posted is still on the wire. The
prefill rank drains that write before it acks an ABORT (the loopback's rule for every
back end; only a failed *send*'s ack is Mooncake's own answer, see
:mod:`pr41404_pd_in_flight`). Decode meets the failure in its real ``pop_transferred``:

- before #41404 a failure decode did not initiate releases the failed room's pages at
  once (``release_kv_cache``), tells no prefill rank, and the allocator gives them to
  the next request; the late write lands in that request's KV;
- with #41404 decode sends the ABORT (``ensure_abort_notified(force_arm=True)``) and
  holds the pages until the prefill rank's drain ack: the next request gets other pages.

Deferred release is forced on (as #41404's own probe sets it: the fix is judged, not the
default flip of 0.5.21); the build's default is reported beside it (event ``defaults``).

Scenarios, per back end (fields ``<backend>:<scenario>.<field>``):

- ``failed_room_reuse``: the prefill fault with the donor's write in flight, then the
  victim, then the late landing.
- ``failed_room_settled`` (control): the same fault, but the wire reports the write
  failed (it never lands): reusing the pages is safe, and is what both sides do.
- ``aborted_room`` (control): the client aborts the donor on decode instead, with the write
  in flight (a failure decode initiated): held until drained on both sides, so the
  difference is the failure kind, not the hold machinery.

Fields: ``leaked`` (the victim read a page another request wrote, or another request's
marker), ``foreign_pages``, ``canary``, ``reused`` (the victim got some of the failed
room's decode pages), ``held`` (the failed room's pages were still held when the victim
arrived), ``abort_sent`` (decode's ABORT reached the prefill rank), ``victim_decoding``.
A back end without deferred-release machinery in this build (Mori up to 0.5.21) reports
``<backend>:not-applicable`` with the reason.

The order of events is the scenario's (event ``ordering``); what the wire decided --
page order, which write was held and when it landed -- is event ``loopback``.
"""

from __future__ import annotations

import re
from typing import Any

from difflab.probe.kit import Kit
from harness.decode_kv import deferral_gap
from harness.features import Machinery
from harness.pd_flow import Flow
from harness.pd_pair import Pair, build_pair, memory_event, on_cpu
from harness.pd_sides import wired_decode_side, wired_prefill_side

DECODE_CAPACITY = 32
PROMPT = 8  # two pages each
BACKENDS = ("mooncake", "nixl", "mori")

SCENARIOS = (  # name, the donor's write lands late (else the wire fails it), the client aborts (else a prefill fault)
    ("failed_room_reuse", True, False),
    ("failed_room_settled", False, False),
    ("aborted_room", True, True),
)

MACHINERY = Machinery(
    "decode transfer queue", "sglang.srt.disaggregation.decode", "DecodeTransferQueue.pop_transferred"
)

ORDERING = (
    "the wire holds the donor's write; the prefill rank concludes the donor's room Failed with the write in flight",
    "two loop passes (decode queue step, prefill bootstrap, run, in-flight poll), then the victim arrives",
    "the victim's own write lands, one loop pass; the donor's held write then lands late (failed_room_reuse) "
    "or is reported failed (failed_room_settled), and the victim decodes",
)


def _reuse(kit: Kit, backend: str, *, lands: bool, client_abort: bool = False) -> dict[str, Any]:
    pair: Pair = build_pair(kit, backend, reuse_memory=True)
    with (
        on_cpu(pair),
        wired_decode_side(pair, DECODE_CAPACITY, force_deferred=True) as decode,
        wired_prefill_side(pair) as prefill,
    ):
        flow = Flow(pair, prefill, decode)
        pair.wire.hold = True
        flow.arrive("donor", PROMPT)
        flow.tick()
        donor_write = pair.wire.pending()[0]
        if client_abort:
            flow.client_abort("donor")
        else:
            pair.prefill_fault(donor_write.room)
        if not lands:
            pair.wire.fail(donor_write)
        flow.tick()
        flow.tick()
        donor = flow.d_reqs["donor"]
        held = bool(donor.kv.req_pool_idx is not None and donor.kv.holds_kv)
        donor_pages = set(donor_write.dst_pages)
        flow.arrive("victim", PROMPT)
        flow.tick()
        for write in pair.wire.pending():
            if write.writer == "victim":
                pair.wire.land(write)
        flow.tick()
        victim = flow.d_reqs["victim"]
        reused = bool(victim.kv.holds_kv and donor_pages & pair.decode.pages_of(victim))
        if donor_write in pair.wire.pending():
            pair.wire.land(donor_write, late=True)
        reads = flow.attend_all()
        read = next((r for r in reads if r.rid == "victim"), None)
        kit.event("loopback", backend=backend, lands=lands, decisions=list(pair.decisions))
        kit.event(
            "defaults",
            backend=backend,
            queue_defers=bool(flow.decode.transfer.enable_deferred_kv_release),
            manager_defers_by_default=pair.deferred_by_default,
        )
    return {
        "leaked": bool(read and (read.foreign or read.canaries)),
        "foreign_pages": len(read.foreign) if read else 0,
        "canary": bool(read and read.canaries),
        "reused": reused,
        "held": held,
        "victim_decoding": read is not None,
        "abort_sent": int(donor_write.room) in pair.aborted_rooms,
    }


def observe(kit: Kit) -> dict[str, Any]:
    MACHINERY.require(kit)
    memory_event(kit)
    kit.allow_log(re.escape("Decode transfer failed for request"))  # pop_transferred logs each failure
    kit.event("ordering", steps=list(ORDERING))
    fields: dict[str, Any] = {}
    for backend in BACKENDS:
        gap = deferral_gap(backend)
        if gap is not None:
            fields |= kit.backend_not_applicable(backend, gap)
            continue
        for name, lands, client_abort in SCENARIOS:
            observed = _reuse(kit, backend, lands=lands, client_abort=client_abort)
            fields |= kit.on_backend(backend, {f"{name}.{k}": v for k, v in observed.items()})
    return fields
