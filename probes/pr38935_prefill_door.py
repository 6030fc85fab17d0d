"""#38935 at the prefill door: an intake-rejected request must not be admitted to a PD handoff.

Scenario: the tokenizer sends a 1500-token prompt (a real
``TokenizedGenerateReqInput``) to the prefill side the build's own start-up
built (:mod:`harness.server`: its ``run_scheduler_process``, scheduler class,
``init_disaggregation``). It enters where the server's event loop hands it on:
the scheduler's ``process_input_requests`` -> its dispatcher ->
``handle_generate_request``, whose intake validation rejects it with the real
``Req.set_finish_with_abort`` (verdict parked in ``to_finish``, prompt swapped
for a one-token stub, ``finished()`` still False) and dispatches it through
``_add_request_to_queue`` to its bootstrap queue's ``add`` (whatever class the
build's set-up instantiated) -- or wherever the build's intake routes it. On the head the door
retires it through the scheduler's ``retire_unadmitted_request``: its streaming
session is let go, its beam group retired, the cache told, the 400 streamed
(read off the socket to the detokenizer, as the build's output streamer wrote it).

Observations:
- ``rejected``: ``enqueued`` (in the bootstrap queue), ``sender_created`` (a
  KV sender was attached), ``retired`` (``finished()``), ``streamed`` (what its
  client received: one HTTP status per response, ``[]`` for silence),
  ``cache_aborts`` (tree cache told it ended aborted).
- ``rejected_session``: the rejected request belongs to a real streaming
  ``Session`` whose ``create_req`` counted it in flight. ``session_busy`` (the
  session still counts a request in flight, so it refuses the next one: on the
  base it stays so until the handoff unwinds, which a rejected request never
  reaches) and ``session_detached`` (``req.session`` let go).
- ``rejected_group``: the rejected request leads a real ``BeamGroup`` that the
  real ``BeamCoordinator`` counts live (as ``validate_and_init`` leaves it).
  ``group_retired`` and ``live_groups`` (the coordinator's count, the gate of
  its per-forward hooks). PD intake rejects beam requests today
  (``validate_and_init`` refuses beam search when disaggregation is on, before
  it attaches a group, and streams that 400 itself), so this models a state PD
  does not produce yet; the head's ``retire_group`` call is there for it, and a
  port that drops the call is told apart.

Controls, equal on base and head: a ``valid`` request (sent by the tokenizer
the same way) is admitted with a sender; ``session_valid`` (a valid request of a busy streaming session) and
``group_valid`` (a valid beam leader) keep their session and group;
``plain_session`` (a rejected request of a non-streaming session) keeps its
session attached; ``null_mode`` (the over-long prompt sent to a non-PD server)
keeps the rejected stub in its ``waiting_queue``, where the scheduler's own
abort handling ends it; the session, group and re-entering scenarios model
states intake does not build, so they are handed to ``_add_request_to_queue``;
re-entering requests that still own something their queue must release are
enqueued, not retired -- one per clause of the head's predicate: ``preempted``
(``is_retracted``), ``reentering_kv`` (KV row held),
``reentering_mamba`` (Mamba state held), ``reentering_slot`` (metadata slot
held), ``reentering_backup`` (``kv.retraction_backup`` set).

Transfer back ends: every scenario runs on Mooncake (the default), NIXL and
Mori, each side selected through ``ServerArgs`` as
``--disaggregation-transfer-backend`` selects it and creating its own real
sender class; fields read ``<backend>:<field>``, so a door check skipped on one
back end is seen there (``partial``, naming it).

Fakes: only what :mod:`harness.server` fakes (model, GPU, process groups, ZMQ
sockets) and the back end's transfer edges (:mod:`harness.transport`: engine, control
socket, bootstrap HTTP, threads recorded); the KV manager is built by its own constructor.
"""

from __future__ import annotations

import re
from typing import Any

from difflab.probe.kit import Kit
from harness.doors import Door, on_every_backend
from harness.features import Machinery
from harness.requests import INTAKE_REJECTION, abort_while_running, hold_kv, new_req, reject_at_intake
from harness.runtime import ensure_runtime

# The machinery the fix changes: the PD prefill admission queue (absent before PD existed).
MACHINERY = Machinery("PD prefill admission queue", "sglang.srt.disaggregation.prefill", "PrefillBootstrapQueue.add")
DOOR_EFFECTS = ("enqueued", "sender_created", "retired", "streamed", "cache_aborts")


