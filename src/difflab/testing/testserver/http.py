"""HTTP front ends of a test deployment: prefill, decode and a mini-lb style router.

Stdlib ``ThreadingHTTPServer`` bound to 127.0.0.1 on ephemeral ports only; every
worker thread is a daemon and every wait inside the engine ends when the
deployment stops, so a test can never leave a server behind.
"""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from difflab.testing.testserver import exposition
from difflab.testing.testserver.config import TestServerConfig
from difflab.testing.testserver.engine import Event, SimEngine

LOOPBACK = "127.0.0.1"


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = False
    # socketserver's default backlog is 5: a burst of concurrent connects (abort storm, load generator)
    # on a busy machine overflows it, and the kernel's SYN retransmits then stall a client for seconds.
    request_queue_size = 128

    def __init__(self, role: str, engine: SimEngine) -> None:
        self.role = role
        self.engine = engine
        super().__init__((LOOPBACK, 0), _Handler)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.0"
    disable_nagle_algorithm = True  # stream tokens as they are made, as a real server's SSE does

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - signature from the base class
        pass  # quiet: tests read results, not access logs

    # -- plumbing ------------------------------------------------------------------------------
    def _send(self, status: int, body: Any, content_type: str = "application/json") -> None:
        data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (a timeout under test); nothing to tell it

    def _json_body(self) -> dict[str, Any] | None:
        length = int(self.headers.get("Content-Length") or 0)
        try:
            data = json.loads(self.rfile.read(length) or b"{}")
        except json.JSONDecodeError:
            return None
        return data if isinstance(data, dict) else None

    # -- routes --------------------------------------------------------------------------------
    def do_GET(self) -> None:  # noqa: N802 - http.server naming
        engine, role, cfg = self.server.engine, self.server.role, self.server.engine.config
        path = self.path.split("?")[0]
        if path == "/health":
            self._send(200, "", "text/plain")
        elif path in cfg.model_info_paths:
            self._send(200, exposition.model_info(engine))
        elif path in cfg.server_info_paths and role != "router":
            self._send(200, exposition.server_info(engine, role))
        elif path == "/metrics" and role != "router":
            self._send(200, exposition.metrics_text(engine, role), "text/plain; version=0.0.4")
        else:
            self._send(404, {"detail": "Not Found"})

    def do_POST(self) -> None:  # noqa: N802 - http.server naming
        engine, role = self.server.engine, self.server.role
        path = self.path.split("?")[0]
        payload = self._json_body()
        if payload is None:
            self._send(400, {"error": {"message": "body must be a JSON object"}})
        elif path == "/generate" and role == "router":
            self._generate(payload)
        elif path == "/generate":
            self._send(400, {"error": {"message": f"{role} engine in PD mode: send requests through the router"}})
        elif path == "/abort_request" and role != "router":
            hit = engine.abort(payload.get("rid"), bool(payload.get("abort_all")))
            self._send(200, {"success": True, "aborted": hit})
        else:
            self._send(404, {"detail": "Not Found"})

    def _generate(self, payload: dict[str, Any]) -> None:
        events = self.server.engine.generate(payload)
        if payload.get("stream"):
            self._stream(events)
            return
        for kind, data in events:
            if kind == "done":
                self._send(200, data)
                return
            if kind == "error":
                status, body = data
                self._send(status, body)
                return
        # the engine stopped mid-request (deployment shutting down): drop the connection

    def _stream(self, events: Iterator[Event]) -> None:
        try:
            first = next(events, None)
            if first is not None and first[0] == "error":
                status, body = first[1]
                self._send(status, body)
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            pending = [first] if first is not None else []
            for kind, data in itertools.chain(pending, events):
                if kind == "token":
                    text, completion, prompt = data
                    chunk = {
                        "text": text,
                        "meta_info": {"completion_tokens": completion, "prompt_tokens": prompt},
                    }
                elif kind == "done":
                    chunk = data
                else:
                    chunk = {"error": data[1]["error"]}
                self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                self.wfile.flush()
            self.wfile.write(b"data: [DONE]\n\n")
        except (BrokenPipeError, ConnectionResetError):
            pass


class TestDeployment:
    """A simulated 1P1D deployment plus router on loopback; use as a context manager."""

    __test__ = False  # not a pytest test class despite the name

    def __init__(self, config: TestServerConfig | None = None) -> None:
        self.config = config or TestServerConfig()
        self.engine: SimEngine | None = None
        self._servers: dict[str, _Server] = {}
        self._threads: list[threading.Thread] = []

    def start(self) -> TestDeployment:
        if self.engine is not None:
            return self
        self.engine = SimEngine(self.config)
        for role in ("prefill", "decode", "router"):
            server = _Server(role, self.engine)
            thread = threading.Thread(
                target=server.serve_forever,
                kwargs={"poll_interval": 0.05},
                daemon=True,
                name=f"testserver-{role}",
            )
            thread.start()
            self._servers[role] = server
            self._threads.append(thread)
        return self

    def stop(self) -> None:
        if self.engine is None:
            return
        self.engine.stop()
        for server in self._servers.values():
            server.shutdown()
            server.server_close()
        for thread in self._threads:
            thread.join(timeout=2.0)
        self._servers.clear()
        self._threads.clear()
        self.engine = None

    def url(self, role: str) -> str:
        host, port = self._servers[role].server_address[:2]
        return f"http://{host}:{port}"

    @property
    def prefill_url(self) -> str:
        return self.url("prefill")

    @property
    def decode_url(self) -> str:
        return self.url("decode")

    @property
    def router_url(self) -> str:
        return self.url("router")

    def __enter__(self) -> TestDeployment:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
