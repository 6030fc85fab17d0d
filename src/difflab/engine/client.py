"""A small HTTP client for SGLang's native endpoints, the one interface every scenario uses.

The scenarios, the preflight and the throughput load generator speak only through
this class, so they run unchanged against real engines (containers on a GPU host)
and against :mod:`difflab.testing.testserver`. Standard library only: a scenario must
see status codes and timeouts exactly as they happened, without a retrying layer.
"""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from difflab.engine.metrics import MetricSet, parse
from difflab.errors import DifflabError

DEFAULT_TIMEOUT_S = 30.0


class EngineError(DifflabError):
    """An engine did not answer an endpoint the caller cannot do without."""


@dataclass
class Reply:
    """What one request got: ``status`` 0 means no HTTP answer (see ``error``)."""

    status: int
    body: Any
    elapsed_s: float
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == 200

    @property
    def timed_out(self) -> bool:
        return self.error == "timeout"

    def text(self) -> str:
        """The generated text of a /generate answer ('' when there is none)."""
        if isinstance(self.body, dict):
            value = self.body.get("text")
            return value if isinstance(value, str) else ""
        return ""

    def meta(self) -> dict[str, Any]:
        if isinstance(self.body, dict) and isinstance(self.body.get("meta_info"), dict):
            return self.body["meta_info"]
        return {}

    def finish_type(self) -> str | None:
        reason = self.meta().get("finish_reason")
        return reason.get("type") if isinstance(reason, dict) else None

    def excerpt(self, limit: int = 200) -> str:
        shown = self.body if isinstance(self.body, str) else json.dumps(self.body, sort_keys=True)
        return shown[:limit]


@dataclass
class StreamReply:
    """A streamed /generate: first-token and inter-token times as the client saw them."""

    status: int
    text: str = ""
    ttft_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    elapsed_s: float = 0.0
    completion_tokens: int = 0
    prompt_tokens: int = 0
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.error is None


