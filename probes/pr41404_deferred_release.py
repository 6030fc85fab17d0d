"""#41404 -- deferred decode KV release on every transfer-failure kind.

Scenario: a decode rank has pre-allocated KV pages for a request and published
their addresses to two prefill ranks (the receiver's real ``send_metadata``).
The transfer then fails for a reason decode did NOT initiate (a prefill rank
reports Failed), so the receiver has not told prefill anything
(``abort_notified`` is False). The real ``DecodeTransferQueue.pop_transferred``
meets ``KVPoll.Failed``. Deferred release is switched ON explicitly on the
queue and on the KV manager (its default flipped from False to True in 0.5.21;
the diff must not be that flip; both are reported beside the verdict with the
build's own default).

Observations (``failed.*``, right after ``pop_transferred``): whether the pages
were released at once (``release_kv_cache`` calls), how many ABORT messages
went to the prefill ranks, whether the metadata slot was freed, whether the
request is held (neither released nor its slot freed). Then the hold is
resolved through the real ``resolve_deferred_releases``: ``drained.*`` -- every
prefill rank that got an ABORT acks it (held while only one has, across the
event loop's next pass under the build's own release timeout:
``released_before_every_ack``);
``timeout.*`` -- nobody acks and a 0.1 s release timeout passes. Either way the
pages must be released exactly once; ``outcome`` is ``immediate`` /
``drained`` / ``timeout`` / ``held`` (from the timeout warning SGLang logs,
cross-checked with the 0.5.22+ metric label).

``partial.*`` -- a partial publish: prefill rank 1's socket refuses the
metadata once (a transient ZMQ error), so ``send_metadata`` itself concludes
the room Failed and never sets ``init_time``, while rank 0 already holds the
destination and may be writing. ``racing_ack.*`` -- the client aborts the
request through the real ``Scheduler.abort_request`` and prefill rank 0 acks at
once, while decode is still sending rank 1 its ABORT: an ack counts only if the
drain-ack accounting was armed before the ABORTs went out.

Before the fix (<= 0.5.20) a failure decode did not initiate -- a partial
publish included -- releases the pages at once while a prefill rank may still
be writing into them; the scheduler armed the ack accounting only after the
ABORTs were out, so a racing ack was dropped and the request waited for the
release timeout. With it (0.5.21+) decode sends ABORT to every prefill rank
(``force_arm`` arms a partial publish too) and holds the pages until the acks
or the timeout; the receiver arms before sending, so the racing ack counts.

Every scenario runs on each transport back end the build ships (Mooncake, the
server's default, then NIXL and Mori), chosen the way ``ServerArgs`` chooses it;
fields are per back end (``nixl:failed.held``). A back end the build lacks, or
whose KV manager cannot defer, is ``not-applicable`` there, named. The release
timeout is the build's own; only ``timeout`` forces a short one (reported beside
the verdict with the build's default).

Controls (equal on both sides): a receiver with no bootstrap info cannot
notify anyone and releases at once; a KV manager without deferred-release
capability releases at once and sends no ABORT; a decode-initiated abort
(``receiver.abort()`` before the poll) is held; the same client abort with
both acks arriving after the scheduler is done drains on every release
(``client_abort``) -- so the diff is the failure-kind check and the arming
order, not the deferral machinery.
"""

from __future__ import annotations

from typing import Any

from difflab.probe.kit import Kit, ProbeFailure
from harness.decode_kv import BACKENDS, DecodeRank, DecodeSide, decode_side, deferral_gap, prefill_endpoint
from harness.decode_kv import deliver_abort_ack as harness_deliver_abort_ack
from harness.features import Machinery

PREFILL_RANKS = 2  # chosen by the lab: the prefill server the bootstrap fake announces has two TP ranks
SHORT_TIMEOUT_S = 0.1  # forced in ``timeout`` only; every other scenario runs under the build's own timeout
PREFILL_FAILURE = "probe: prefill rank 1 reported the transfer Failed"


# --- version adaptations (one place, detected by feature) -----------------------
# The fix changes how deferred decode KV release treats a failure; <= 0.5.18 has no deferred release at all.
MACHINERY = Machinery(
    "deferred decode KV release", "sglang.srt.disaggregation.decode", "DecodeTransferQueue.resolve_deferred_releases"
)


def deliver_abort_ack(rank: DecodeRank, prefill_rank: int, abort_frames: list[bytes]) -> None:
    """A prefill rank's drain ack for the ABORT it received (the release's wire form: :mod:`harness.decode_kv`)."""
    harness_deliver_abort_ack(rank.side, rank.room, prefill_rank, abort_frames)


