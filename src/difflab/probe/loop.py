"""The event loop of the warm back end's processes: descriptors to read, deadlines, one step per wake-up.

The hub (:mod:`difflab.probe.hub`) and each source server (:mod:`difflab.probe.source_server`)
wait for the same three things: a line on a pipe, a child that ended (SIGCHLD through
:class:`~difflab.probe.process.ChildWatch`'s pipe) and a deadline (an import or a probe that
takes too long). :class:`Loop` is that wait, written once on :mod:`selectors`: each
process registers what it reads and when it must act, and says what to do after every
wake-up (reap children, stop at end of input). Standard library only, like the rest of
:mod:`difflab.probe`.
"""

from __future__ import annotations

import contextlib
import selectors
import time
from collections.abc import Callable, Hashable


class Loop:
    """Call a reader's function when its descriptor is readable, a deadline's when it is due."""

    def __init__(self) -> None:
        self._selector = selectors.DefaultSelector()
        self._deadlines: dict[Hashable, tuple[float, Callable[[], None]]] = {}

    def read(self, fd: int, on_readable: Callable[[], None]) -> None:
        """Call ``on_readable()`` whenever ``fd`` has something to read (or its writer is gone)."""
        self._selector.register(fd, selectors.EVENT_READ, on_readable)

    def forget(self, fd: int) -> None:
        """Stop watching ``fd`` (before it is closed: a closed descriptor's number is soon reused)."""
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(fd)

    def at(self, key: Hashable, when: float, on_due: Callable[[], None]) -> None:
        """Call ``on_due()`` once, at ``time.monotonic() >= when``; a second call with ``key`` moves it."""
        self._deadlines[key] = (when, on_due)

    def cancel(self, key: Hashable) -> None:
        self._deadlines.pop(key, None)

    def run(self, after_wake: Callable[[], None]) -> None:
        """Wait and dispatch forever; ``after_wake()`` runs after every wake-up and may end the process."""
        while True:
            self.step()
            after_wake()

    def step(self) -> None:
        """One wait: the readable descriptors' functions, then the deadlines now due."""
        due = min((when for when, _ in self._deadlines.values()), default=None)
        timeout = None if due is None else max(0.0, due - time.monotonic())
        for key, _ in self._selector.select(timeout):
            if self._selector.get_map().get(key.fd) is key:  # still watched: an earlier function may have stopped it
                key.data()
        now = time.monotonic()
        for name, (when, on_due) in list(self._deadlines.items()):
            if when <= now and self._deadlines.get(name) == (when, on_due):
                del self._deadlines[name]
                on_due()

    def fileno(self) -> int:
        """The selector's own descriptor (a forked child closes it: it is not the child's loop)."""
        return self._selector.fileno()  # type: ignore[attr-defined]

    def close(self) -> None:
        self._selector.close()
