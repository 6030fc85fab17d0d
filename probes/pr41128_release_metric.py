"""#41128 -- every deferred decode KV release is counted by outcome: ``decode_deferred_kv_release_total{outcome}``.

Scenario: a decode rank whose scheduler runs with ``--enable-metrics`` (:mod:`harness.family_metrics`)
holds a request's pages after the client aborted it (the real
``Scheduler.abort_request``; ABORT to both prefill ranks). The hold ends
through the real ``resolve_deferred_releases`` either way a release can end:
``drained.*`` -- both prefill ranks ack the drain; ``timeout.*`` -- nobody
acks and the (forced short) release timeout passes. The scheduler's metrics
collector records every call SGLang makes to it (:mod:`harness.decode_kv`);
``metric_outcomes`` lists the outcomes the deferred-release counter was
given, in order.

Before the fix (<= 0.5.21) a deferred release is counted nowhere: an operator
cannot tell a healthy ack path (almost all ``drained``) from a broken one (a
high ``timeout`` share). With it (0.5.22+) each release is counted once with
its outcome, the same one SGLang logs.

Controls (equal on both sides): the release happens exactly once, and its
whether SGLang's own log says it timed out is the same (``logged_timeout``); the
transfer failure is counted by the collector on both sides
(``failures_counted``: metrics really are on and the collector is wired); a
request released at once because nobody can be notified is not a deferred
release and counts no outcome (``immediate.*``).

Every scenario runs on each transport back end the build ships (fields
``<backend>:<field>``); one whose decode side cannot defer is ``not-applicable``
there, named (Mori up to 0.5.21).
"""

from __future__ import annotations

import time
from typing import Any

from difflab.probe.kit import Kit, ProbeFailure
from harness.decode_kv import BACKENDS, DecodeRank, build_decode_rank, deferral_gap, deliver_abort_ack, prefill_endpoint
from harness.family_metrics import enable_metrics
from harness.features import Machinery

PREFILL_RANKS = 2
SHORT_TIMEOUT_S = 0.2  # forced in ``timeout`` only

# --- version adaptations (one place, detected by feature) -----------------------
# Deferred decode KV release (<= 0.5.18 has none) is what the counter counts.
MACHINERY = Machinery(
    "deferred decode KV release", "sglang.srt.disaggregation.decode", "DecodeTransferQueue.resolve_deferred_releases"
)


def _rank(kit: Kit, backend: str, rid: str, **options: Any) -> DecodeRank:
    settings: dict[str, Any] = {"prefill_ranks": PREFILL_RANKS, "queue_defers": True, "manager_defers": True}
    settings.update(options)
    rank = build_decode_rank(kit, rid=rid, backend=backend, **settings)
    enable_metrics(kit, rank)
    return rank


def _logged_timeout(rank: DecodeRank) -> bool:
    """SGLang's own log says the room's hold timed out (read from the log, not from the metric)."""
    return any("timed out" in m and str(rank.room) in m for m in rank.warnings.messages)


def _counted(rank: DecodeRank) -> dict[str, Any]:
    rank.queue.resolve_deferred_releases()  # a second pass must not count (or release) again
    return {
        "metric_outcomes": list(rank.deferred_outcomes),
        "logged_timeout": _logged_timeout(rank),
        "release_count": rank.release_kv_cache.count,
        "failures_counted": rank.metrics.increment_transfer_failed_reqs.count,
    }


def _abort_and_hold(rank: DecodeRank) -> None:
    rank.client_abort()
    if rank.queue.pop_transferred():
        raise ProbeFailure("an aborted transfer was handed to decoding")
    if rank.release_kv_cache.count:
        raise ProbeFailure("the aborted request was released at once, not held: no deferred release to count")


# --- scenarios -------------------------------------------------------------------
def drained(kit: Kit, backend: str) -> dict[str, Any]:
    """Both prefill ranks ack the drain: released, counted ``drained``?"""
    rank = _rank(kit, backend, "pr41128-001")
    with rank.running():
        _abort_and_hold(rank)
        for prefill_rank in range(PREFILL_RANKS):
            for frames in rank.wire.messages(b"ABORT", prefill_endpoint(prefill_rank)):
                deliver_abort_ack(rank.kv_mgr, rank.room, prefill_rank, frames)
        rank.queue.resolve_deferred_releases()
        return _counted(rank)


def timeout(kit: Kit, backend: str) -> dict[str, Any]:
    """Nobody acks; the release timeout passes: released, counted ``timeout``?"""
    rank = _rank(kit, backend, "pr41128-002", release_timeout_s=SHORT_TIMEOUT_S)
    with rank.running():
        _abort_and_hold(rank)
        time.sleep(SHORT_TIMEOUT_S * 1.5)
        rank.queue.resolve_deferred_releases()
        return _counted(rank)


def immediate(kit: Kit, backend: str) -> dict[str, Any]:
    """Control: a receiver that never learnt its prefill ranks is released at once -- no deferred release."""
    from sglang.srt.disaggregation.base.conn import KVPoll

    rank = _rank(kit, backend, "pr41128-003", notifiable=False)
    with rank.running():
        rank.kv_mgr.record_failure(rank.room, "probe: the prefill rank reported the transfer Failed")
        rank.kv_mgr.update_status(rank.room, KVPoll.Failed)
        rank.queue.pop_transferred()
        return _counted(rank)


SCENARIOS = (drained, timeout, immediate)


def observe(kit: Kit) -> dict[str, Any]:
    MACHINERY.require(kit)
    kit.allow_log(r"Decode transfer failed for request .* with exception KVTransferError\(bootstrap_room=\d+\): .*$")
    fields: dict[str, Any] = {}
    for backend in BACKENDS:
        gap = deferral_gap(backend)
        if gap is not None:
            fields.update(kit.backend_not_applicable(backend, gap))
            continue
        for scenario in SCENARIOS:
            observed = scenario(kit, backend)
            fields.update(kit.on_backend(backend, {f"{scenario.__name__}.{k}": v for k, v in observed.items()}))
    return fields
