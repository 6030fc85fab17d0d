"""#38935 at the decode door: an intake-rejected request must not get a KV receiver.

Scenario: the tokenizer sends a 1500-token prompt (a real
``TokenizedGenerateReqInput``) to the decode side the build's own start-up
built (:mod:`harness.server`); it enters through the scheduler's
``process_input_requests`` -> ``handle_generate_request``, whose intake
validation rejects it with the real ``Req.set_finish_with_abort``
(``to_finish`` set, one-token stub, ``finished()`` False) and dispatches it
through ``_add_request_to_queue`` -> its prealloc queue's ``add``. On the
base it is handed a KV receiver and waits for a prefill that will never send
its prompt (the decode worker sat on it until
``SGLANG_DISAGGREGATION_WAITING_TIMEOUT``); on the head the door retires it
through the scheduler's ``retire_unadmitted_request`` with its 400.
The queue runs its real capacity check, ``_create_receiver_and_enqueue`` (the
back end's real receiver class) and prefill-rank lookup (no prefill peer
registered yet, so the request waits in ``pending_reqs``).

Observations per scenario: ``receiver_created`` (a ``DecodeRequest`` for it in
the prealloc queue), ``pending`` (in ``pending_reqs``), ``retracted_queue`` (in
``retracted_queue``), ``retired`` (``finished()``), ``streamed`` (what its
client received: one HTTP status per response, ``[]`` for silence), ``cache_aborts``.

Controls, equal on base and head: a ``valid`` request gets a receiver and
waits; requests the caller declares as re-entering are never retired even
though they carry a pending abort: ``retracted`` (host KV backup held) and
``retracted_short`` (no backup: ``seqlen <= 1``), handed over by the dispatch
with ``is_retracted``, go to ``retracted_queue``; ``rebootstrap``, staged and
resumed by the queue's own ``hold_rebootstrap`` / ``enqueue_held_rebootstrap``,
gets a receiver; ``preempted`` (``is_retracted`` set, no flag)
gets a receiver.

Transfer back ends: every scenario runs on Mooncake (the default), NIXL and
Mori, each side selected through ``ServerArgs`` and building its own real
receiver class; fields read ``<backend>:<field>``.

Fakes: only what :mod:`harness.server` fakes (model, GPU, process groups, ZMQ
sockets) and the back end's transfer edges (:mod:`harness.transport`: engine, control
socket, bootstrap HTTP, threads recorded); the KV manager is built by its own constructor,
which starts it with an empty prefill-peer table.
"""

from __future__ import annotations

import re
from typing import Any

from difflab.probe.kit import Kit
from harness.doors import Door, on_every_backend
from harness.features import Machinery
from harness.requests import INTAKE_REJECTION, abort_while_running, new_req
from harness.runtime import ensure_runtime

# The machinery the fix changes: the PD decode admission queue (absent before PD existed).
MACHINERY = Machinery("PD decode admission queue", "sglang.srt.disaggregation.decode", "DecodePreallocQueue.add")


def _report(scenario: str, effects: dict[str, Any]) -> dict[str, Any]:
    keys = ("receiver_created", "pending", "retracted_queue", "retired", "streamed", "cache_aborts")
    return {f"{scenario}.{key}": effects[key] for key in keys}


def _intake(door: Door) -> dict[str, Any]:
    """The over-long prompt and a valid one, as the tokenizer sends them."""
    return {
        **_report("rejected", door.submit("rejected", prompt_len=1500)[1]),
        **_report("valid", door.submit("valid", prompt_len=16)[1]),
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
    kit.allow_log(re.escape(INTAKE_REJECTION))  # the build's intake logs the rejection it parks
    return on_every_backend(kit, lambda backend: _on(kit, backend))


def _on(kit: Kit, backend: str) -> dict[str, Any]:
    with Door(kit, "decode", backend) as door:
        return _scenarios(door)


def _scenarios(door: Door) -> dict[str, Any]:
    fields: dict[str, Any] = _intake(door)
    fields.update(_report("retracted", door.admit(_retracted("retracted", backup=True), retracted=True)))
    fields.update(_report("retracted_short", door.admit(_retracted("retracted-short", backup=False), retracted=True)))
    fields.update(_report("rebootstrap", door.rebootstrap(_retracted("rebootstrap", backup=False))))

    preempted = _retracted("preempted", backup=False)
    preempted.is_retracted = True  # release_req -> reset_for_retract sets it; the caller passes no flag
    fields.update(_report("preempted", door.admit(preempted)))
    return fields
