"""#38935 at the decode door: an intake-rejected request must not get a KV receiver.

Scenario: a request rejected at intake by the real ``Req.set_finish_with_abort``
(``to_finish`` set, one-token stub, ``finished()`` False) reaches the real
``DecodePreallocQueue.add``. On the base it is handed a KV receiver and waits
for a prefill that will never send its prompt (the decode worker sat on it
until ``SGLANG_DISAGGREGATION_WAITING_TIMEOUT``); on the head the door retires
it through the real ``Scheduler.retire_unadmitted_request`` with its 400.
The queue runs its real capacity check, real ``_create_receiver_and_enqueue``
(spied on; the 'fake' transfer backend's real ``FakeKVReceiver``) and real
prefill-rank lookup (nothing cached, so the request waits in ``pending_reqs``).

Observations per scenario: ``receiver_created`` (``_create_receiver_and_enqueue``
called), ``pending`` (in ``pending_reqs``), ``retracted_queue`` (in
``retracted_queue``), ``retired`` (``finished()``), ``streamed`` (what its
client received: one HTTP status per response, ``[]`` for silence), ``cache_aborts``.

Controls, equal on base and head: a ``valid`` request gets a receiver and
waits; requests the caller declares as re-entering are never retired even
though they carry a pending abort: ``retracted`` (host KV backup held) and
``retracted_short`` (no backup: ``seqlen <= 1``) go to ``retracted_queue``,
``rebootstrap`` gets a receiver; ``preempted`` (``is_retracted`` set, no flag)
gets a receiver.

Fakes: the KV manager (transport), the KV pool and its allocator, the tree
cache and beam coordinator (GPU memory), the output streamer (ZMQ).
"""

from __future__ import annotations

from typing import Any

from difflab.probe.kit import Kit
from harness.doors import decode_door
from harness.features import Machinery
from harness.requests import abort_while_running, new_req, reject_at_intake
from harness.runtime import ensure_runtime
from harness.scheduler import retirement_fields

# The machinery the fix changes: the PD decode admission queue (absent before PD existed).
MACHINERY = Machinery("PD decode admission queue", "sglang.srt.disaggregation.decode", "DecodePreallocQueue.add")


def _admit(kit: Kit, scenario: str, req: Any, **flags: bool) -> dict[str, Any]:
    """Push ``req`` through the real door (with the caller's re-entry flags) and report."""
    from sglang.srt.disaggregation.decode import DecodePreallocQueue

    queue, seen = decode_door(kit)
    DecodePreallocQueue.add(queue, req, **flags)
    return {
        f"{scenario}.receiver_created": seen["create"].count > 0,
        f"{scenario}.pending": any(d.req is req for d in queue.pending_reqs),
        f"{scenario}.retracted_queue": req in queue.retracted_queue,
        **retirement_fields(scenario, req, seen),
    }


def _retracted(rid: str, *, backup: bool) -> Any:
    """What retract_decode leaves: KV row freed, a pending abort, maybe a host backup."""
    req = new_req(rid, prompt_len=16)
    abort_while_running(req)
    req.kv.retraction_backup = object() if backup else None
    return req


def observe(kit: Kit) -> dict[str, Any]:
    MACHINERY.require(kit)
    ensure_runtime()
    fields: dict[str, Any] = {}

    rejected = new_req("rejected", prompt_len=1500)
    reject_at_intake(kit, rejected)
    fields.update(_admit(kit, "rejected", rejected))

    fields.update(_admit(kit, "valid", new_req("valid", prompt_len=16)))
    fields.update(_admit(kit, "retracted", _retracted("retracted", backup=True), is_retracted=True))
    fields.update(_admit(kit, "retracted_short", _retracted("retracted-short", backup=False), is_retracted=True))
    fields.update(_admit(kit, "rebootstrap", _retracted("rebootstrap", backup=False), is_rebootstrap=True))

    preempted = _retracted("preempted", backup=False)
    preempted.is_retracted = True  # release_req -> reset_for_retract sets it; the caller passes no flag
    fields.update(_admit(kit, "preempted", preempted))
    return fields
