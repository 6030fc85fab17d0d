"""#43719 (a) on NIXL -- a room whose writes never settled is never acked as drained.

Scenario: a prefill rank's real ``NixlKVManager.transfer_worker`` writes a room to
decode (deferred decode KV release on). Decode aborts the request while a write is
posted: its ABORT reaches the real bootstrap thread, which marks the room Failed and
registers decode as the target of the drain ack, held while the room's chunk is
counted as outstanding. Then NIXL cannot prove the write is over: the handle's state
cannot be read (``unsettled``), or one handle reports ERR while its sibling is still
writing past the worker's settle deadline (``settle_timeout``). Every release leaves
such a room to decode's timeout -- no status, no ack, the chunk still counted -- and
the outcomes below are what happens next. An ack tells decode the pages are safe to
reuse while the unsettled write may still land in them.

Observations (acks are ABORT_ACKs sent to decode):

- ``next_chunk.acks``: the room's next chunk (already queued) reaches the worker,
  which skips it because the room is Failed, dropping the room's outstanding count;
- ``late_abort.acks``: one more ABORT for the room after that;
- ``cleared.acks``: the scheduler cleared the sender instead, then the queued chunk
  is skipped as belonging to an unknown room, then one more ABORT comes: is it acked?
  (What the skip itself sends is not a field: 0.5.22 acks there where no poison
  stops it, 0.5.21 never does, so it reads the same on base and head and differs
  only on a head without the poison.)
- ``reused.acks``: after a settle timeout the room's next request (a new lifecycle)
  is aborted during a write that succeeds: is its drain acked?

Before the fix (<= 0.5.21) the skip drops the count the unsettled chunk held, and the
ack follows at once (``next_chunk``) or at the next ABORT (``late_abort``, ``cleared``),
while the write may still be landing; the count of a room whose last chunk never
settled is never dropped, so the room's next request is never acked (``reused``).
From 0.5.22 the worker poisons the room (``poison_deferred_ack_room``): no ack until
the room's next lifecycle, which clears the poison and the stale count.

Controls (equal on both sides): a write during which decode aborts and that succeeds
acks the drain once (``succeeded.acks``); the unsettled failure itself acks nothing
(``unsettled.acks``, ``settle_timeout.acks``), nor does a second ABORT or an ABORT
after the clear while the chunk is still counted (``second_abort.acks``,
``after_clear.acks``); a skipped chunk posts no write (``next_chunk.writes``).

Forced and reported: the deferred-release switch (default off up to 0.5.20), and the
settle deadline ``NIXL_ERR_SETTLE_TIMEOUT_S`` (5 s by default from 0.5.20; 0.5.19
raises at the first ERR and has none), shortened to keep the scenario short; the
branch the worker takes does not depend on it.

Not covered: the acks 0.5.22 adds where the worker skips a chunk of a cleared room or
of a room whose transfer metadata is gone. A skipped chunk is counted only if it was
counted before and put back (the staging path for a different decode TP size re-enqueues
a counted chunk): without staging the count at a skip is the unsettled chunk's, where
the poison withholds the ack anyway.

Honesty: the worker catches every exception and, from 0.5.22, poisons the room while
doing so -- the behaviour under test. The agent and the write fakes are strict and
guarded, and every exception the worker caught (and logged) must be
the staged unreadable state or SGLang's own raise about the staged states, or the
probe errs. The rank's bookkeeping -- ack targets, poisoned rooms, outstanding counts --
is the build's own, made by its constructor; the probe reads none of it.
"""

from __future__ import annotations

from typing import Any

from difflab.probe.kit import Kit
from harness.nixl import (
    UNREADABLE,
    NixlPrefillRank,
    Write,
    build_prefill_rank,
    observe_scenarios,
    settle_deadline,
)

SETTLE_DEADLINE_S = 0.05

# ---------------------------------------------------------------------------
# Version adaptations, by feature:
#   AbortNotification with a generation (0.5.22): harness.nixl.abort_from_decode
#   the worker's settle wait and its deadline (0.5.20; 0.5.19 raises at the first ERR):
#     harness.nixl.settle_deadline forces the deadline only where the build has one
#   the staged unreadable state goes straight to the worker's except clause (0.5.19) or is
#     turned into the worker's own "left a handle running" raise (0.5.20+): either is accepted
#     by harness.nixl, which refuses any other exception the worker caught
# ---------------------------------------------------------------------------


# --- scenario steps ------------------------------------------------------------------
def _late_acks(rank: NixlPrefillRank) -> int:
    """ABORT_ACKs for one more ABORT of the room."""
    start = rank.sent_so_far()
    rank.abort()
    return rank.acks(since=start)


def _unsettled_room(kit: Kit, room: int) -> NixlPrefillRank:
    """A room whose first (not last) chunk's KV write is posted, decode aborts, and its state cannot be read."""
    rank = build_prefill_rank(kit, room=room)
    rank.kv_write = Write(UNREADABLE, during=rank.abort)
    rank.run_worker(rank.chunk(last=False))
    rank.kv_write = Write()
    return rank


# --- scenarios ----------------------------------------------------------------------------
def succeeded(kit: Kit) -> dict[str, Any]:
    """Control: ABORT during a KV write that succeeds -> the drain is acked once."""
    rank = build_prefill_rank(kit, room=43101)
    rank.kv_write = Write("DONE", during=rank.abort)
    rank.run_worker(rank.chunk(last=False))
    return {"succeeded.acks": rank.acks()}


def unsettled(kit: Kit) -> dict[str, Any]:
    """Unsettled first chunk; then the room's queued last chunk is skipped; then one more ABORT."""
    rank = _unsettled_room(kit, 43102)
    fields: dict[str, Any] = {"unsettled.acks": rank.acks()}
    start, writes = rank.sent_so_far(), rank.send_kvcache.count
    rank.run_worker(rank.chunk(last=True))
    fields["next_chunk.acks"] = rank.acks(since=start)
    fields["next_chunk.writes"] = rank.send_kvcache.count - writes
    fields["late_abort.acks"] = _late_acks(rank)
    return fields


def cleared(kit: Kit) -> dict[str, Any]:
    """Unsettled first chunk; the scheduler clears the sender; the queued chunk is skipped; one more ABORT."""
    rank = _unsettled_room(kit, 43103)
    rank.clear_sender()
    rank.run_worker(rank.chunk(last=True))
    return {"cleared.acks": _late_acks(rank)}


def settle_timeout(kit: Kit) -> dict[str, Any]:
    """Last chunk: the KV write still running, the aux write ERR; decode aborts meanwhile. Then the room is reused."""
    rank = build_prefill_rank(kit, room=43104)
    rank.kv_write = Write("PROC", during=rank.abort)
    rank.aux_write = Write("ERR")
    with settle_deadline(kit, SETTLE_DEADLINE_S):
        rank.run_worker(rank.chunk(last=True))
    fields: dict[str, Any] = {"settle_timeout.acks": rank.acks(), "second_abort.acks": _late_acks(rank)}
    rank.clear_sender()
    fields["after_clear.acks"] = _late_acks(rank)
    rank.open_room()
    start = rank.sent_so_far()
    rank.kv_write, rank.aux_write = Write("DONE", during=rank.abort), Write()
    rank.run_worker(rank.chunk(last=False))
    fields["reused.acks"] = rank.acks(since=start)
    return fields


SCENARIOS = (succeeded, unsettled, cleared, settle_timeout)


def observe(kit: Kit) -> dict[str, Any]:
    return observe_scenarios(kit, SCENARIOS, prefixed=False)
