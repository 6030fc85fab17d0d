"""The zmq wire between decode and prefill, replaced by recording sockets.

Only the socket is fake: SGLang's own code builds every frame, picks the
endpoint and takes the per-endpoint lock. Each fake PUSH socket is a strict
kit fake that accepts ``send_multipart`` and nothing else, so a code path that
needs more of zmq (a monitor, a new connection) is reported, never guessed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from difflab.probe.kit import Kit, StrictFake


def tcp_endpoint(ip: str, port: int) -> str:
    """The endpoint string SGLang itself derives for ``ip:port``."""
    from sglang.srt.utils.network import NetworkAddress

    return NetworkAddress(ip, port).to_tcp()


@dataclass
class Wire:
    """Every multipart message sent through the fake sockets, in order."""

    kit: Kit
    sent: list[tuple[str, list[bytes]]] = field(default_factory=list)
    _sockets: dict[str, StrictFake] = field(default_factory=dict)
    _refusals: dict[str, list[tuple[bytes | None, BaseException]]] = field(default_factory=dict)
    _replies: list[tuple[str, bytes, Callable[[list[bytes]], None]]] = field(default_factory=list)
    listeners: list[Callable[[str, list[bytes]], None]] = field(default_factory=list)
    """Called with (endpoint, frames) for every message sent, after it is kept: a peer that reads the wire."""

    def refuse_next(self, endpoint: str, exc: BaseException, *, about: bytes | None = None) -> None:
        """The next send to ``endpoint`` (naming ``about`` in its first two frames, if given) raises ``exc``.

        The message is not sent. ``exc`` is a ``kit.intended_failure`` instance; ``about`` (a
        room) picks that room's message where others share the socket (the one-off registration
        of decode's buffers); back ends put the room first or right after a tag frame.
        """
        self._refusals.setdefault(endpoint, []).append((about, exc))

    def reply_on_send(self, endpoint: str, tag: bytes, reply: Callable[[list[bytes]], None]) -> None:
        """Once a ``tag`` message has gone to ``endpoint``, run ``reply(frames)`` before the sender goes on.

        Models a peer that answers at once -- its reply handled by the receiving
        thread while the sending thread is still busy (sending to the next rank).
        """
        self._replies.append((endpoint, tag, reply))

    def unanswered(self) -> int:
        """Replies set up with :meth:`reply_on_send` whose message never went out."""
        return len(self._replies)

    def socket(self, endpoint: str) -> StrictFake:
        """The (one) fake PUSH socket connected to ``endpoint``."""
        if endpoint not in self._sockets:

            def send_multipart(frames: list[bytes], *args: Any, **kwargs: Any) -> None:
                message = [bytes(f) for f in frames]
                for refusal in self._refusals.get(endpoint, []):
                    if refusal[0] is None or refusal[0] in message[:2]:
                        self._refusals[endpoint].remove(refusal)
                        raise refusal[1]
                self.sent.append((endpoint, message))
                for listener in self.listeners:
                    listener(endpoint, message)
                for entry in list(self._replies):
                    if entry[0] == endpoint and message and message[0] == entry[1]:
                        self._replies.remove(entry)
                        entry[2](message)

            self._sockets[endpoint] = self.kit.fake(
                f"zmq socket to {endpoint}",
                send_multipart=self.kit.recorder(f"send_multipart({endpoint})", side_effect=send_multipart),
            )
        return self._sockets[endpoint]

    def sockets(self, *endpoints: str) -> dict[str, StrictFake]:
        """A socket cache pre-filled for ``endpoints`` (what SGLang looks up before connecting)."""
        return {ep: self.socket(ep) for ep in endpoints}

    @staticmethod
    def locks(*endpoints: str) -> dict[str, threading.Lock]:
        return {ep: threading.Lock() for ep in endpoints}

    def messages(self, tag: bytes, endpoint: str | None = None) -> list[list[bytes]]:
        """Messages whose first frame is ``tag`` (optionally to one endpoint)."""
        return [f for ep, f in self.sent if f and f[0] == tag and (endpoint is None or ep == endpoint)]

    def count(self, tag: bytes, endpoint: str | None = None) -> int:
        return len(self.messages(tag, endpoint))

    def count_distinct(self, tag: bytes, endpoint: str | None = None, since: int = 0) -> int:
        """``tag`` messages (after the first ``since`` sent), a byte-identical repeat to the same endpoint once.

        Where the protocol is idempotent (a drain ack decode keeps in a per-rank set, an
        ABORT for a room already aborting) a repeat changes nothing, so a control
        counts the effect, not the frames.
        """
        return len(
            {
                (ep, tuple(f))
                for ep, f in self.sent[since:]
                if f and f[0] == tag and (endpoint is None or ep == endpoint)
            }
        )
