"""#38935 on a live deployment: a prompt longer than the KV pool but within the context length.

The fixed build retires it at intake and answers 400 at once; before the fix it
was handed off anyway and answered 200 with a stranger's text, or sat until the
decode's 300 s waiting timeout.
"""

from __future__ import annotations

from difflab.gpu.scenarios.base import (
    Endpoints,
    Limits,
    Outcome,
    ScenarioUnavailable,
    calibrate,
    canary_prompt,
    capacity,
    run_tag,
    words_for_tokens,
)


def classify(status: int, timed_out: bool) -> str:
    if timed_out:
        return "timeout"
    if status == 400:
        return "rejected"
    if status == 200:
        return "accepted"
    return f"error:{status}"


class OversizedPrompt:
    name = "gpu_oversized_prompt"
    needs_content = False

    def run(self, ep: Endpoints, limits: Limits) -> Outcome:
        pool, context, sources = capacity(ep)
        room = context - limits.max_new_tokens
        if pool >= room:
            raise ScenarioUnavailable(
                f"KV pool ({pool} tokens) is not smaller than the context length ({context}) minus "
                f"{limits.max_new_tokens} new tokens: no prompt is over the pool yet within the context; "
                "start the prefill with a smaller --max-total-tokens"
            )
        ratio, calibrated = calibrate(ep.router, limits)
        target = (pool + room) // 2
        tag = run_tag()
        control = ep.router.generate(canary_prompt(tag, 1, 32), max_new_tokens=8, timeout=limits.request_timeout_s)
        reply = ep.router.generate(
            canary_prompt(tag, 2, words_for_tokens(target, ratio)),
            max_new_tokens=limits.max_new_tokens,
            timeout=limits.request_timeout_s,
        )
        outcome = classify(reply.status, reply.timed_out)
        prompt_tokens = reply.meta().get("prompt_tokens")
        out = Outcome()
        out.fields = {
            "oversized.status": reply.status,
            "oversized.outcome": outcome,
            "oversized.elapsed_s": round(reply.elapsed_s, 3),
            "oversized.rejected_at_once": outcome == "rejected" and reply.elapsed_s <= limits.at_once_s,
            "oversized.prompt_tokens_target": target,
            "oversized.pool_tokens": pool,
            "oversized.context_len": context,
            "oversized.tokens_per_word": round(ratio, 4),
            "oversized.calibrated": calibrated,
            "oversized.control_ok": control.ok,
        }
        out.events = [
            {"request": "control", "status": control.status, "elapsed_s": round(control.elapsed_s, 3)},
            {
                "request": "oversized",
                "status": reply.status,
                "elapsed_s": round(reply.elapsed_s, 3),
                "error": reply.error,
                "prompt_tokens": prompt_tokens,
                "body": reply.excerpt(),
                "sources": sources,
            },
        ]
        if outcome == "accepted":
            out.problems.append(
                f"a {target}-token prompt over a {pool}-token pool was answered 200: {reply.text()[:120]!r}"
            )
        return out
