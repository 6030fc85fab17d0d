"""#40645 on NIXL -- the sender's clear() while a write is in flight keeps the drain ack target.

Scenario: a NIXL prefill rank's real ``NixlKVManager.transfer_worker`` writes a room's KV
(deferred decode KV release on). While the KV write is posted decode's ABORT reaches the
real bootstrap thread (the room is still known: it is marked Failed and decode is
registered for the drain ack), and then the scheduler is done with the request: the real
sender's ``clear()`` forgets the room. The write then succeeds.

- ``cleared_in_flight.acks``: is the drain acked once the write settles?

Up to 0.5.20 the shared ``CommonKVSender.clear`` dropped the room's ack target even while a
write was in flight, so no drain ack was ever sent and decode fell back to its release
timeout. From 0.5.21 it leaves the target to the worker until the write drains. The same
shared hunk as fix 40645's ``clear-keeps-target`` on Mooncake (``pr40645_drain_ack_peers``),
here on NIXL's own worker and bootstrap thread.

Controls (equal on every release): no ack leaves while the write is posted
(``cleared_in_flight.acks_while_writing``); the same ABORT without the clear is acked once
the write settles (``aborted.acks``); an ABORT for a room written and then cleared is acked
at once (``idle_after_clear.acks``); every scenario posted its KV write (``*.writes``).

NIXL's prefill side only (fields ``nixl:<field>``). The ack fan-out to several decode peers
of one room (fix 40645's ``ack-fanout``) is not driven on NIXL: the harness registers one
decode agent.
"""

from __future__ import annotations

from typing import Any

from difflab.probe.kit import Kit
from harness.nixl import build_prefill_rank, observe_scenarios

# ---------------------------------------------------------------------------
# Version adaptations, by feature:
#   decode's ABORT on the wire: harness.nixl.abort_from_decode
#   <= 0.5.18 has no drain ack at all (harness.nixl.DRAIN_ACK: not applicable there)
# ---------------------------------------------------------------------------


# --- scenarios -------------------------------------------------------------------
def cleared_in_flight(kit: Kit) -> dict[str, Any]:
    """The ABORT, then the sender's clear(), while the KV write is posted: acked once it settles?"""
    rank = build_prefill_rank(kit, room=40661)
    seen = rank.write_room(rank.abort, rank.clear_sender)
    return {**seen, "acks": rank.acks()}


def aborted(kit: Kit) -> dict[str, Any]:
    """Control: the ABORT while the KV write is posted, no clear -> acked once it settles."""
    rank = build_prefill_rank(kit, room=40662)
    seen = rank.write_room(rank.abort)
    return {**seen, "acks": rank.acks()}


def idle_after_clear(kit: Kit) -> dict[str, Any]:
    """Control: the room written and cleared; an ABORT for it now is acked at once (nothing counted)."""
    rank = build_prefill_rank(kit, room=40663)
    seen = rank.write_room()
    rank.clear_sender()
    rank.abort()
    return {**seen, "acks": rank.acks()}


SCENARIOS = (cleared_in_flight, aborted, idle_after_clear)


def observe(kit: Kit) -> dict[str, Any]:
    return observe_scenarios(kit, SCENARIOS)
