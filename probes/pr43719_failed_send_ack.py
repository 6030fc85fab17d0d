"""#43719 (a) -- a failed Mooncake send never acks the drain of an aborted room.

Scenario: a prefill rank's real ``MooncakeKVManager.transfer_worker`` writes a
room to decode (deferred decode KV release on) in its three RDMA writes: the
KV pages, then on the last chunk the state buffers of a hybrid model and the
aux/metadata slot. Decode may abort the request while one is in flight: its
ABORT reaches the real bootstrap thread, which marks the room Failed and
registers decode as the target of the drain ack (deferred until the in-flight
write settles). Then the write fails -- returns non-zero, as Mooncake's
``batch_transfer_sync`` does on its timeout while the batch may still be
writing into decode's pages. An ack tells decode the pages are safe to reuse.

Observations, per write (acks are ABORT_ACKs sent to decode):

- KV write (``failed``): ``failed.acks`` once the worker concluded the failure;
  ``second_abort.acks`` for a later ABORT; ``after_clear.acks`` for an ABORT
  after the scheduler cleared the sender (the room no longer known).
- aux write: ``aux_failed`` -- ABORT during it, then it fails (``acks``, and
  ``late_acks`` for a later ABORT); ``aux_late`` -- it fails first, the ABORT
  comes afterwards (``late_acks``).
- state write: ``state_failed`` / ``state_late`` the same two orders
  (``acks``, ``late_acks``); ``state_aborted`` -- decode aborts during a state
  write that succeeds: is the aux write still made (``aux_sends``), is a
  transfer status still reported (``status_reports``)? And
  ``state_failed.session_alive``: does the rank still write to decode's
  Mooncake session afterwards (a failed write there blacklists the session),
  seen as whether the next room's KV write is attempted.

Before the fix (<= 0.5.21) the worker acks the "drain" of every failed write
and every later ABORT; with it (0.5.22+) the room is poisoned before anything
else, so it never acks until the room's next lifecycle and decode falls back to
its release timeout; an ABORT during the state write stops the worker before
the aux write, without blacklisting decode's session.

Controls (equal on both sides): decode is told the room Failed after a failed
KV, aux or state write; a successful write during which decode aborts acks the
drain once, and a later ABORT once more; the session stays alive after a
successful write and a failed aux write, and is blacklisted after a failed KV
write and a failed state write nobody aborted; the room's next lifecycle
(Bootstrapping, WaitingForInput) acks once (``reused.acks``).

Not covered -- no scenario can name these paths, for these reasons:

- the poison the worker sets when it dies on an exception (``except
  Exception``: ``poison_deferred_ack_room`` before re-raising). A room's
  chunks go to one transfer queue, chosen by destination, with one worker
  thread; the raise ends that thread with the room's outstanding-write count
  above zero, so no ack fires for the room on either side, poison or not
  (reverting it changes no field here). The one exception -- a trace call
  failing before the count is taken, with tracing on -- leaves nothing written,
  where the base's ack is right.
- the poison reset on a new lifecycle (``update_status`` discards the room's
  poison on Bootstrapping/WaitingForInput): the base has no poison to reset,
  so no observation can read the base's value; a build that poisons but never
  resets fails the ``reused.acks`` control (the room never acks again) and is
  reported as an error, not as a path.
- either one of the two poison checks (``_maybe_ack_drained_abort``,
  ``register_deferred_ack_target``) alone: each is redundant with the other;
  only dropping both (or not remembering the room) is observable.

Honesty: the worker wraps any exception in a RuntimeError and, from 0.5.22,
poisons the room while doing so -- exactly what the fix does on purpose. The
fakes are strict (a missing attribute is a BaseException the worker cannot
wrap), the RDMA fakes run under ``kit.guard``, and any RuntimeError escapes
the probe as an error instead of being observed. The rank's bookkeeping --
poisoned rooms, ack targets, outstanding writes, the session blacklist -- is
this build's own, made by its constructor; the probe reads none of it.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable
from typing import Any

from difflab.probe.kit import Kit
from harness.features import Machinery
from harness.mooncake import DECODE_IP, DECODE_PORT, PrefillRank, build_prefill_rank, mooncake_gap

_generations = itertools.count(1)


# --- version adaptations (one place, detected by feature) -----------------------
# This probe drives Mooncake's transfer worker: its fields are Mooncake's (``mooncake:failed.acks``).
# NIXL's worker gained a poison of its own in the same release (a batch whose handles never settled),
# judged by pr43719_nixl_unsettled_ack. Mori's deferral (0.5.22+) came with its own drainer; its counterpart
# of this fix (0.5.23) is fix 43719a-mori.
BACKEND = "mooncake"

# The fix changes when prefill acks a drained abort; <= 0.5.18 acks every ABORT at once (no drain ack at all).
MACHINERY = Machinery(
    "drain-acknowledged abort (deferred KV release)",
    "sglang.srt.disaggregation.common.conn",
    "CommonKVManager._maybe_ack_drained_abort",
)


def abort_message(room: int) -> list[bytes]:
    """Decode's ABORT for ``room`` as this release's decode puts it on the wire.

    0.5.22: the ABORT carries decode's abort generation (``AbortNotification``),
    which the ack must echo. <= 0.5.21: four frames, no generation. (Where the
    prefill side handles it moved too -- inline in ``bootstrap_thread`` up to
    0.5.21, ``_handle_abort_notification`` from 0.5.22 -- but the probe feeds
    the real bootstrap thread, so that move needs no adaptation.)
    """
    from sglang.srt.disaggregation.common import conn

    if hasattr(conn, "AbortNotification"):  # 0.5.22
        return conn.AbortNotification(
            room=room, decode_ip=DECODE_IP, decode_port=DECODE_PORT, generation=next(_generations)
        ).to_zmq()
    return [b"ABORT", str(room).encode("ascii"), DECODE_IP.encode("ascii"), str(DECODE_PORT).encode("ascii")]


# --- scenario steps ------------------------------------------------------------------
def _write(rank: PrefillRank, return_code: int, *, abort_during: bool) -> Callable[[], int]:
    """One RDMA write of the room: decode's ABORT may arrive while it is in flight; then it returns ``return_code``."""

    def write() -> int:
        if abort_during:
            rank.deliver(abort_message(rank.room))
        return return_code

    return write


