"""#41404 on Mori -- a Mori decode rank holds a failed or aborted request's pages until the drain ack.

Scenario: the same as #41404's (:mod:`pr41404_deferred_release`), on the Mori
back end, with one difference that is the point: whether the KV manager
defers is left to the build: the decode server is the build's own start-up
(:func:`harness.decode_kv.decode_side`) with the deferred-release switch
``SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE`` at the build's default (not
forced), and the KV manager's constructor combines it with the back end's
``supports_deferred_decode_kv_release``. A request admitted through the
scheduler has published its destination to two prefill ranks; then
``failed.*`` -- a prefill rank reports the transfer Failed; ``client_abort.*``
-- the client aborts the request (the real ``Scheduler.abort_request``);
``drained.*`` -- after the failure both prefill ranks ack the drain. The real
``pop_transferred`` and ``resolve_deferred_releases`` decide.

Before the fix (<= 0.5.21) Mori's KV manager cannot defer, so the pages are
released at once while a prefill rank may still be writing into them (the
in-flight write race of the incident reports); with it (0.5.22+) Mori declares
the capability and decode holds the pages until every prefill rank acked,
like Mooncake and NIXL from 0.5.21.

Controls (equal on both sides): a receiver that never learnt its prefill
ranks is released at once and notifies nobody (``unnotifiable``); the client's
abort reaches both prefill ranks on both sides (``client_abort.abort_messages``);
the same failure on the same build's Mooncake back end is held on both sides
(``mooncake_failed.held``: the build's switch is on, so the diff is Mori's
capability). Fields read ``mori:<field>``; a build without Mori, or whose
deferred-release switch is off (the default up to 0.5.20), is ``not-applicable``.
"""

from __future__ import annotations

from typing import Any

from difflab.probe.kit import Kit, ProbeFailure
from harness.decode_kv import DecodeRank, DecodeSide, decode_side, deliver_abort_ack, prefill_endpoint
from harness.features import Machinery

BACKEND = "mori"
CONTROL_BACKEND = "mooncake"
PREFILL_RANKS = 2
PREFILL_FAILURE = "probe: prefill rank 1 reported the transfer Failed"

# --- version adaptations (one place, detected by feature) -----------------------
# Deferred decode KV release (<= 0.5.18 has none); whether Mori may use it is the build's decision.
MACHINERY = Machinery(
    "deferred decode KV release", "sglang.srt.disaggregation.decode", "DecodeTransferQueue.resolve_deferred_releases"
)


def mori_gap() -> str | None:
    """Why this build cannot answer "does Mori defer by itself", or None.

    A build without Mori; or one whose deferred-release switch is off by default
    (0.5.19/0.5.20): there no back end defers unless the operator turns it on,
    so an immediate release on Mori says nothing about Mori (the
    ``mooncake_failed`` control would read the same).
    """
    from sglang.srt.environ import envs
    from sglang.srt.server_args import DISAGG_TRANSFER_BACKEND_CHOICES

    if BACKEND not in DISAGG_TRANSFER_BACKEND_CHOICES:
        return f"this build ships no {BACKEND} transfer back end"
    if not envs.SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE.get():
        return "deferred decode KV release is off in this build (SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE)"
    return None


def _prefill_reports_failure(rank: DecodeRank) -> None:
    """What decode's receive thread does when a prefill rank reports Failed."""
    from sglang.srt.disaggregation.base.conn import KVPoll

    rank.side.kv_mgr.record_failure(rank.room, PREFILL_FAILURE)
    rank.side.kv_mgr.update_status(rank.room, KVPoll.Failed)


def _pop(rank: DecodeRank) -> dict[str, Any]:
    """One pass of the scheduler's decode queue step (it polls the transfer queue)."""
    if rank.side.step():
        raise ProbeFailure("a failed transfer was handed to decoding")
    return {
        "released_immediately": rank.release_count() == 1,
        "abort_messages": rank.abort_messages(),
        "held": rank.held(),
    }


def _outcome(rank: DecodeRank, released_immediately: bool) -> str:
    if released_immediately:
        return "immediate"
    if rank.release_count() == 0:
        return "held"
    timed_out = any("timed out" in m and str(rank.room) in m for m in rank.side.warnings.messages)
    return "timeout" if timed_out else "drained"


def _acked(rank: DecodeRank) -> None:
    """Each prefill rank acks the ABORT it received; the event loop's next pass."""
    for prefill_rank in range(PREFILL_RANKS):
        for frames in rank.aborts(prefill_endpoint(prefill_rank)):
            deliver_abort_ack(rank.side, rank.room, prefill_rank, frames)
    rank.side.step()


# --- scenarios -------------------------------------------------------------------
def failed(side: DecodeSide) -> dict[str, Any]:
    """A prefill rank reports Failed: released at once, or ABORT sent and held?"""
    rank = side.admit("pr41404m-001")
    _prefill_reports_failure(rank)
    fields = _pop(rank)
    _acked(rank)  # let a hold end, so the next scenario starts clean
    return fields


def client_abort(side: DecodeSide) -> dict[str, Any]:
    """The client aborts: the ABORTs go out on both sides; released at once, or held?"""
    rank = side.admit("pr41404m-002")
    rank.client_abort()
    fields = _pop(rank)
    _acked(rank)
    return fields


def drained(side: DecodeSide) -> dict[str, Any]:
    """After a failure both prefill ranks ack: released once, at once or on the acks?"""
    rank = side.admit("pr41404m-003")
    _prefill_reports_failure(rank)
    first = _pop(rank)
    _acked(rank)
    side.step()  # a second pass must not release again
    return {"outcome": _outcome(rank, first["released_immediately"]), "release_count": rank.release_count()}


def unnotifiable(side: DecodeSide) -> dict[str, Any]:
    """Control: no bootstrap info, nobody to notify -> released at once on both sides."""
    rank = side.admit("pr41404m-004")
    rank.receiver.bootstrap_infos = None  # the state this control models: the destinations were never learnt
    _prefill_reports_failure(rank)
    first = _pop(rank)
    return {**first, "outcome": _outcome(rank, first["released_immediately"])}


def mooncake_failed(side: DecodeSide) -> dict[str, Any]:
    """Control: the same failure on this build's Mooncake back end, its deferral the build's own too."""
    rank = side.admit("pr41404m-005")
    _prefill_reports_failure(rank)
    held = _pop(rank)["held"]
    _acked(rank)
    return {"held": held}


SCENARIOS = (failed, client_abort, drained, unnotifiable)
CONTROL_SCENARIOS = (mooncake_failed,)


def _run(kit: Kit, backend: str, scenarios: tuple[Any, ...]) -> dict[str, Any]:
    """``scenarios`` on one decode server of ``backend``, its deferral switch at the build's default."""
    fields: dict[str, Any] = {}
    with decode_side(kit, backend, prefill_ranks=PREFILL_RANKS, switch_forced=False) as side:
        for scenario in scenarios:
            fields.update({f"{scenario.__name__}.{k}": v for k, v in scenario(side).items()})
    return fields


def observe(kit: Kit) -> dict[str, Any]:
    MACHINERY.require(kit)
    kit.allow_log(
        r"Decode transfer failed for request .* with exception KVTransferError\(bootstrap_room=\d+\): "
        rf"({PREFILL_FAILURE}|Aborted by AbortReq\.)$"
    )
    gap = mori_gap()
    if gap is not None:
        return kit.backend_not_applicable(BACKEND, gap)
    fields = _run(kit, BACKEND, SCENARIOS) | _run(kit, CONTROL_BACKEND, CONTROL_SCENARIOS)
    return kit.on_backend(BACKEND, fields)
