"""The simulated 1P1D engine: admission, prefill, KV transfer, decode, abort.

The "model" repeats the code words (``ABC-12-x`` style tokens) it attends to and
pads with the first tokens of its KV span, greedily and deterministically: what a
well-behaved model does when asked to "repeat every code you see". Attending over
another tenant's stale pages therefore shows that tenant's markers, as the
incident reports describe. Tokens are whitespace-separated words.
"""

from __future__ import annotations

import itertools
import re
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from difflab.testing.testserver.config import TestServerConfig
from difflab.testing.testserver.pool import PagedKVPool

CODE_LIKE = re.compile(r"^[A-Z][A-Z0-9]*(?:-[A-Za-z0-9]+)+$")
PLACEHOLDER = "<placeholder>"

Event = tuple[str, Any]  # ("token", text so far) | ("done", body) | ("error", (status, body))


def respond(span: list[str | None], max_new: int) -> list[str]:
    """Code words first, in order, then the span's first tokens; exactly ``max_new`` tokens."""
    words = [t for t in span if t is not None]
    codes = [t for t in words if CODE_LIKE.match(t)]
    out = codes[:max_new]
    filler = [t for t in words if not CODE_LIKE.match(t)] or ["..."]
    for t in itertools.cycle(filler):
        if len(out) >= max_new:
            break
        out.append(t)
    return out


@dataclass
class SimRequest:
    rid: str
    tokens: list[str]
    max_new: int
    state: str = "prefill"  # prefill -> transfer -> decode -> done | aborted
    aborted: bool = False
    prefill_pages: list[int] = field(default_factory=list)
    decode_pages: list[int] = field(default_factory=list)
    decode_released: bool = False  # freed at abort while its write was in flight (pre-fix)
    held: bool = False  # deferred release: pages held until the write drains
    hold_resolved: bool = False
    changed: threading.Event = field(default_factory=threading.Event)


def _error(status: int, message: str) -> Event:
    return ("error", (status, {"error": {"message": message}, "object": "error"}))


