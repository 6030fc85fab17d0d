"""#40645 on NIXL -- an ABORT for a cleared room still being written registers its drain ack.

Scenario: a NIXL prefill rank's real ``NixlKVManager.transfer_worker`` writes a room's KV
(deferred decode KV release on). While the KV write is posted the scheduler is done with
the request -- the real sender's ``clear()`` forgets the room -- and then decode's ABORT
for it reaches the real bootstrap thread: a room no longer known whose write is still
counted as outstanding. The write then succeeds. Decode holds the room's pages until it
gets the drain ack, or until its release timeout (30 s by default) passes.

- ``abort_after_clear.acks``: is the drain acked once the write settles?

Up to 0.5.21 ``NixlKVManager._handle_abort_notification`` acks a concluded or unknown room
only when nothing is counted for it and otherwise registers nothing, so no ack follows the
write and decode falls back to its timeout (a liveness fault, not a page overwrite: the
pages stay held). From 0.5.22 (``_handle_deferred_abort_ack``) the ABORT registers decode
as the ack target whatever the room's status, and the worker acks once the write drains.
The NIXL counterpart of fix 40645's ``abort-while-writing-registers`` (Mooncake, 0.5.21).

Controls (equal on every release): no ack leaves while the write is posted
(``abort_after_clear.acks_while_writing``); an ABORT during a write of a room still known
is acked once the write settles (``aborted.acks``); the ABORT of a room written and
concluded Success is acked at once (``settled.acks``), and so is the ABORT of a room
written and then cleared (``idle_after_clear.acks``): nothing is counted for either.
Every scenario posted its KV write (``*.writes``).

Not a control: the ABORT *then* ``clear()`` while the write is posted. NIXL's sender kept
the target through ``clear()`` only from 0.5.21 (fix 40645's ``clear-keeps-target``, shared
``CommonKVSender.clear``), so that scenario differs between 0.5.20 and 0.5.21 and belongs to
fix 40645 (``pr40645_nixl_clear_in_flight``), not to this one.

Honesty: the rank's bookkeeping (ack targets, outstanding counts, statuses) is the build's
own, made by its constructor; the probe reads only what was sent to decode and how many
writes were posted.
"""

from __future__ import annotations

from typing import Any

from difflab.probe.kit import Kit
from harness.nixl import build_prefill_rank, observe_scenarios

# ---------------------------------------------------------------------------
# Version adaptations, by feature:
#   decode's ABORT on the wire: harness.nixl.abort_from_decode (AbortNotification with a
#     generation from 0.5.22; four frames before)
#   the ABORT handler: inline in _handle_abort_notification (<= 0.5.21), its deferred part in
#     _handle_deferred_abort_ack (0.5.22): both reached through the build's bootstrap thread
# ---------------------------------------------------------------------------


# --- scenarios -------------------------------------------------------------------
def abort_after_clear(kit: Kit) -> dict[str, Any]:
    """The sender's clear(), then the ABORT, while the KV write is posted: acked once it settles?"""
    rank = build_prefill_rank(kit, room=40651)
    seen = rank.write_room(rank.clear_sender, rank.abort)
    return {**seen, "acks": rank.acks()}


def aborted(kit: Kit) -> dict[str, Any]:
    """Control: the ABORT while the KV write is posted, the room still known -> acked once it settles."""
    rank = build_prefill_rank(kit, room=40652)
    seen = rank.write_room(rank.abort)
    return {**seen, "acks": rank.acks()}


def settled(kit: Kit) -> dict[str, Any]:
    """Control: the room written and concluded Success; a lone ABORT for it now is acked at once."""
    rank = build_prefill_rank(kit, room=40653)
    seen = rank.write_room()
    rank.abort()
    return {**seen, "acks": rank.acks()}


def idle_after_clear(kit: Kit) -> dict[str, Any]:
    """Control: the room written and cleared; an ABORT for it now is acked at once (nothing counted)."""
    rank = build_prefill_rank(kit, room=40654)
    seen = rank.write_room()
    rank.clear_sender()
    rank.abort()
    return {**seen, "acks": rank.acks()}


SCENARIOS = (abort_after_clear, aborted, settled, idle_after_clear)


def observe(kit: Kit) -> dict[str, Any]:
    return observe_scenarios(kit, SCENARIOS)
