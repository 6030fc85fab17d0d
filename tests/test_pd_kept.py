"""A kept server put back to its start-up state (probes/harness/kept.py), on plain objects (no SGLang needed).

The pair's probes run every scenario after the first on a server an earlier scenario used; what
that scenario left must be gone before the next one starts, or its leftovers decide the next
verdict. The objects here stand in for the build's (their class's module is ``sglang.*``, as the
walk requires) with the shapes the real ones have: a scheduler holding queues, a queue holding a
KV manager, the manager holding per-room tables.
"""

from __future__ import annotations

import collections
import importlib
import sys
from pathlib import Path

import pytest

PROBES = Path(__file__).resolve().parents[1] / "probes"


@pytest.fixture(scope="module")
def kept():
    sys.path.insert(0, str(PROBES))
    try:
        yield importlib.import_module("harness.kept")
    finally:
        sys.path.remove(str(PROBES))


class Built:
    """An object of the build: the walk goes below the root only into these."""

    def __init__(self, **attrs) -> None:
        vars(self).update(attrs)


Built.__module__ = "sglang.srt.disaggregation.fake"


class Foreign:
    """Not the build's (a lab fake, a torch object): never walked below a root."""

    def __init__(self) -> None:
        self.calls: list[str] = []


def server():
    status = Built(table={})
    manager = Built(request_status=status, failure_records={}, rooms=collections.deque(), acked=set())
    queue = Built(queue=[], kv_manager=manager)
    memory = Built(free=[0, 1, 2, 3])
    scheduler = Built(
        waiting_queue=[],
        queues=[queue],
        chunked_req=None,
        memory=memory,
        foreign=Foreign(),
        by_name={"prealloc": Built(pending=[])},
    )
    return scheduler, queue, manager, status, memory


def test_a_scenarios_requests_rooms_and_statuses_are_gone_after_restore(kept) -> None:
    scheduler, queue, manager, status, _ = server()
    state = kept.StartState([scheduler])
    queue.queue.append("donor")
    scheduler.waiting_queue.append("victim")
    scheduler.chunked_req = "victim"
    manager.failure_records[8192] = "failed"
    manager.rooms.append(8192)
    manager.acked.add(8192)
    status.table[8192] = "Success"  # four hops down: scheduler -> list -> queue -> manager -> table
    scheduler.by_name["prealloc"].pending.append("donor")
    state.restore()
    assert queue.queue == [] and scheduler.waiting_queue == [] and scheduler.chunked_req is None
    assert manager.failure_records == {} and list(manager.rooms) == [] and manager.acked == set()
    assert status.table == {}
    assert scheduler.by_name["prealloc"].pending == []


def test_an_attribute_replaced_or_added_goes_back(kept) -> None:
    scheduler, queue, manager, _, _ = server()
    original = queue.queue
    state = kept.StartState([scheduler])
    queue.queue = ["kept by a rebuild of the list"]  # pop_bootstrapped rebuilds its list
    manager.late = "added by a scenario"
    state.restore()
    assert queue.queue is original and queue.queue == []
    assert not hasattr(manager, "late")


def test_containers_are_refilled_in_place_with_what_start_up_left(kept) -> None:
    scheduler, _, manager, _, _ = server()
    manager.failure_records[1] = "from start-up"
    held = manager.failure_records
    state = kept.StartState([scheduler])
    held.clear()
    held[2] = "from a scenario"
    state.restore()
    assert manager.failure_records is held and held == {1: "from start-up"}


def test_skipped_and_foreign_objects_are_left_alone(kept) -> None:
    scheduler, _, _, _, memory = server()
    state = kept.StartState([scheduler], skip=[memory])
    memory.free.remove(0)  # the KV memory: the pair resets it in place itself
    scheduler.foreign.calls.append("recorded")
    state.restore()
    assert memory.free == [1, 2, 3]
    assert scheduler.foreign.calls == ["recorded"]


def test_a_root_of_any_class_is_walked(kept) -> None:
    wire = Foreign()  # the lab's transport pieces are roots, whatever their class
    state = kept.StartState([wire])
    wire.calls.append("a frame")
    state.restore()
    assert wire.calls == []
