"""Abort requests while their KV is in flight, then check that the engines are whole again.

Requests are launched a little apart and aborted after growing delays, so some
aborts land mid-transfer and the freed pages are wanted by the next request while
the late write may still be landing. Afterwards, from each engine's /metrics:
KV usage back to its baseline (``sglang:num_used_tokens``), no phantom running
requests (``sglang:num_running_reqs``), and the deferred-release outcomes
(``sglang:decode_deferred_kv_release_total{outcome}``, 0.5.22+) where exposed.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from difflab.engine import names
from difflab.engine.client import EngineError, Reply
from difflab.engine.metrics import MetricSet
from difflab.gpu.scenarios.base import (
    Endpoints,
    Limits,
    Outcome,
    ScenarioUnavailable,
    calibrate,
    canary_prompt,
    capacity,
    foreign_markers,
    run_tag,
    wait_until,
    words_for_tokens,
)


def _scrape(ep: Endpoints) -> dict[str, MetricSet]:
    try:
        return {"prefill": ep.prefill.metrics(), "decode": ep.decode.metrics()}
    except (EngineError, ValueError) as exc:
        raise ScenarioUnavailable(f"abort storm needs /metrics on both engines: {exc}") from None


def _level(m: dict[str, MetricSet], role: str, metric: str) -> float:
    return m[role].total(metric) or 0.0


def _outcomes(m: dict[str, MetricSet]) -> dict[str, float]:
    return m["decode"].by_label(names.DEFERRED_METRIC, "outcome")


ROLES = ("prefill", "decode")


@dataclass(frozen=True)
class _Baseline:
    """Each engine's KV usage and running requests before the storm: what "whole again" is measured against."""

    used: dict[str, float]
    running: dict[str, float]

    @classmethod
    def of(cls, m: dict[str, MetricSet]) -> _Baseline:
        return cls(
            used={r: _level(m, r, names.USED_METRIC) for r in ROLES},
            running={r: _level(m, r, names.RUNNING_METRIC) for r in ROLES},
        )

    def whole(self, m: dict[str, MetricSet]) -> bool:
        return all(
            _level(m, r, names.USED_METRIC) <= self.used[r] and _level(m, r, names.RUNNING_METRIC) <= self.running[r]
            for r in ROLES
        )


@dataclass
class _Storm:
    """The requests of one storm, each aborted on schedule, and what came back."""

    ep: Endpoints
    limits: Limits
    tag: str
    words: int
    replies: dict[int, Reply] = field(default_factory=dict)
    abort_log: list[dict[str, Any]] = field(default_factory=list)

    @property
    def rids(self) -> list[str]:
        return [f"abort-{self.tag}-{i:03d}" for i in range(self.limits.abort_requests)]

    def run(self) -> None:
        """Launch the requests a little apart; abort each after its delay, on both engines."""
        limits, rids = self.limits, self.rids
        n, start = len(rids), time.monotonic()
        workers = [threading.Thread(target=self._request, args=(i, rids[i]), daemon=True) for i in range(n)]
        for w in workers:
            w.start()
        delays = limits.abort_delays_s
        schedule = sorted((i * limits.abort_stagger_s + delays[i % len(delays)], i) for i in range(n))
        for at, i in schedule:
            time.sleep(max(0.0, start + at - time.monotonic()))
            hits = [self.ep.prefill.abort_request(rids[i]).status, self.ep.decode.abort_request(rids[i]).status]
            self.abort_log.append({"request": i, "at_s": round(time.monotonic() - start, 4), "abort_status": hits})
        for w in workers:
            w.join(limits.request_timeout_s + 5)

    def _request(self, i: int, rid: str) -> None:
        time.sleep(i * self.limits.abort_stagger_s)
        self.replies[i] = self.ep.router.generate(
            canary_prompt(self.tag, i, self.words),
            max_new_tokens=self.limits.max_new_tokens,
            rid=rid,
            timeout=self.limits.request_timeout_s,
        )

    def results(self, out: Outcome) -> tuple[dict[str, int], list[str]]:
        """How each request ended (events added to ``out``) and the foreign markers its answer carried."""
        leaks: list[str] = []
        counts = {"aborted": 0, "completed": 0, "failed": 0}
        for i, rid in enumerate(self.rids):
            reply = self.replies.get(i)
            ok = reply is not None and reply.ok
            kind = ("aborted" if reply.finish_type() == "abort" else "completed") if ok else "failed"  # type: ignore[union-attr]
            counts[kind] += 1
            foreign = foreign_markers(reply.text(), self.tag, i) if ok else []  # type: ignore[union-attr]
            leaks += foreign
            status = reply.status if reply else 0
            out.events.append({"request": i, "rid": rid, "result": kind, "status": status, "foreign_markers": foreign})
        out.events += self.abort_log
        return counts, leaks


