"""Canary markers: does any answer carry another request's text?

Each prompt starts and ends with a unique marker; lengths grow around the KV pool
size, and a short request follows each long one closely. Pages are never zeroed,
so a request that attends over pages it did not write shows other tenants'
markers: any foreign marker in any answer is a leak.
"""

from __future__ import annotations

import threading
import time

from difflab.engine.client import Reply
from difflab.gpu.scenarios.base import (
    Endpoints,
    Limits,
    Outcome,
    calibrate,
    canary_prompt,
    capacity,
    foreign_markers,
    run_tag,
    words_for_tokens,
)


class CanaryLeak:
    name = "gpu_canary_leak"
    needs_content = True  # the markers must be echoed: real weights, not --load-format dummy

    def run(self, ep: Endpoints, limits: Limits) -> Outcome:
        pool, context, _ = capacity(ep)
        ratio, calibrated = calibrate(ep.router, limits)
        tag = run_tag()
        room = context - limits.max_new_tokens - 8
        lengths = sorted({min(room, int(pool * f)) for f in limits.canary_fractions})
        out = Outcome()
        leaks: list[dict[str, object]] = []
        long_statuses: list[int] = []
        short_ok = True
        index = 10
        for length in lengths:
            long_i, short_i = index, index + 1
            index += 2
            replies: dict[int, Reply] = {}

            def send(i: int, tokens: int, replies: dict[int, Reply] = replies) -> None:
                replies[i] = ep.router.generate(
                    canary_prompt(tag, i, words_for_tokens(tokens, ratio)),
                    max_new_tokens=limits.max_new_tokens,
                    timeout=limits.request_timeout_s,
                )

            worker = threading.Thread(target=send, args=(long_i, length), daemon=True)
            worker.start()
            time.sleep(limits.canary_behind_s)
            send(short_i, limits.canary_short_tokens)
            worker.join(limits.request_timeout_s + 5)
            for i, kind, tokens in ((long_i, "long", length), (short_i, "short", limits.canary_short_tokens)):
                reply = replies.get(i)
                status = reply.status if reply else 0
                if kind == "long":
                    long_statuses.append(status)
                elif not (reply and reply.ok):
                    short_ok = False
                foreign = foreign_markers(reply.text(), tag, i) if reply and reply.ok else []
                event = {
                    "request": i,
                    "kind": kind,
                    "tokens": tokens,
                    "status": status,
                    "elapsed_s": round(reply.elapsed_s, 3) if reply else None,
                    "foreign_markers": foreign,
                }
                out.events.append(event)
                if foreign:
                    leaks.append(event)
                    out.problems.append(
                        f"{kind} request {i} ({tokens} tokens, status {status}) carried "
                        f"other requests' markers: {', '.join(foreign[:4])}"
                    )
        out.fields = {
            "canary.requests": 2 * len(lengths),
            "canary.lengths": lengths,
            "canary.pool_tokens": pool,
            "canary.leaks": len(leaks),
            "canary.leak_seen": bool(leaks),
            "canary.long_statuses": long_statuses,
            "canary.short_requests_ok": short_ok,
            "canary.calibrated": calibrated,
        }
        return out
