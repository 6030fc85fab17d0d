"""A started side kept for a probe's scenarios, put back to what its start-up left before each one.

Starting a side (:func:`harness.server.start`) costs ~30-40 ms of CPU, most of it the build's own
(``publish``, the ``ServerArgs`` resolution, the scheduler's constructor); the CPU pair's probes run
16-20 scenarios per release on each of its two sides. So each probe keeps one side per mode, back
end and deferred-release switch (:func:`kept_side`), and before every scenario after the first
puts it back to its start-up state (:class:`StartState`): every object of the build the scheduler
reaches (instance attributes and container elements, to :data:`DEPTH` hops) gets back the
attributes and the container contents start-up left it, and so does the lab's own edge of the
side (its transport's wire, control socket and bootstrap server, its output sockets). Its
published runtime context goes back to what start-up published (:meth:`harness.server.Published.reset`).

Not put back: the KV memory (the pair's :meth:`harness.pd_pair.Rank.reset` zeroes and clears it
in place) and tensors' contents. A scenario's leftovers cannot decide the next verdict: what a
scenario added to any reachable container, attribute or object is gone before the next one starts.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

DEPTH = 5
"""Hops from the scheduler: scheduler -> queue -> KV manager -> a per-room table -> its entries."""

_CONTAINERS = (list, dict, set, collections.deque)


def _ours(obj: Any) -> bool:
    """An object whose state a scenario can change: the build's own (its class is defined in ``sglang``)."""
    module = getattr(type(obj), "__module__", "") or ""
    return module.startswith("sglang.") and hasattr(obj, "__dict__") and not isinstance(obj, type)


def _copy(value: Any) -> Any:
    return dict(value) if isinstance(value, dict) else list(value)


def _refill(container: Any, contents: Any) -> None:
    if isinstance(container, dict):
        container.clear()
        container.update(contents)
    elif isinstance(container, list):
        container[:] = contents
    else:  # set, deque
        container.clear()
        (container.update if isinstance(container, set) else container.extend)(contents)


def _children(value: Any) -> Iterable[Any]:
    if isinstance(value, dict):
        return value.values()
    if isinstance(value, list | tuple | set | collections.deque):
        return value
    return (value,)


class StartState:
    """The attributes and container contents of a side's objects as start-up left them (see the module).

    ``roots`` are walked whatever their class (the scheduler, the lab's transport pieces); below
    them only the build's own objects. ``skip``: objects never walked nor put back (the KV memory).
    """

    def __init__(self, roots: Iterable[Any], skip: Iterable[Any] = ()) -> None:
        self.saved: list[tuple[Any, dict[str, Any], dict[int, Any]]] = []
        seen = {id(o) for o in skip}
        frontier = [r for r in roots if hasattr(r, "__dict__")]
        for _ in range(DEPTH):
            below: list[Any] = []
            for obj in frontier:
                if id(obj) in seen:
                    continue
                seen.add(id(obj))
                attrs = dict(vars(obj))
                contents = {id(v): _copy(v) for v in attrs.values() if isinstance(v, _CONTAINERS)}
                self.saved.append((obj, attrs, contents))
                below += [c for v in attrs.values() for c in _children(v) if _ours(c) and id(c) not in seen]
            frontier = below

    def restore(self) -> None:
        for obj, attrs, contents in self.saved:
            own = vars(obj)
            own.clear()
            own.update(attrs)
            for value in attrs.values():
                if id(value) in contents:
                    _refill(value, contents[id(value)])


@dataclass
class Kept:
    """One started side, its lab-side edge (``transport``) and what start-up left in both."""

    side: Any  # harness.server.Side
    transport: Any  # harness.transport.Transport
    state: StartState
    scenarios: int = 1

    def restore(self) -> None:
        """Back to the start-up state, for the next scenario."""
        self.state.restore()
        if self.side.published is not None:
            self.side.published.reset()
        self.scenarios += 1


_KEPT: dict[tuple[Any, ...], Kept] = {}


def kept_side(
    key: tuple[Any, ...], transport: Any, start: Callable[[], Any], *, skip: Iterable[Any] = ()
) -> tuple[Kept, bool]:
    """The side kept under ``key`` put back to its start-up state, or a new one ``start()`` builds now.

    ``transport`` is the new side's edge (its contexts already entered by the caller); a kept side
    keeps its own (:attr:`Kept.transport`), which the caller enters instead. Returns the side and
    whether it was just started.
    """
    kept = _KEPT.get(key)
    if kept is not None:
        kept.restore()
        return kept, False
    side = start()
    roots = [side.scheduler, side.seen["sockets"], transport.wire, transport.control, transport.bootstrap]
    kept = Kept(side, transport, StartState(roots, skip))
    _KEPT[key] = kept
    return kept, True


def kept_transport(key: tuple[Any, ...]) -> Any | None:
    """The transport of the side kept under ``key`` (its edges to enter for a scenario), or None."""
    kept = _KEPT.get(key)
    return kept.transport if kept is not None else None
