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


class AbortStorm:
    name = "gpu_abort_storm"
    needs_content = False

    def run(self, ep: Endpoints, limits: Limits) -> Outcome:
        pool, _, _ = capacity(ep)

        def idle() -> bool:
            m = _scrape(ep)
            return _level(m, "prefill", names.RUNNING_METRIC) == 0 and _level(m, "decode", names.RUNNING_METRIC) == 0

        was_idle = wait_until(idle, limits.settle_s, limits.poll_s)
        before = _scrape(ep)
        ratio, _ = calibrate(ep.router, limits)
        tag = run_tag()
        words = words_for_tokens(max(32, int(pool * limits.abort_prompt_fraction)), ratio)
        n = limits.abort_requests
        rids = [f"abort-{tag}-{i:03d}" for i in range(n)]
        replies: dict[int, Reply] = {}
        start = time.monotonic()

        def request(i: int) -> None:
            time.sleep(i * limits.abort_stagger_s)
            replies[i] = ep.router.generate(
                canary_prompt(tag, i, words),
                max_new_tokens=limits.max_new_tokens,
                rid=rids[i],
                timeout=limits.request_timeout_s,
            )

        workers = [threading.Thread(target=request, args=(i,), daemon=True) for i in range(n)]
        for w in workers:
            w.start()
        schedule = sorted(
            (i * limits.abort_stagger_s + limits.abort_delays_s[i % len(limits.abort_delays_s)], i) for i in range(n)
        )
        abort_log: list[dict[str, Any]] = []
        for at, i in schedule:
            time.sleep(max(0.0, start + at - time.monotonic()))
            hits = [ep.prefill.abort_request(rids[i]).status, ep.decode.abort_request(rids[i]).status]
            abort_log.append({"request": i, "at_s": round(time.monotonic() - start, 4), "abort_status": hits})
        for w in workers:
            w.join(limits.request_timeout_s + 5)

        base_used = {r: _level(before, r, names.USED_METRIC) for r in ("prefill", "decode")}
        base_running = {r: _level(before, r, names.RUNNING_METRIC) for r in ("prefill", "decode")}

        def whole() -> bool:
            m = _scrape(ep)
            return all(
                _level(m, r, names.USED_METRIC) <= base_used[r]
                and _level(m, r, names.RUNNING_METRIC) <= base_running[r]
                for r in ("prefill", "decode")
            )

        settle_start = time.monotonic()
        settled = wait_until(whole, limits.settle_s, limits.poll_s)
        settle_took = time.monotonic() - settle_start
        after = _scrape(ep)

        out = Outcome()
        leaks: list[str] = []
        counts = {"aborted": 0, "completed": 0, "failed": 0}
        for i in range(n):
            reply = replies.get(i)
            kind = "failed"
            if reply is not None and reply.ok:
                kind = "aborted" if reply.finish_type() == "abort" else "completed"
            counts[kind] += 1
            foreign = foreign_markers(reply.text(), tag, i) if reply is not None and reply.ok else []
            leaks += foreign
            out.events.append(
                {
                    "request": i,
                    "rid": rids[i],
                    "result": kind,
                    "status": reply.status if reply else 0,
                    "foreign_markers": foreign,
                }
            )
        out.events += abort_log
        followups_ok = True
        for k in range(limits.abort_followups):
            i = 900 + k
            reply = ep.router.generate(canary_prompt(tag, i, 24), max_new_tokens=16, timeout=limits.request_timeout_s)
            followups_ok = followups_ok and reply.ok
            foreign = foreign_markers(reply.text(), tag, i) if reply.ok else []
            leaks += foreign
            out.events.append({"request": i, "result": "followup", "status": reply.status, "foreign_markers": foreign})

        used_delta = {r: _level(after, r, names.USED_METRIC) - base_used[r] for r in ("prefill", "decode")}
        phantom = sum(_level(after, r, names.RUNNING_METRIC) - base_running[r] for r in ("prefill", "decode"))
        seen = after["decode"].has(names.DEFERRED_METRIC)
        o_before, o_after = _outcomes(before), _outcomes(after)
        deferred = {k: int(o_after.get(k, 0) - o_before.get(k, 0)) for k in sorted(set(o_after) | set(o_before))}
        out.fields = {
            "abort.sent": n,
            "abort.aborted": counts["aborted"],
            "abort.completed": counts["completed"],
            "abort.failed": counts["failed"],
            "abort.started_idle": was_idle,
            "abort.settled": settled,
            "abort.settle_s": round(settle_took, 3),
            "abort.prefill_used_delta": int(used_delta["prefill"]),
            "abort.decode_used_delta": int(used_delta["decode"]),
            "abort.prefill_kv_back_to_baseline": used_delta["prefill"] <= 0,
            "abort.decode_kv_back_to_baseline": used_delta["decode"] <= 0,
            "abort.phantom_running": int(phantom),
            "abort.no_phantom_running": phantom <= 0,
            "abort.deferred_metric_seen": seen,
            "abort.deferred_outcomes": deferred,
            "abort.deferred_errors": deferred.get("error", 0),
            "abort.leak_seen": bool(leaks),
            "abort.followup_ok": followups_ok,
        }
        if used_delta["prefill"] > 0:
            out.problems.append(f"prefill KV usage {int(used_delta['prefill'])} tokens above its baseline")
        if used_delta["decode"] > 0:
            out.problems.append(f"decode KV usage {int(used_delta['decode'])} tokens above its baseline")
        if phantom > 0:
            out.problems.append(f"{int(phantom)} phantom running request(s) after every request ended")
        if leaks:
            out.problems.append(f"answers carried other requests' markers: {', '.join(sorted(set(leaks))[:4])}")
        return out
