"""#38935 at the prefill door: an intake-rejected request must not be admitted to a PD handoff.

Scenario: intake validation rejected a request with the real
``Req.set_finish_with_abort`` (verdict parked in ``to_finish``, prompt swapped
for a one-token stub, ``finished()`` still False) and the scheduler hands it
to the real ``PrefillBootstrapQueue.add`` (real ``create_sender``, real
capacity check, real ``FakeKVSender`` of the 'fake' transfer backend). On the
head the door retires it through the real ``Scheduler.retire_unadmitted_request``.

Observations for ``rejected``: ``enqueued`` (in the bootstrap queue),
``sender_created`` (a KV sender was attached), ``retired`` (``finished()``),
``streamed`` (what its client received: one HTTP status per response, ``[]``
for silence), ``cache_aborts`` (tree cache told it ended aborted).

Controls, equal on base and head: a ``valid`` request is admitted with a
sender; re-entering requests that still own something their queue must
release are enqueued, not retired: ``reentering_slot`` (metadata slot held),
``reentering_backup`` (``kv.retraction_backup`` set), ``preempted``
(``is_retracted``).

Fakes: the KV manager (transport), the output streamer (ZMQ to the
tokenizer), the tree cache and the beam coordinator (GPU memory).
"""

from __future__ import annotations

import inspect
from typing import Any

from difflab.probe.kit import Kit
from harness.requests import abort_while_running, new_req, reject_at_intake
from harness.runtime import bare, ensure_runtime
from harness.scheduler import bare_scheduler, retirement_fields

NUM_KV_HEADS = 8
MAX_TOTAL_TOKENS = 1024  # below the rejected prompt (1500), above its one-token stub


# ---------------------------------------------------------------------------
# Version adaptations: what the door reads off its queue, by feature.
#   capacity bound: max_total_num_tokens (<= 0.5.22); max_input_len from the module's
#       max_bootstrap_input_len (0.5.23)
#   tp_rank / pp_rank: create_sender hands them to senders whose constructor takes
#       dest_tp_ranks (<= 0.5.21)
# ---------------------------------------------------------------------------
def _queue_reads() -> dict[str, Any]:
    from sglang.srt.disaggregation import prefill
    from sglang.srt.disaggregation.base.conn import BaseKVSender

    reads: dict[str, Any] = {}
    if hasattr(prefill, "max_bootstrap_input_len"):
        reads["max_input_len"] = prefill.max_bootstrap_input_len(capacity=MAX_TOTAL_TOKENS, page_size=1, shard_size=1)
    else:
        reads["max_total_num_tokens"] = MAX_TOTAL_TOKENS
    if "dest_tp_ranks" in inspect.signature(BaseKVSender.__init__).parameters:
        reads.update(tp_rank=0, pp_rank=0)
    return reads


def _door(kit: Kit) -> tuple[Any, dict[str, Any]]:
    """A real PrefillBootstrapQueue (no constructor) wired to a real, bare Scheduler."""
    from sglang.srt.disaggregation.prefill import PrefillBootstrapQueue
    from sglang.srt.disaggregation.utils import TransferBackend

    scheduler, seen = bare_scheduler(kit)
    queue = bare(
        kit,
        PrefillBootstrapQueue,
        scheduler=scheduler,
        queue=[],
        transfer_backend=TransferBackend.FAKE,
        kv_manager=kit.fake("kv_manager"),
        bootstrap_port=8998,
        **_queue_reads(),
    )
    return queue, seen


def _admit(kit: Kit, scenario: str, req: Any) -> dict[str, Any]:
    """Push ``req`` through the real door and report what happened to it."""
    from sglang.srt.disaggregation.fake.conn import FakeKVSender
    from sglang.srt.disaggregation.prefill import PrefillBootstrapQueue

    queue, seen = _door(kit)
    PrefillBootstrapQueue.add(queue, req, NUM_KV_HEADS)
    return {
        f"{scenario}.enqueued": req in queue.queue,
        f"{scenario}.sender_created": isinstance(getattr(req, "disagg_kv_sender", None), FakeKVSender),
        **retirement_fields(scenario, req, seen),
    }


def _reentering(rid: str) -> Any:
    """A request the scheduler already ran, aborted while running ("abort method 3")."""
    req = new_req(rid, prompt_len=16)
    abort_while_running(req)
    return req


def observe(kit: Kit) -> dict[str, Any]:
    ensure_runtime()
    fields: dict[str, Any] = {}

    rejected = new_req("rejected", prompt_len=1500)
    reject_at_intake(kit, rejected)
    fields.update(_admit(kit, "rejected", rejected))

    fields.update(_admit(kit, "valid", new_req("valid", prompt_len=16)))

    slot = _reentering("reentering-slot")
    slot.metadata_buffer_index = 7  # finalize_bootstrap allocated it before the first run
    fields.update(_admit(kit, "reentering_slot", slot))

    backup = _reentering("reentering-backup")
    backup.kv.retraction_backup = object()  # host copy taken when it was retracted
    fields.update(_admit(kit, "reentering_backup", backup))

    preempted = _reentering("preempted")
    preempted.is_retracted = True  # release_req -> reset_for_retract sets it
    fields.update(_admit(kit, "preempted", preempted))
    return fields
