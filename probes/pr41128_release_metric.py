"""#41128 -- every deferred decode KV release is counted by outcome: ``decode_deferred_kv_release_total{outcome}``.

Scenario: a decode server built by the build's own start-up
(:func:`harness.decode_kv.decode_side`) whose scheduler runs with
``--enable-metrics`` holds a request's pages after the client aborted it (the
built scheduler's ``abort_request``; ABORT to both prefill ranks). The hold
ends in the scheduler's own event-loop step (``process_decode_queue``, which
resolves held releases) either way a release can end: ``drained.*`` -- both
prefill ranks ack the drain; ``timeout.*`` -- nobody acks and the (forced
short) release timeout passes. ``metric_outcomes`` lists the outcomes the
deferred-release counter was given, in order.

Metrics on: the switch ``--enable-metrics`` sets is applied where the built
scheduler keeps it (its metrics reporter's ``enable_metrics``, reported beside
the verdict with the build's default), and the collector the build would have
made is replaced by one that records every call SGLang makes to it (a call it
does not know is a probe error): a real Prometheus collector is process-global
state the next side would collide with. SGLang's own ``enable_metrics`` gates
then decide what is counted.

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

from typing import Any

from difflab.probe.kit import Kit, ProbeFailure, StrictFake
from harness.decode_kv import (
    BACKENDS,
    DecodeRank,
    DecodeSide,
    decode_side,
    deferral_gap,
    deliver_abort_ack,
    prefill_endpoint,
)
from harness.features import Machinery

PREFILL_RANKS = 2
SHORT_TIMEOUT_S = 0.2  # forced in ``timeout`` only

# --- version adaptations (one place, detected by feature) -----------------------
# Deferred decode KV release (<= 0.5.18 has none) is what the counter counts.
MACHINERY = Machinery(
    "deferred decode KV release", "sglang.srt.disaggregation.decode", "DecodeTransferQueue.resolve_deferred_releases"
)


class Collector:
    """The metrics collector in the built scheduler's place: the calls SGLang makes, recorded."""

    def __init__(self, kit: Kit) -> None:
        self.outcomes: list[str] = []

        def observe_deferred(*, duration_seconds: float, outcome: str) -> None:
            self.outcomes.append(outcome)

        self.fake: StrictFake = kit.fake(
            "metrics_collector",
            increment_transfer_failed_reqs=kit.recorder("increment_transfer_failed_reqs"),
            observe_decode_deferred_kv_release=kit.recorder(
                "observe_decode_deferred_kv_release", side_effect=observe_deferred
            ),
        )

    def failures(self) -> int:
        return self.fake.increment_transfer_failed_reqs.count


def enable_metrics(kit: Kit, side: DecodeSide) -> Collector:
    """The built scheduler's metrics on, as ``--enable-metrics`` would have set them at start-up."""
    reporter = side.scheduler.metrics_reporter
    kit.forced_flag(
        "server_args.enable_metrics",
        True,
        reporter.enable_metrics,
        "ServerArgs.enable_metrics (--enable-metrics), as the built metrics reporter holds it",
        [],
    )
    reporter.enable_metrics = True
    reporter.current_scheduler_metrics_enabled = True
    collector = Collector(kit)
    side.scheduler.metrics_collector = collector.fake
    return collector


def _logged_timeout(rank: DecodeRank) -> bool:
    """SGLang's own log says the room's hold timed out (read from the log, not from the metric)."""
    return any("timed out" in m and str(rank.room) in m for m in rank.side.warnings.messages)


def _counted(rank: DecodeRank, collector: Collector, since: tuple[int, int]) -> dict[str, Any]:
    rank.side.step()  # a second pass must not count (or release) again
    return {
        "metric_outcomes": collector.outcomes[since[0] :],
        "logged_timeout": _logged_timeout(rank),
        "release_count": rank.release_count(),
        "failures_counted": collector.failures() - since[1],
    }


def _abort_and_hold(rank: DecodeRank) -> None:
    rank.client_abort()
    if rank.side.step():
        raise ProbeFailure("an aborted transfer was handed to decoding")
    if rank.release_count():
        raise ProbeFailure("the aborted request was released at once, not held: no deferred release to count")


def _mark(collector: Collector) -> tuple[int, int]:
    return len(collector.outcomes), collector.failures()


# --- scenarios -------------------------------------------------------------------
def drained(side: DecodeSide, collector: Collector) -> dict[str, Any]:
    """Both prefill ranks ack the drain: released, counted ``drained``?"""
    since = _mark(collector)
    rank = side.admit("pr41128-001")
    _abort_and_hold(rank)
    for prefill_rank in range(PREFILL_RANKS):
        for frames in rank.aborts(prefill_endpoint(prefill_rank)):
            deliver_abort_ack(side, rank.room, prefill_rank, frames)
    side.step()
    return _counted(rank, collector, since)


def timeout(side: DecodeSide, collector: Collector) -> dict[str, Any]:
    """Nobody acks; the release timeout passes: released, counted ``timeout``?"""
    with side.forced(side.queue, "transfer_queue", "deferred_kv_release_timeout", SHORT_TIMEOUT_S):
        since = _mark(collector)
        rank = side.admit("pr41128-002")
        _abort_and_hold(rank)
        side.wait(SHORT_TIMEOUT_S * 1.5, "nobody acks: the release timeout passes")
        side.step()
        return _counted(rank, collector, since)


def immediate(side: DecodeSide, collector: Collector) -> dict[str, Any]:
    """Control: a receiver that never learnt its prefill ranks is released at once -- no deferred release."""
    from sglang.srt.disaggregation.base.conn import KVPoll

    since = _mark(collector)
    rank = side.admit("pr41128-003")
    rank.receiver.bootstrap_infos = None  # the state this control models: the destinations were never learnt
    side.kv_mgr.record_failure(rank.room, "probe: the prefill rank reported the transfer Failed")
    side.kv_mgr.update_status(rank.room, KVPoll.Failed)
    side.step()
    return _counted(rank, collector, since)


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
        with decode_side(kit, backend, prefill_ranks=PREFILL_RANKS) as side:
            collector = enable_metrics(kit, side)
            for scenario in SCENARIOS:
                observed = scenario(side, collector)
                fields.update(kit.on_backend(backend, {f"{scenario.__name__}.{k}": v for k, v in observed.items()}))
    return fields
