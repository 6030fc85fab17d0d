"""What every scenario gets (the three endpoints, limits) and returns (observation fields)."""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from difflab.engine.client import EngineClient
from difflab.engine.facts import EngineFacts, read_engine

MARKER = re.compile(r"CANARY-[0-9a-f]+-\d+-[SE]")
FILLER = ("the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while", "rain", "falls")


class ScenarioUnavailable(Exception):
    """The deployment cannot host this scenario (e.g. pool >= context); the message says how to fix it."""


@dataclass
class Endpoints:
    """One side's deployment: requests go through the router, metrics and aborts to the engines."""

    router: EngineClient
    prefill: EngineClient
    decode: EngineClient

    @classmethod
    def from_urls(cls, router: str, prefill: str, decode: str, timeout_s: float = 30.0) -> Endpoints:
        return cls(EngineClient(router, timeout_s), EngineClient(prefill, timeout_s), EngineClient(decode, timeout_s))

    def facts(self) -> dict[str, EngineFacts]:
        return {"prefill": read_engine("prefill", self.prefill), "decode": read_engine("decode", self.decode)}


@dataclass
class Limits:
    """Every bound a scenario obeys: request counts, timeouts, settle windows (GPU defaults)."""

    request_timeout_s: float = 60.0  # one request; the pre-#38935 decode waited 300 s
    at_once_s: float = 5.0  # a rejection slower than this is not "at once"
    settle_s: float = 45.0  # after an abort storm: the deferred-release timeout is set to 10 s
    poll_s: float = 0.25
    max_new_tokens: int = 64
    canary_fractions: tuple[float, ...] = (0.5, 0.9, 1.1, 1.3)  # prompt length / smallest KV pool
    canary_short_tokens: int = 24
    canary_behind_s: float = 0.02  # the short request follows the long one this closely
    abort_requests: int = 8
    abort_prompt_fraction: float = 0.1  # of the smallest KV pool
    abort_stagger_s: float = 0.15  # launch spacing: aborted pages get reused while writes land
    abort_delays_s: tuple[float, ...] = (0.0, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32)
    abort_followups: int = 3


@dataclass
class Outcome:
    """A scenario's observation: flat ``"<scenario>.<field>"`` JSON fields plus per-request events."""

    fields: dict[str, Any] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


class Scenario(Protocol):
    name: str  # the probe name in observations and verdicts
    needs_content: bool  # True: real weights (markers must be echoed); False: --load-format dummy is fine

    def run(self, ep: Endpoints, limits: Limits) -> Outcome: ...


def run_tag() -> str:
    """A fresh marker namespace, so markers from an earlier run can never be mistaken for this one's."""
    return secrets.token_hex(3)


def marker(tag: str, index: int, end: str) -> str:
    return f"CANARY-{tag}-{index:03d}-{end}"


def canary_prompt(tag: str, index: int, body_words: int) -> str:
    """Start marker first and end marker last; between them an instruction and filler words."""
    head = [marker(tag, index, "S"), "Repeat", "every", "CANARY", "code", "you", "see."]
    filler = [FILLER[i % len(FILLER)] for i in range(max(0, body_words - len(head)))]
    return " ".join([*head, *filler, marker(tag, index, "E")])


def foreign_markers(text: str, tag: str, index: int) -> list[str]:
    """Markers in ``text`` that belong to any request but this one (any run, any tag)."""
    own = {marker(tag, index, "S"), marker(tag, index, "E")}
    return sorted({m for m in MARKER.findall(text) if m not in own})


def words_for_tokens(tokens: int, tokens_per_word: float) -> int:
    return max(1, int(tokens / tokens_per_word))


def calibrate(router: EngineClient, limits: Limits) -> tuple[float, bool]:
    """Tokens per filler word, measured through the real tokenizer (``meta_info.prompt_tokens``)."""
    words = 200
    reply = router.generate(canary_prompt("0000aa", 0, words), max_new_tokens=1, timeout=limits.request_timeout_s)
    prompt_tokens = reply.meta().get("prompt_tokens")
    if not reply.ok or not isinstance(prompt_tokens, int) or prompt_tokens <= 0:
        return 1.0, False
    return prompt_tokens / words, True


def capacity(ep: Endpoints) -> tuple[int, int, dict[str, str]]:
    """Smallest KV pool and smallest context length over both roles, and where each came from."""
    facts = ep.facts()
    pools = {r: f.pool_tokens() for r, f in facts.items()}
    ctxs = {r: f.context_len() for r, f in facts.items()}
    missing = [f"{r} KV pool" for r, v in pools.items() if v is None] + [
        f"{r} context length" for r, v in ctxs.items() if v is None
    ]
    if missing:
        errors = "; ".join(e for f in facts.values() for e in f.errors)
        raise ScenarioUnavailable(f"cannot read {', '.join(missing)} from the engines ({errors or 'not reported'})")
    sources = {f"{r}_pool": v.source for r, v in pools.items() if v} | {
        f"{r}_context": v.source for r, v in ctxs.items() if v
    }
    return (min(v.value for v in pools.values() if v), min(v.value for v in ctxs.values() if v), sources)


def wait_until(predicate: Callable[[], bool], timeout_s: float, poll_s: float) -> bool:
    """Poll ``predicate`` until true or ``timeout_s`` passes (bounded: a scenario never hangs)."""
    deadline = time.monotonic() + timeout_s
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll_s)