def _late_acks(rank: PrefillRank) -> int:
    """ABORT_ACKs for one more ABORT of the room, arriving after the worker is done with it."""
    start = rank.sent_so_far()
    rank.deliver(abort_message(rank.room))
    return rank.acks(since=start)


def _decode_told_failed(rank: PrefillRank) -> bool:
    """Some status message to decode reports this room Failed."""
    from sglang.srt.disaggregation.base.conn import KVPoll

    room, failed = str(rank.room).encode("ascii"), str(int(KVPoll.Failed)).encode("ascii")
    return any(
        len(frames) >= 2 and frames[0] == room and frames[1] == failed
        for endpoint, frames in rank.wire.sent
        if endpoint == rank.decode_endpoint
    )


def _status_reports(rank: PrefillRank) -> int:
    """Transfer-status messages (Success or Failed) this rank sent decode for the room."""
    room = str(rank.room).encode("ascii")
    return sum(
        1 for endpoint, frames in rank.wire.sent if endpoint == rank.decode_endpoint and frames and frames[0] == room
    )


def _prefixed(scenario: str, fields: dict[str, Any]) -> dict[str, Any]:
    return {f"{scenario}.{k}": v for k, v in fields.items()}


# --- scenarios: the KV write ---------------------------------------------------------
def failed_send(kit: Kit) -> dict[str, Any]:
    """ABORT during a KV write that then fails: ack now, a second ABORT, after clear, after reuse?"""
    rank = build_prefill_rank(kit, room=43001)
    rank.send_result = _write(rank, -1, abort_during=True)
    rank.run_worker(rank.chunk(last=True))
    fields = {
        "failed.send_attempts": rank.send_kvcache.count,
        "failed.decode_told_failed": _decode_told_failed(rank),
        "failed.status_reports": _status_reports(rank),
        "failed.acks": rank.acks(),
        "second_abort.acks": _late_acks(rank),
    }
    rank.clear_sender()
    fields["after_clear.acks"] = _late_acks(rank)
    rank.open_room()
    fields["reused.acks"] = _late_acks(rank)
    fields["failed.session_alive"] = rank.session_alive()
    return fields


