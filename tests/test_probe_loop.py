"""The warm back end's one loop: a readable pipe calls its reader, a due deadline its function, once.

Real pipes and real time (short deadlines), as the hub and source servers use it.
"""

from __future__ import annotations

import os
import time

from difflab.probe.loop import Loop


def test_a_reader_runs_when_its_pipe_has_data_and_not_after_it_is_forgotten() -> None:
    loop = Loop()
    r, w = os.pipe()
    seen: list[bytes] = []
    loop.read(r, lambda: seen.append(os.read(r, 100)))
    os.write(w, b"one")
    loop.at("guard", time.monotonic() + 5, lambda: seen.append(b"timeout"))
    loop.step()
    assert seen == [b"one"]
    loop.forget(r)
    loop.forget(r)  # twice: a descriptor already forgotten is no error
    os.write(w, b"two")
    loop.at("soon", time.monotonic() + 0.05, lambda: seen.append(b"due"))
    loop.step()
    assert seen == [b"one", b"due"]  # the data waits unread; only the deadline fired
    for fd in (r, w):
        os.close(fd)
    loop.close()


def test_deadlines_fire_once_can_be_moved_and_cancelled() -> None:
    loop = Loop()
    fired: list[str] = []
    now = time.monotonic()
    loop.at("a", now + 0.02, lambda: fired.append("a"))
    # the moved deadline is the later one: "a" must fire first, whatever the machine's load
    loop.at("b", now + 0.01, lambda: fired.append("b"))
    loop.at("b", now + 0.5, lambda: fired.append("b moved"))  # the same key: moved, not added
    loop.at("c", now + 0.01, lambda: fired.append("c"))
    loop.cancel("c")
    while "a" not in fired:
        loop.step()
    assert fired == ["a"]  # "b" fired neither at its first deadline nor before "a"; "c" never
    while "b moved" not in fired:
        loop.step()
    assert fired == ["a", "b moved"]
    loop.close()


def test_a_reader_that_stops_another_keeps_it_from_running() -> None:
    """Both pipes readable in one wait; the first reader forgets the second, which then does not run."""
    loop = Loop()
    pipes = [os.pipe(), os.pipe()]
    ran: list[int] = []

    def first_forgets_other(index: int) -> None:
        ran.append(index)
        loop.forget(pipes[1 - index][0])

    for index, (r, w) in enumerate(pipes):
        loop.read(r, lambda index=index: first_forgets_other(index))
        os.write(w, b"x")
    loop.step()
    assert len(ran) == 1
    for r, w in pipes:
        os.close(r)
        os.close(w)
    loop.close()