class SimEngine:
    """State shared by the prefill, decode and router front ends of one test deployment."""

    def __init__(self, config: TestServerConfig) -> None:
        self.config = config
        self.pools = {
            "prefill": PagedKVPool(config.prefill_pool_tokens, config.page_size),
            "decode": PagedKVPool(config.decode_pool_tokens, config.page_size),
        }
        self.lock = threading.Lock()
        self.requests: dict[str, SimRequest] = {}
        self.running = {"prefill": 0, "decode": 0}
        self.phantoms = 0
        self.held = 0
        self.deferred_outcomes = {"drained": 0, "timeout": 0, "error": 0}
        self.stats: Counter[str] = Counter()  # for tests: what actually happened inside
        self.stop_event = threading.Event()
        self._ids = itertools.count()
        self.started_at = time.time()

    def stop(self) -> None:
        self.stop_event.set()

    # -- admission -------------------------------------------------------------------------------
    def generate(self, payload: dict[str, Any]) -> Iterator[Event]:
        text = payload.get("text")
        if not isinstance(text, str) or not text.strip():
            yield _error(400, "text must be a non-empty string")
            return
        params = payload.get("sampling_params") or {}
        max_new = int(params.get("max_new_tokens", 16))
        tokens = text.split()
        n, ctx = len(tokens), self.config.context_length
        if n + max_new > ctx:
            yield _error(
                400,
                f"Requested token count exceeds the model's maximum context length of {ctx} "
                f"tokens. You requested a total of {n + max_new} tokens: {n} tokens from the "
                f"input messages and {max_new} tokens for the completion.",
            )
            return
        rid = str(payload.get("rid") or f"sim-{next(self._ids)}")
        with self.lock:
            if rid in self.requests and self.requests[rid].state not in ("done", "aborted"):
                yield _error(400, f"duplicate request id {rid!r}")
                return
            req = SimRequest(rid, tokens, max_new)
            self.requests[rid] = req
        limit = self.pools["prefill"].capacity_tokens - 1
        if n > limit:
            if not self.config.admit_rejected:
                self.stats["rejected_at_intake"] += 1
                with self.lock:
                    req.state = "done"
                yield _error(
                    400,
                    f"Input length ({n} tokens) exceeds the maximum allowed length "
                    f"({limit} tokens). Use a shorter input or enable --allow-auto-truncate.",
                )
                return
            yield from self._stale_handoff(req)
            return
        yield from self._serve(req)

    def _alloc(self, role: str, req: SimRequest) -> list[int] | None:
        """Pages for the request, waiting (bounded) while the pool is full, as the scheduler queues."""
        deadline = time.monotonic() + self.config.wait_for_pages_s
        while True:
            pages = self.pools[role].alloc(len(req.tokens))
            if pages is not None or req.aborted or time.monotonic() > deadline:
                return pages
            if self.stop_event.wait(0.005):
                return None

    # -- the normal path ---------------------------------------------------------------------------
    def _serve(self, req: SimRequest) -> Iterator[Event]:
        pages_p = self._alloc("prefill", req)
        if pages_p is None:
            yield from (self._abort_reply(req) if req.aborted else self._failed(req, "prefill KV pool exhausted"))
            return
        with self.lock:
            req.prefill_pages = pages_p
            self.running["prefill"] += 1
        self.pools["prefill"].write_span(pages_p, req.tokens)
        pages_d = self._alloc("decode", req)
        with self.lock:
            if req.aborted or pages_d is None:
                if pages_d is not None:
                    self.pools["decode"].free(pages_d)
                self._release_prefill(req)
                req.state = "aborted" if req.aborted else "done"
            else:
                req.decode_pages = pages_d
                req.state = "transfer"
        if req.state != "transfer":
            yield from (self._abort_reply(req) if req.aborted else self._failed(req, "decode KV pool exhausted"))
            return
        threading.Thread(target=self._transfer, args=(req,), daemon=True, name=f"kv-{req.rid}").start()
        while not req.changed.wait(0.01):
            if self.stop_event.is_set():
                return
        if req.aborted:
            yield from self._abort_reply(req)
            return
        with self.lock:
            self._release_prefill(req)
            req.state = "decode"
            self.running["decode"] += 1
        yield from self._decode(req, req.decode_pages, len(req.tokens), sent=req.tokens)

    def _failed(self, req: SimRequest, message: str) -> Iterator[Event]:
        with self.lock:
            req.state = "done"
        yield _error(503, message)

    def _transfer(self, req: SimRequest) -> None:
        """The in-flight KV write: it lands page by page and cannot be called back."""
        pool, pages = self.pools["decode"], list(req.decode_pages)
        step = self.config.transfer_s / max(1, len(pages))
        for i, page in enumerate(pages):
            if self.stop_event.wait(step):
                return
            pool.write(page, 0, req.tokens[i * pool.page_size : (i + 1) * pool.page_size])
        with self.lock:
            if not req.aborted:
                req.changed.set()
                return
            if req.held and not req.hold_resolved:
                self._resolve_hold(req, "drained")  # every prefill rank acked: the write has drained
            elif req.decode_released:
                # Pre-fix: the pages went back to the pool at abort time, and this write just landed in
                # whoever holds them now; the completion path then re-registers the request.
                self.stats["late_writes"] += 1
                self.phantoms += 1
                pool.pin(pages)

    def _resolve_hold(self, req: SimRequest, outcome: str) -> None:
        req.hold_resolved = True
        self.held -= 1
        self.deferred_outcomes[outcome] += 1
        self.pools["decode"].free(req.decode_pages)

    def _hold_timeout(self, req: SimRequest) -> None:
        if self.stop_event.wait(self.config.deferred_timeout_s):
            return
        with self.lock:
            if not req.hold_resolved:
                self._resolve_hold(req, "timeout")

    def _release_prefill(self, req: SimRequest) -> None:
        if req.prefill_pages:
            if req.aborted and self.config.prefill_leaks_aborted:
                self.stats["prefill_leaks"] += 1  # pre-#36988: nothing released for an aborted result
            else:
                self.pools["prefill"].free(req.prefill_pages)
            req.prefill_pages = []
            self.running["prefill"] -= 1

    def _decode(self, req: SimRequest, pages: list[int], span_len: int, sent: list[str]) -> Iterator[Event]:
        """Attend over ``span_len`` slots; with the checksum on, first re-digest the ``sent`` range."""
        pool = self.pools["decode"]
        span = pool.read(pages, span_len)
        failed = None
        if self.config.checksum_active and span[: len(sent)] != sent:
            self.stats["checksum_mismatches"] += 1
            failed = _error(500, f"KV checksum mismatch for request {req.rid}: aborted")
        out = [] if failed else respond(span, req.max_new)
        produced: list[str] = []
        for tok in out:
            if req.aborted or self.stop_event.wait(self.config.decode_token_s):
                break
            produced.append(tok)
            yield ("token", (" ".join(produced), len(produced), len(req.tokens)))
        with self.lock:
            pool.free(pages)
            self.running["decode"] -= 1
            aborted = req.aborted
            req.state = "aborted" if aborted else "done"
        if failed:
            yield failed
        elif aborted:
            yield from self._abort_reply(req, " ".join(produced))
        else:
            yield ("done", self._body(req, " ".join(produced), len(produced), "length"))

    # -- the pre-#38935 path -----------------------------------------------------------------------
    def _stale_handoff(self, req: SimRequest) -> Iterator[Event]:
        """An intake-rejected request admitted anyway: decode reserves the full prompt, one page arrives."""
        self.stats["stale_handoffs"] += 1
        pages = self._alloc("decode", req)
        if pages is None:
            yield _error(503, "decode KV pool exhausted")
            return
        self.pools["decode"].write(pages[0], 0, [PLACEHOLDER])  # the one-token placeholder prompt
        if self.config.rejected_hang_s and self.stop_event.wait(self.config.rejected_hang_s):
            return
        with self.lock:
            req.state = "decode"
            self.running["decode"] += 1
        yield from self._decode(req, pages, len(req.tokens), sent=[PLACEHOLDER])

    # -- abort -------------------------------------------------------------------------------------
    def abort(self, rid: str | None, abort_all: bool = False) -> int:
        """Abort one request (or all); returns how many live requests were hit."""
        with self.lock:
            if abort_all:
                targets = [r for r in self.requests.values() if r.state not in ("done", "aborted")]
            else:
                r = self.requests.get(rid or "")
                targets = [r] if r is not None and r.state not in ("done", "aborted") else []
            for req in targets:
                req.aborted = True
                if req.state == "transfer":
                    self._abort_in_flight(req)
                req.changed.set()
            return len(targets)

    def _abort_in_flight(self, req: SimRequest) -> None:
        """Abort while the KV write is still landing: hold the pages (fixed) or free them now (pre-fix)."""
        self.stats["aborts_mid_transfer"] += 1
        if self.config.deferred_release:
            req.held = True
            self.held += 1
            threading.Thread(target=self._hold_timeout, args=(req,), daemon=True).start()
        else:
            req.decode_released = True
            self.pools["decode"].free(req.decode_pages)
        self._release_prefill(req)
        req.state = "aborted"

    def _abort_reply(self, req: SimRequest, text: str = "") -> Iterator[Event]:
        with self.lock:
            if req.state not in ("done", "aborted"):
                self._release_prefill(req)
                req.state = "aborted"
        body = self._body(req, text, len(text.split()), "abort")
        body["meta_info"]["finish_reason"]["message"] = "Abort request"
        yield ("done", body)

    def _body(self, req: SimRequest, text: str, completion: int, finish: str) -> dict[str, Any]:
        reason: dict[str, Any] = {"type": finish}
        if finish == "length":
            reason["length"] = completion
        return {
            "text": text,
            "meta_info": {
                "id": req.rid,
                "finish_reason": reason,
                "prompt_tokens": len(req.tokens),
                "completion_tokens": completion,
                "cached_tokens": 0,
            },
        }

    # -- what the front ends report ----------------------------------------------------------------
    def snapshot(self, role: str) -> dict[str, float]:
        with self.lock:
            running = self.running[role] + (self.phantoms if role == "decode" else 0)
            pool = self.pools[role]
            return {
                "max_total_num_tokens": pool.capacity_tokens,
                "num_used_tokens": pool.used_tokens,
                "num_running_reqs": running,
                "held": self.held,
                **{f"deferred_{k}": v for k, v in self.deferred_outcomes.items()},
            }