def _admit(door: Door, scenario: str, req: Any) -> dict[str, Any]:
    """Hand ``req`` to the scheduler's dispatch and report what its prefill side did with it."""
    group = req.beam_group
    session = req.session
    beams = door.scheduler.beam_coordinator
    beams._num_live_groups = int(group is not None)  # as validate_and_init counts a group in
    effects = door.admit(req)
    fields = {f"{scenario}.{key}": effects[key] for key in DOOR_EFFECTS}
    if session is not None:
        fields[f"{scenario}.session_busy"] = session._inflight
        fields[f"{scenario}.session_detached"] = req.session is None
    if group is not None:
        fields[f"{scenario}.group_retired"] = group.retired
        fields[f"{scenario}.live_groups"] = beams._num_live_groups
    return fields


def _submitted(door: Door, scenario: str, *, prompt_len: int) -> dict[str, Any]:
    """A request the tokenizer sends: the build's intake builds and validates it, then dispatches it."""
    _, effects = door.submit(scenario, prompt_len=prompt_len)
    return {f"{scenario}.{key}": effects[key] for key in DOOR_EFFECTS}


def _intake(door: Door) -> dict[str, Any]:
    """The over-long prompt and a valid one, as the tokenizer sends them."""
    return {**_submitted(door, "rejected", prompt_len=1500), **_submitted(door, "valid", prompt_len=16)}


def _in_session(req: Any, *, streaming: bool) -> Any:
    """``req`` is the next turn of a session; a streaming session's ``create_req`` marks it in flight."""
    from sglang.srt.session.session_controller import Session

    session = Session(capacity_of_str_len=1 << 16, session_id=f"session-{req.rid}", streaming=streaming)
    session._inflight = streaming  # what create_req does for an accepted streaming turn
    req.session = session
    return req


def _beam_leader(req: Any) -> Any:
    """``req`` leads a real beam group, attached the way ``validate_and_init`` attaches it."""
    from sglang.srt.beam_search.beam_group import BeamGroup

    group = BeamGroup(beam_width=2, max_new_tokens=8, device="cpu")
    group.leader = req
    group.prompt_len = len(req.origin_input_ids)
    req.beam_group = group
    req.skip_radix_cache_insert = True
    return req


def _rejected(kit: Kit, req: Any) -> Any:
    reject_at_intake(kit, req)
    return req


def _reentering(rid: str) -> Any:
    """A request the scheduler already ran, aborted while running ("abort method 3")."""
    req = new_req(rid, prompt_len=16)
    abort_while_running(req)
    return req


def observe(kit: Kit) -> dict[str, Any]:
    MACHINERY.require(kit)
    ensure_runtime()
    kit.allow_log(re.escape(INTAKE_REJECTION))  # the build's intake logs the rejection it parks
    return on_every_backend(kit, lambda backend: _scenarios(kit, backend))


def _scenarios(kit: Kit, backend: str) -> dict[str, Any]:
    with Door(kit, "prefill", backend) as door:
        fields = _prefill(kit, door)
    with Door(kit, "null", backend) as null_door:
        _, null_mode = null_door.submit(f"null-mode-{backend}", prompt_len=1500)
    fields["null_mode.waiting"] = null_mode["waiting"]
    fields["null_mode.retired"] = null_mode["retired"]
    return fields


def _prefill(kit: Kit, door: Door) -> dict[str, Any]:
    fields: dict[str, Any] = _intake(door)

    rejected_session = _in_session(new_req("rejected-session", prompt_len=1500), streaming=True)
    fields.update(_admit(door, "rejected_session", _rejected(kit, rejected_session)))
    fields.update(_admit(door, "session_valid", _in_session(new_req("session-valid"), streaming=True)))
    plain_session = _in_session(new_req("plain-session", prompt_len=1500), streaming=False)
    fields.update(_admit(door, "plain_session", _rejected(kit, plain_session)))

    rejected_group = _beam_leader(new_req("rejected-group", prompt_len=1500))
    fields.update(_admit(door, "rejected_group", _rejected(kit, rejected_group)))
    fields.update(_admit(door, "group_valid", _beam_leader(new_req("group-valid"))))

    preempted = _reentering("preempted")
    preempted.is_retracted = True  # release_req -> reset_for_retract sets it
    fields.update(_admit(door, "preempted", preempted))

    holding_kv = _reentering("reentering-kv")
    hold_kv(holding_kv, 16)  # still holds the KV row of its first run
    fields.update(_admit(door, "reentering_kv", holding_kv))

    holding_mamba = _reentering("reentering-mamba")
    holding_mamba.kv.mamba_pool_idx = _mamba_slot()  # a hybrid model's Mamba state, held
    fields.update(_admit(door, "reentering_mamba", holding_mamba))

    slot = _reentering("reentering-slot")
    slot.metadata_buffer_index = 7  # finalize_bootstrap allocated it before the first run
    fields.update(_admit(door, "reentering_slot", slot))

    backup = _reentering("reentering-backup")
    backup.kv.retraction_backup = object()  # host copy taken when it was retracted
    fields.update(_admit(door, "reentering_backup", backup))
    return fields


def _mamba_slot() -> Any:
    import torch

    return torch.tensor([3])