def succeeded_send(kit: Kit) -> dict[str, Any]:
    """Control: ABORT during a KV write that succeeds -> the drain is acked once, and so is a later ABORT."""
    rank = build_prefill_rank(kit, room=43002)
    rank.send_result = _write(rank, 0, abort_during=True)
    rank.run_worker(rank.chunk(last=False))
    return {
        "succeeded.send_attempts": rank.send_kvcache.count,
        "succeeded.acks": rank.acks(),
        "succeeded.late_acks": _late_acks(rank),
        "succeeded.session_alive": rank.session_alive(),
    }


# --- scenarios: the aux (metadata slot) write ----------------------------------------------
def aux_failed(kit: Kit) -> dict[str, Any]:
    """KV written; decode aborts during the aux write, which then fails."""
    rank = build_prefill_rank(kit, room=43003)
    rank.aux_result = _write(rank, -1, abort_during=True)
    rank.run_worker(rank.chunk(last=True))
    return {
        "aux_sends": rank.send_aux.count,
        "decode_told_failed": _decode_told_failed(rank),
        "acks": rank.acks(),
        "late_acks": _late_acks(rank),
    }


def aux_late(kit: Kit) -> dict[str, Any]:
    """KV written; the aux write fails with nobody aborting yet; decode's ABORT comes afterwards."""
    rank = build_prefill_rank(kit, room=43004)
    rank.aux_result = _write(rank, -1, abort_during=False)
    rank.run_worker(rank.chunk(last=True))
    return {"acks": rank.acks(), "late_acks": _late_acks(rank)}


# --- scenarios: the state-buffer write (hybrid models) ----------------------------------------
def state_failed(kit: Kit) -> dict[str, Any]:
    """KV written; decode aborts during the state-buffer write, which then fails."""
    rank = build_prefill_rank(kit, room=43005)
    rank.state_result = _write(rank, -1, abort_during=True)
    rank.run_worker(rank.chunk(last=True, state=True))
    return {
        "aux_sends": rank.send_aux.count,
        "acks": rank.acks(),
        "late_acks": _late_acks(rank),
        "session_alive": rank.session_alive(),
    }


def state_late(kit: Kit) -> dict[str, Any]:
    """KV written; the state write fails with nobody aborting yet; decode's ABORT comes afterwards."""
    rank = build_prefill_rank(kit, room=43006)
    rank.state_result = _write(rank, -1, abort_during=False)
    rank.run_worker(rank.chunk(last=True, state=True))
    return {
        "aux_sends": rank.send_aux.count,
        "decode_told_failed": _decode_told_failed(rank),
        "acks": rank.acks(),
        "late_acks": _late_acks(rank),
        "session_alive": rank.session_alive(),
    }


def state_aborted(kit: Kit) -> dict[str, Any]:
    """KV written; decode aborts during a state write that succeeds: is the aux write still made?"""
    rank = build_prefill_rank(kit, room=43007)
    rank.state_result = _write(rank, 0, abort_during=True)
    rank.run_worker(rank.chunk(last=True, state=True))
    return {
        "aux_sends": rank.send_aux.count,
        "status_reports": _status_reports(rank),
        "acks": rank.acks(),
    }


SCENARIOS = (failed_send, succeeded_send, aux_failed, aux_late, state_failed, state_late, state_aborted)
PREFIXED = {aux_failed, aux_late, state_failed, state_late, state_aborted}


def observe(kit: Kit) -> dict[str, Any]:
    MACHINERY.require(kit)
    # The worker marks the Mooncake session dead after a failed write, at ERROR.
    kit.allow_log(rf"^Session {re.escape('decode-session-0')} failed\.$")
    gap = mooncake_gap()
    if gap is not None:
        return kit.backend_not_applicable(BACKEND, gap)
    fields: dict[str, Any] = {}
    for scenario in SCENARIOS:
        seen = scenario(kit)
        fields.update(_prefixed(scenario.__name__, seen) if scenario in PREFIXED else seen)
    return kit.on_backend(BACKEND, fields)