# --- scenario steps ------------------------------------------------------------------
def _prefill_reports_failure(rank: DecodeRank) -> None:
    """What decode's receive thread does when a prefill rank reports Failed."""
    from sglang.srt.disaggregation.base.conn import KVPoll

    rank.side.kv_mgr.record_failure(rank.room, PREFILL_FAILURE)
    rank.side.kv_mgr.update_status(rank.room, KVPoll.Failed)


def _pop(rank: DecodeRank) -> dict[str, Any]:
    """Run the scheduler's decode queue step once (it polls the transfer queue) and report what happened."""
    transferred = rank.side.step()
    if transferred:
        raise ProbeFailure(f"a failed transfer was handed to decoding: {transferred!r}")
    return _effects(rank)


def _effects(rank: DecodeRank) -> dict[str, Any]:
    """What the last pass of the event loop did with the failed request."""
    return {
        "released_immediately": rank.release_count() == 1,
        "abort_messages": rank.abort_messages(),
        "slot_freed_immediately": rank.slot_free(),
        "held": rank.held(),
        "abort_streamed": len(rank.streamed()) == 1,
    }


def _acks_from(rank: DecodeRank, prefill_ranks: range) -> None:
    """Each listed prefill rank acks the ABORT it received (a rank that got none has nothing to ack)."""
    for prefill_rank in prefill_ranks:
        for frames in rank.aborts(prefill_endpoint(prefill_rank)):
            deliver_abort_ack(rank, prefill_rank, frames)


def _outcome(rank: DecodeRank, released_immediately: bool) -> str:
    """immediate / drained / timeout / held -- from SGLang's own log (its metric is off by the build's default)."""
    if released_immediately:
        return "immediate"
    if rank.release_count() == 0:
        return "held"
    timed_out = any("timed out" in m and str(rank.room) in m for m in rank.side.warnings.messages)
    return "timeout" if timed_out else "drained"


def _resolved(rank: DecodeRank, immediately: bool) -> dict[str, Any]:
    outcome = _outcome(rank, immediately)
    rank.side.step()  # a second pass must not release again
    return {
        "outcome": outcome,
        "release_count": rank.release_count(),
        "slot_freed": rank.slot_free(),
        "still_held": rank.held(),
    }


def _prefixed(scenario: str, fields: dict[str, Any]) -> dict[str, Any]:
    return {f"{scenario}.{k}": v for k, v in fields.items()}


# --- scenarios -------------------------------------------------------------------
def failed(side: DecodeSide) -> dict[str, Any]:
    """A failure decode did not initiate: released at once, or ABORT sent and held?"""
    rank = side.admit("pr41404-001")
    _prefill_reports_failure(rank)
    fields = _pop(rank)
    _acks_from(rank, range(PREFILL_RANKS))  # let the hold end, so the next scenario starts clean
    side.step()
    return fields


def drained(side: DecodeSide) -> dict[str, Any]:
    """Held until every notified prefill rank acked the drain, then released once."""
    rank = side.admit("pr41404-002")
    _prefill_reports_failure(rank)
    first = _pop(rank)
    _acks_from(rank, range(0, 1))
    side.step()  # the event loop's next pass, under the build's own timeout
    held_after_first_ack = rank.held()
    released_before_every_ack = rank.release_count() > 0
    _acks_from(rank, range(1, PREFILL_RANKS))
    side.step()
    return {
        "held_after_first_ack": held_after_first_ack,
        "released_before_every_ack": released_before_every_ack,
        **_resolved(rank, first["released_immediately"]),
    }


def timeout(side: DecodeSide) -> dict[str, Any]:
    """Nobody acks: held until the (short, forced) release timeout, then released once."""
    with side.forced(side.queue, "transfer_queue", "deferred_kv_release_timeout", SHORT_TIMEOUT_S):
        rank = side.admit("pr41404-003")
        _prefill_reports_failure(rank)
        first = _pop(rank)
        side.step()
        held_before_deadline = rank.held()
        side.wait(SHORT_TIMEOUT_S * 1.5, "nobody acks: the release timeout passes")
        side.step()
        return {
            "held_before_deadline": held_before_deadline,
            **_resolved(rank, first["released_immediately"]),
        }


def unnotifiable(side: DecodeSide) -> dict[str, Any]:
    """Control: a receiver that knows no prefill rank (no bootstrap info) has nobody to notify -> immediate release."""
    rank = side.admit("pr41404-004")
    rank.receiver.bootstrap_infos = None  # the state this control models: the destinations were never learnt
    _prefill_reports_failure(rank)
    first = _pop(rank)
    return {**first, "outcome": _outcome(rank, first["released_immediately"])}


