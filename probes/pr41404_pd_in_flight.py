"""The in-flight write race on the CPU pair: a write that lands after decode gave its pages away.

Same pair as :mod:`pr36988_pd_incident` (real KV memory and queues of both ranks,
the decode server the build's start-up builds, the loopback wire in the prefill rank's
role). Each scenario holds the donor's write on the wire, lets the build decide
what becomes of the donor's decode pages, gives a new request (the victim) what the
allocator hands out, lands the victim's own write, then lands the donor's held write
late -- and the victim's next decode step reads its pages.

- ``abort_in_flight``: the client aborts the donor on decode (``Scheduler.abort_request``)
  while its write is in flight. Without deferred release (the build's default before
  0.5.21) the transfer poll frees the pages at once; with it, they are held until the
  prefill rank acks the drain, which it does once nothing it posted is in flight.
- ``failed_send``: (deferred release forced on, as #41404's own probe sets it, so the
  fixes are judged and not the default) the donor's transfer is reported failed while
  its write is still in flight (a Mooncake batch that timed out and may still be writing). Before #41404 a
  failure decode did not initiate frees the pages at once; with it decode notifies the
  prefill rank and holds them for its ack; whether that rank acks a failed send at
  once is this build's real Mooncake ``transfer_worker``'s answer (#43719(a)).
- ``abort_forced``: ``abort_in_flight`` with deferred release forced on (the transfer
  queue's and the KV manager's switch; the build's defaults are reported beside it).
- ``clean`` (control): the same two requests without abort or failure.

Every scenario runs with the loopback in the role of each back end the build ships
(``mooncake``, ``nixl``, ``mori``; fields ``<backend>:<scenario>.<field>``), its
deferred-release default its real manager class's (a back end without the machinery in
this build -- Mori up to 0.5.21 -- cannot defer: event ``deferral``, and the forced
scenarios are not run there). ``failed_send`` is Mooncake's only.

Fields per scenario: ``leaked``, ``foreign_pages``, ``canary``, ``reused`` (the victim
got some of the donor's pages), ``held`` (the donor's pages were still held when the
victim arrived), ``abort_sent`` (decode's ABORT reached the donor's prefill rank),
``victim_decoding``. The deferred-release switches are the build's own defaults
(event ``defaults``) except in ``abort_forced`` and ``failed_send`` (forced on, reported
with the default); the order of events is the scenario's (event ``ordering``), what
the wire did is event ``loopback``.
"""

from __future__ import annotations

import re
from typing import Any

from difflab.probe.kit import Kit
from harness.decode_kv import deferral_gap
from harness.features import Machinery
from harness.pd_flow import Flow
from harness.pd_pair import Pair, build_pair, memory_event, missing_backend, on_cpu
from harness.pd_search import _failed_send_acks
from harness.pd_sides import wired_decode_side, wired_prefill_side

DECODE_CAPACITY = 32
PROMPT = 8  # two pages each
# The pair plays each back end's role (fields ``<backend>:<scenario>.<field>``). ``failed_send`` runs in
# Mooncake's only: a failed send's drain ack comes from the build's real Mooncake transfer worker.
BACKEND = "mooncake"
BACKENDS = ("mooncake", "nixl", "mori")
SCENARIOS = (  # name, client abort, send reported failed, deferred release forced on, back ends
    ("abort_in_flight", True, False, False, BACKENDS),
    ("abort_forced", True, False, True, BACKENDS),
    ("failed_send", False, True, True, (BACKEND,)),
    ("clean", False, False, False, BACKENDS),
)

MACHINERY = Machinery(
    "decode transfer queue", "sglang.srt.disaggregation.decode", "DecodeTransferQueue.pop_transferred"
)

ORDERING = (
    "the wire holds the donor's write; decode aborts it (or the send is reported failed) with the write in flight",
    "two loop passes (decode queue step, prefill bootstrap, run, in-flight poll), then the victim arrives",
    "the victim's own write lands, one loop pass, then the donor's held write lands late and the victim decodes",
)


def _race(kit: Kit, backend: str, *, abort: bool, fail: bool, force_deferred: bool = False) -> dict[str, Any]:
    pair: Pair = build_pair(kit, backend, reuse_memory=True)
    pair.acks_failed_send = _failed_send_acks(kit, backend) if fail else None
    with (
        on_cpu(pair),
        wired_decode_side(pair, DECODE_CAPACITY, force_deferred=force_deferred) as decode,
        wired_prefill_side(pair) as prefill,
    ):
        flow = Flow(pair, prefill, decode)
        pair.wire.hold = True
        flow.arrive("donor", PROMPT)
        flow.tick()
        donor_write = pair.wire.pending()[0]
        if abort:
            flow.client_abort("donor")
        if fail:
            pair.fail_send(donor_write)
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
        kit.event("loopback", backend=backend, decisions=list(pair.decisions))
        kit.event(
            "defaults",
            backend=backend,
            queue_defers=bool(flow.decode.transfer.enable_deferred_kv_release),
            manager_defers=pair.end.defers,
            failed_send_acks=pair.acks_failed_send,
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
    kit.allow_log(re.escape("Decode transfer failed for request"))
    kit.allow_log(r"^Session decode-session-0 failed\.$")
    kit.event("ordering", steps=list(ORDERING))
    fields: dict[str, Any] = {}
    for backend in BACKENDS:
        missing = missing_backend(backend)
        if missing is not None:
            fields |= kit.backend_not_applicable(backend, missing)
            continue
        cannot_defer = deferral_gap(backend) is not None  # forcing a switch its manager's code never reads
        for name, abort, fail, forced, backends in SCENARIOS:
            if backend in backends and not (forced and cannot_defer):
                observed = _race(kit, backend, abort=abort, fail=fail, force_deferred=forced)
                fields |= kit.on_backend(backend, {f"{name}.{k}": v for k, v in observed.items()})
    return fields