class EngineClient:
    """One engine (or the router) at ``base_url``, e.g. ``http://127.0.0.1:30000``."""

    def __init__(self, base_url: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        parts = urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname:
            raise EngineError(f"{base_url!r}: expected an http://HOST:PORT URL")
        self.base_url = base_url.rstrip("/")
        self.host = parts.hostname
        self.port = parts.port or 80
        self.timeout_s = timeout_s
        self.model_info_path: str | None = None
        self.server_info_path: str | None = None

    def __repr__(self) -> str:
        return f"EngineClient({self.base_url!r})"

    # -- transport ---------------------------------------------------------------------------
    def _connect(self, timeout: float) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    def request(self, method: str, path: str, payload: Any = None, timeout: float | None = None) -> Reply:
        """One request; never raises for network trouble: the reply says what happened."""
        timeout = self.timeout_s if timeout is None else timeout
        start = time.monotonic()
        conn = self._connect(timeout)
        try:
            body = None if payload is None else json.dumps(payload).encode()
            headers = {"Content-Type": "application/json"} if body is not None else {}
            conn.request(method, path, body=body, headers=headers)
            resp = conn.getresponse()
            raw = resp.read()
            return Reply(resp.status, _decode(raw, resp.getheader("Content-Type", "")), time.monotonic() - start)
        except TimeoutError:
            return Reply(0, None, time.monotonic() - start, "timeout")
        except (OSError, http.client.HTTPException) as exc:
            return Reply(0, None, time.monotonic() - start, f"{type(exc).__name__}: {exc}")
        finally:
            conn.close()

    def get(self, path: str, timeout: float | None = None) -> Reply:
        return self.request("GET", path, timeout=timeout)

    def post(self, path: str, payload: Any, timeout: float | None = None) -> Reply:
        return self.request("POST", path, payload, timeout=timeout)

    # -- endpoints ---------------------------------------------------------------------------
    def health(self, timeout: float = 5.0) -> bool:
        return self.get("/health", timeout=timeout).ok

    def generate(
        self,
        text: str,
        *,
        max_new_tokens: int,
        rid: str | None = None,
        timeout: float | None = None,
        **sampling: Any,
    ) -> Reply:
        """Greedy, length-bounded generation (``ignore_eos`` keeps completion lengths comparable)."""
        return self.post("/generate", _generate_payload(text, max_new_tokens, rid, False, sampling), timeout)

    def generate_stream(
        self,
        text: str,
        *,
        max_new_tokens: int,
        rid: str | None = None,
        timeout: float | None = None,
        **sampling: Any,
    ) -> StreamReply:
        """Streamed generation (SSE ``data:`` lines, cumulative text), timing each chunk on arrival."""
        timeout = self.timeout_s if timeout is None else timeout
        payload = _generate_payload(text, max_new_tokens, rid, True, sampling)
        start = time.monotonic()
        conn = self._connect(timeout)
        out = StreamReply(status=0)
        try:
            conn.request(
                "POST",
                "/generate",
                body=json.dumps(payload).encode(),
                headers={"Content-Type": "application/json"},
            )
            resp = conn.getresponse()
            out.status = resp.status
            if resp.status != 200:
                out.error = repr(_decode(resp.read(), resp.getheader("Content-Type", "")))[:200]
                return out
            last = start
            for event in _sse_events(resp):
                now = time.monotonic()
                if not isinstance(event, dict):
                    continue
                if "error" in event:
                    out.error = json.dumps(event["error"])[:200]
                    break
                meta = event.get("meta_info") or {}
                tokens = int(meta.get("completion_tokens", out.completion_tokens) or 0)
                text = event.get("text", out.text) or out.text
                if tokens == out.completion_tokens and text == out.text:
                    continue  # a chunk without new tokens (e.g. the closing one) is not a token arrival
                if out.ttft_s is None:
                    out.ttft_s = now - start
                else:
                    out.itl_s.append(now - last)
                last = now
                out.text, out.completion_tokens = text, tokens
                out.prompt_tokens = int(meta.get("prompt_tokens", out.prompt_tokens) or 0)
        except TimeoutError:
            out.error = "timeout"
        except (OSError, http.client.HTTPException) as exc:
            out.error = f"{type(exc).__name__}: {exc}"
        finally:
            out.elapsed_s = time.monotonic() - start
            conn.close()
        return out

    def abort_request(self, rid: str | None = None, *, abort_all: bool = False, timeout: float = 10.0) -> Reply:
        payload: dict[str, Any] = {"abort_all": abort_all}
        if rid is not None:
            payload["rid"] = rid
        return self.post("/abort_request", payload, timeout)

    def _first_answering(self, paths: tuple[str, ...], what: str, timeout: float) -> tuple[str, dict[str, Any]]:
        tried = []
        for path in paths:
            reply = self.get(path, timeout=timeout)
            if reply.ok and isinstance(reply.body, dict):
                return path, reply.body
            tried.append(f"{path} -> {reply.status or reply.error}")
            if reply.status not in (404, 405):
                break  # the endpoint exists but failed: do not mask that with an older name
        raise EngineError(f"{self.base_url}: no {what} ({'; '.join(tried)})")

    def model_info(self, timeout: float = 10.0) -> dict[str, Any]:
        """``/model_info``, or ``/get_model_info`` on engines that predate the rename."""
        self.model_info_path, body = self._first_answering(("/model_info", "/get_model_info"), "model info", timeout)
        return body

    def server_info(self, timeout: float = 10.0) -> dict[str, Any]:
        """``/server_info``, or ``/get_server_info`` on older engines."""
        self.server_info_path, body = self._first_answering(
            ("/server_info", "/get_server_info"), "server info", timeout
        )
        return body

    def metrics(self, timeout: float = 10.0) -> MetricSet:
        """Scrape ``/metrics`` (needs ``--enable-metrics`` on the engine)."""
        reply = self.get("/metrics", timeout=timeout)
        if not reply.ok or not isinstance(reply.body, str):
            raise EngineError(
                f"{self.base_url}/metrics -> {reply.status or reply.error} "
                "(is the engine started with --enable-metrics?)"
            )
        return parse(reply.body)


def _generate_payload(
    text: str, max_new_tokens: int, rid: str | None, stream: bool, sampling: dict[str, Any]
) -> dict[str, Any]:
    params = {"max_new_tokens": max_new_tokens, "temperature": 0.0, "ignore_eos": True, **sampling}
    payload: dict[str, Any] = {"text": text, "sampling_params": params, "stream": stream}
    if rid is not None:
        payload["rid"] = rid
    return payload


def _decode(raw: bytes, content_type: str) -> Any:
    text = raw.decode("utf-8", errors="replace")
    if "json" in content_type or text[:1] in ("{", "["):
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            return text
    return text


def _sse_events(resp: http.client.HTTPResponse) -> Iterator[Any]:
    """Yield decoded ``data:`` payloads until ``[DONE]`` or the end of the body."""
    while True:
        line = resp.readline()
        if not line:
            return
        line = line.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            return
        try:
            yield json.loads(data)
        except json.JSONDecodeError:
            yield data.decode("utf-8", errors="replace")