def no_capability(side: DecodeSide) -> dict[str, Any]:
    """Control: the KV manager cannot defer -> immediate release, no ABORT.

    Its ``enable_deferred_decode_kv_release`` is False for the scenario: what the constructor
    computes for a backend without ``supports_deferred_decode_kv_release`` (0.5.21+), or with
    the switch off (<= 0.5.20).
    """
    with side.forced(side.kv_mgr, "decode_kv_mgr", "enable_deferred_decode_kv_release", False):
        rank = side.admit("pr41404-005")
        _prefill_reports_failure(rank)
        return _pop(rank)


def partial(side: DecodeSide) -> dict[str, Any]:
    """A partial publish: rank 0 holds the destination, rank 1 refused it -- held until every notified rank acks?

    ``send_metadata`` concludes the room Failed itself and never sets the
    receiver's ``init_time``; rank 0 may already be writing into the pages.
    """
    rank = side.admit("pr41404-007", refuse_metadata_at=1)  # the same pass polls the failed room
    first = _effects(rank)
    _acks_from(rank, range(PREFILL_RANKS))
    side.step()
    return {
        "released_immediately": first["released_immediately"],
        "abort_messages": first["abort_messages"],
        **_resolved(rank, first["released_immediately"]),
    }


def racing_ack(side: DecodeSide) -> dict[str, Any]:
    """The client aborts; prefill rank 0 acks at once, while decode is still sending rank 1 its ABORT.

    Driven through the built scheduler's own ``abort_request``, so wherever a build
    arms its ack accounting (receiver or scheduler, before or after the
    ABORTs), the build's own order decides whether rank 0's ack is counted.
    """
    rank = side.admit("pr41404-008")
    wire = side.transport.wire
    wire.reply_on_send(prefill_endpoint(0), b"ABORT", lambda frames: deliver_abort_ack(rank, 0, frames))
    rank.client_abort()
    if wire.unanswered():
        raise ProbeFailure("the client abort sent prefill rank 0 no ABORT, so its ack could not race")
    _acks_from(rank, range(1, PREFILL_RANKS))
    first = _pop(rank)
    side.step()
    fields = {"held": first["held"], "abort_messages": first["abort_messages"], **_resolved(rank, False)}
    if rank.held():  # the base dropped rank 0's ack: end the hold the way its timeout would
        with side.forced(side.queue, "transfer_queue", "deferred_kv_release_timeout", 0.0):
            side.step()
    return fields


def client_abort(side: DecodeSide) -> dict[str, Any]:
    """Control: the same client abort, both acks arriving after the scheduler is done -> drained on every release."""
    rank = side.admit("pr41404-009")
    rank.client_abort()
    released_before_every_ack = rank.release_count() > 0
    _acks_from(rank, range(PREFILL_RANKS))
    first = _pop(rank)
    side.step()
    return {
        "held": first["held"],
        "released_before_every_ack": released_before_every_ack,
        **_resolved(rank, first["released_immediately"]),
    }


def decode_initiated(side: DecodeSide) -> dict[str, Any]:
    """Control: decode aborted the transfer itself (the receiver's own abort) -> held on every release."""
    rank = side.admit("pr41404-006")
    rank.receiver.abort()
    fields = _pop(rank)
    _acks_from(rank, range(PREFILL_RANKS))
    side.step()
    return fields


SCENARIOS = (
    failed,
    drained,
    timeout,
    partial,
    racing_ack,
    client_abort,
    unnotifiable,
    no_capability,
    decode_initiated,
)


def observe(kit: Kit) -> dict[str, Any]:
    MACHINERY.require(kit)
    # pop_transferred logs every failed transfer at ERROR, with the recorded root cause.
    kit.allow_log(
        r"Decode transfer failed for request .* with exception KVTransferError\(bootstrap_room=\d+\): "
        rf"({PREFILL_FAILURE}|Aborted by AbortReq\.|send_metadata to prefill [0-9.]+:\d+ failed)$"
    )
    fields: dict[str, Any] = {}
    for backend in BACKENDS:
        gap = deferral_gap(backend)
        if gap is not None:
            fields.update(kit.backend_not_applicable(backend, gap))
            continue
        with decode_side(kit, backend, prefill_ranks=PREFILL_RANKS) as side:
            for scenario in SCENARIOS:
                fields.update(kit.on_backend(backend, _prefixed(scenario.__name__, scenario(side))))
    return fields