def _followups(ep: Endpoints, limits: Limits, tag: str, out: Outcome) -> tuple[bool, list[str]]:
    """Fresh requests after the storm: the engines answer, and with nobody else's markers."""
    ok, leaks = True, []
    for k in range(limits.abort_followups):
        i = 900 + k
        reply = ep.router.generate(canary_prompt(tag, i, 24), max_new_tokens=16, timeout=limits.request_timeout_s)
        ok = ok and reply.ok
        foreign = foreign_markers(reply.text(), tag, i) if reply.ok else []
        leaks += foreign
        out.events.append({"request": i, "result": "followup", "status": reply.status, "foreign_markers": foreign})
    return ok, leaks


@dataclass(frozen=True)
class _After:
    """What the engines' metrics say once the storm settled, against the baseline."""

    used_delta: dict[str, float]
    phantom: float
    deferred_seen: bool
    deferred: dict[str, int]

    @classmethod
    def of(cls, before: dict[str, MetricSet], after: dict[str, MetricSet], base: _Baseline) -> _After:
        o_before, o_after = _outcomes(before), _outcomes(after)
        return cls(
            used_delta={r: _level(after, r, names.USED_METRIC) - base.used[r] for r in ROLES},
            phantom=sum(_level(after, r, names.RUNNING_METRIC) - base.running[r] for r in ROLES),
            deferred_seen=after["decode"].has(names.DEFERRED_METRIC),
            deferred={k: int(o_after.get(k, 0) - o_before.get(k, 0)) for k in sorted(set(o_after) | set(o_before))},
        )

    def fields(self) -> dict[str, Any]:
        return {
            "abort.prefill_used_delta": int(self.used_delta["prefill"]),
            "abort.decode_used_delta": int(self.used_delta["decode"]),
            "abort.prefill_kv_back_to_baseline": self.used_delta["prefill"] <= 0,
            "abort.decode_kv_back_to_baseline": self.used_delta["decode"] <= 0,
            "abort.phantom_running": int(self.phantom),
            "abort.no_phantom_running": self.phantom <= 0,
            "abort.deferred_metric_seen": self.deferred_seen,
            "abort.deferred_outcomes": self.deferred,
            "abort.deferred_errors": self.deferred.get("error", 0),
        }

    def problems(self) -> list[str]:
        out = [
            f"{r} KV usage {int(self.used_delta[r])} tokens above its baseline" for r in ROLES if self.used_delta[r] > 0
        ]
        if self.phantom > 0:
            out.append(f"{int(self.phantom)} phantom running request(s) after every request ended")
        return out


class AbortStorm:
    name = "gpu_abort_storm"
    needs_content = False

    def run(self, ep: Endpoints, limits: Limits) -> Outcome:
        pool, _, _ = capacity(ep)

        def idle() -> bool:
            m = _scrape(ep)
            return all(_level(m, r, names.RUNNING_METRIC) == 0 for r in ROLES)

        was_idle = wait_until(idle, limits.settle_s, limits.poll_s)
        before = _scrape(ep)
        ratio, _ = calibrate(ep.router, limits)
        tag = run_tag()
        storm = _Storm(ep, limits, tag, words_for_tokens(max(32, int(pool * limits.abort_prompt_fraction)), ratio))
        storm.run()
        base = _Baseline.of(before)
        settle_start = time.monotonic()
        settled = wait_until(lambda: base.whole(_scrape(ep)), limits.settle_s, limits.poll_s)
        settle_took = time.monotonic() - settle_start
        after = _After.of(before, _scrape(ep), base)

        out = Outcome()
        counts, leaks = storm.results(out)
        followups_ok, followup_leaks = _followups(ep, limits, tag, out)
        leaks += followup_leaks
        out.fields = {
            "abort.sent": limits.abort_requests,
            "abort.aborted": counts["aborted"],
            "abort.completed": counts["completed"],
            "abort.failed": counts["failed"],
            "abort.started_idle": was_idle,
            "abort.settled": settled,
            "abort.settle_s": round(settle_took, 3),
            **after.fields(),
            "abort.leak_seen": bool(leaks),
            "abort.followup_ok": followups_ok,
        }
        out.problems += after.problems()
        if leaks:
            out.problems.append(f"answers carried other requests' markers: {', '.join(sorted(set(leaks))[:4])}")
        return out
