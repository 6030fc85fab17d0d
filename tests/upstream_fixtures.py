"""Test files written for this lab in the style of SGLang's own CPU unit tests -- NOT SGLang's tests.

Holds no tests. Each file starts with a header line saying it is a difflab fixture and is
named ``test_difflab_fixture_*.py``, so nobody mistakes it for a file of SGLang's repository,
although it sits at a path shaped like one (``test/registered/unit/disaggregation/``).

They follow SGLang's conventions that the replay must handle: ``CustomTestCase`` from the
real ``sglang.test.test_utils`` of the source under test (its retry wrapper re-raises any
failure as a bare ``Exception``; the module reads ``CUDA_VISIBLE_DEVICES`` at import),
``subTest`` over the two PD doors, ``SimpleNamespace`` fakes driving the real door methods
unbound, a module-level import of a name only the fixed code has, and a pytest-style file
with a fixture and plain test functions. On #38935's base (0.5.20) and head (0.5.21) every
test's outcome is known (``EXPECTED``).
"""

from __future__ import annotations

import re
from pathlib import Path

from difflab.paths import default_matrix

HEADER = (
    "# difflab test fixture -- NOT one of SGLang's tests. Written for sglang-difflab in the style of\n"
    "# SGLang's CPU unit tests, to check how the lab replays such tests.\n"
)
FOLDER = "test/registered/unit/disaggregation"
DOORS = f"{FOLDER}/test_difflab_fixture_admission_doors.py"
PREDICATE = f"{FOLDER}/test_difflab_fixture_unadmitted_predicate.py"
PYTEST_DOORS = f"{FOLDER}/test_difflab_fixture_prefill_door_pytest.py"

_REQUEST = """

def _request(rejected, metadata_buffer_index=-1):
    return SimpleNamespace(
        rid="difflab-fixture",
        to_finish=FINISH_ABORT("prompt too long", 400) if rejected else None,
        finished_reason=None,
        is_retracted=False,
        metadata_buffer_index=metadata_buffer_index,
        bootstrap_host="10.0.0.1",
        kv=SimpleNamespace(holds_kv=False, holds_mamba=False, retraction_backup=None),
    )
"""

DOORS_TEXT = (
    HEADER
    + '''"""Intake-rejected requests are retired at both PD doors (difflab fixture)."""

import unittest
from types import SimpleNamespace

from sglang.srt.disaggregation.decode import DecodePreallocQueue
from sglang.srt.disaggregation.prefill import PrefillBootstrapQueue
from sglang.srt.managers.schedule_batch import FINISH_ABORT
from sglang.test.test_utils import CustomTestCase
'''
    + _REQUEST
    + '''

class _Scheduler:
    def __init__(self):
        self.retired = []

    def retire_unadmitted_request(self, req):
        self.retired.append(req)


def _door(name):
    """The door's queue with only what its add() reads, what it admitted, and the unbound add."""
    scheduler, admitted = _Scheduler(), []
    if name == "prefill":
        queue = SimpleNamespace(queue=admitted, scheduler=scheduler, create_sender=lambda req, num_kv_heads: True)
        return queue, admitted, lambda req: PrefillBootstrapQueue.add(queue, req, 8)

    def enqueue(req, is_rebootstrap=False):
        admitted.append(req)
        return SimpleNamespace(kv_receiver=SimpleNamespace(init=lambda rank: None))

    queue = SimpleNamespace(
        scheduler=scheduler,
        retracted_queue=[],
        pending_reqs=[],
        _check_if_req_exceed_kv_capacity=lambda req: False,
        _create_receiver_and_enqueue=enqueue,
        _resolve_prefill_dp_rank=lambda req: 0,
    )
    return queue, admitted, lambda req: DecodePreallocQueue.add(queue, req)


class TestDifflabFixtureDoors(CustomTestCase):
    def test_rejected_request_is_retired_at_each_door(self):
        for door in ("prefill", "decode"):
            with self.subTest(door=door):
                queue, admitted, add = _door(door)
                req = _request(rejected=True)
                add(req)
                self.assertEqual(admitted, [])
                self.assertEqual(queue.scheduler.retired, [req])

    def test_valid_request_is_admitted_at_each_door(self):
        for door in ("prefill", "decode"):
            with self.subTest(door=door):
                queue, admitted, add = _door(door)
                req = _request(rejected=False)
                add(req)
                self.assertEqual(admitted, [req])
                self.assertEqual(queue.scheduler.retired, [])

    def test_prefill_door_needs_no_sender_for_a_rejected_request(self):
        # A head-shaped fake: without create_sender, only a door that retires first gets through.
        queue = SimpleNamespace(queue=[], scheduler=_Scheduler())
        req = _request(rejected=True)
        PrefillBootstrapQueue.add(queue, req, 8)
        self.assertEqual(queue.scheduler.retired, [req])


if __name__ == "__main__":
    unittest.main()
'''
)

PREDICATE_TEXT = (
    HEADER
    + '''"""The intake-rejection predicate (difflab fixture). Its module-level import names what only the fix adds."""

import unittest
from types import SimpleNamespace

from sglang.srt.disaggregation.utils import is_unadmitted_reject
from sglang.srt.managers.schedule_batch import FINISH_ABORT
'''
    + _REQUEST
    + """

class TestDifflabFixtureUnadmittedPredicate(unittest.TestCase):
    def test_rejected_request_holding_nothing_is_unadmitted(self):
        self.assertTrue(is_unadmitted_reject(_request(rejected=True)))

    def test_request_holding_a_metadata_slot_is_not(self):
        self.assertFalse(is_unadmitted_reject(_request(rejected=True, metadata_buffer_index=3)))


if __name__ == "__main__":
    unittest.main()
"""
)

PYTEST_TEXT = (
    HEADER
    + '''"""The prefill door, pytest-style (difflab fixture): a fixture and plain test functions."""

from types import SimpleNamespace

import pytest

from sglang.srt.disaggregation.prefill import PrefillBootstrapQueue
from sglang.srt.managers.schedule_batch import FINISH_ABORT
'''
    + _REQUEST
    + """

@pytest.fixture
def door():
    retired = []
    scheduler = SimpleNamespace(retire_unadmitted_request=retired.append)
    queue = SimpleNamespace(queue=[], scheduler=scheduler, create_sender=lambda req, num_kv_heads: True)
    return queue, retired


def test_rejected_request_is_not_enqueued(door):
    queue, retired = door
    req = _request(rejected=True)
    PrefillBootstrapQueue.add(queue, req, 8)
    assert queue.queue == []
    assert retired == [req]


@pytest.mark.parametrize("slot", [0, 5])
def test_request_holding_a_metadata_slot_is_enqueued(door, slot):
    queue, retired = door
    req = _request(rejected=True, metadata_buffer_index=slot)
    PrefillBootstrapQueue.add(queue, req, 8)
    assert queue.queue == [req]
    assert retired == []


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-v"]))
"""
)

FILES = {DOORS: DOORS_TEXT, PREDICATE: PREDICATE_TEXT, PYTEST_DOORS: PYTEST_TEXT}
OWN = {
    DOORS: ["TestDifflabFixtureDoors::test_rejected_request_is_retired_at_each_door"],
    PREDICATE: ["TestDifflabFixtureUnadmittedPredicate::test_rejected_request_holding_nothing_is_unadmitted"],
    PYTEST_DOORS: ["test_rejected_request_is_not_enqueued"],
}

_D, _P, _Y = (f"{DOORS}::TestDifflabFixtureDoors", f"{PREDICATE}::TestDifflabFixtureUnadmittedPredicate", PYTEST_DOORS)
EXPECTED = {
    # test id: (outcome on 0.5.20, outcome on 0.5.21, change)
    f"{_D}::test_rejected_request_is_retired_at_each_door": ("failed", "passed", "fixed"),
    f"{_D}::test_valid_request_is_admitted_at_each_door": ("passed", "passed", "still-passing"),
    f"{_D}::test_prefill_door_needs_no_sender_for_a_rejected_request": ("stale", "passed", "stale"),
    f"{_P}::test_rejected_request_holding_nothing_is_unadmitted": ("failed", "passed", "fixed"),
    f"{_P}::test_request_holding_a_metadata_slot_is_not": ("failed", "passed", "fixed"),
    f"{_Y}::test_rejected_request_is_not_enqueued": ("failed", "passed", "fixed"),
    f"{_Y}::test_request_holding_a_metadata_slot_is_enqueued[0]": ("passed", "passed", "still-passing"),
    f"{_Y}::test_request_holding_a_metadata_slot_is_enqueued[5]": ("passed", "passed", "still-passing"),
}


def write_tests(root: Path) -> Path:
    """A folder laid out like SGLang's repository holding the fixture files; returns ``root``."""
    for rel, text in FILES.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def upstream_tests_toml() -> str:
    entries = ",\n".join(
        f'  {{ file = "{rel}", own = [{", ".join(repr(o).replace(chr(39), chr(34)) for o in OWN[rel])}] }}'
        for rel in FILES
    )
    return f"upstream_tests = [\n{entries},\n]\n"


def with_fixture_tests(text: str) -> str:
    """A matrix's text with #38935's ``upstream_tests`` naming the fixture files instead of SGLang's."""
    start = text.index('id = "38935"')
    end = re.compile(r"^\[", re.M).search(text, start).start()  # the entry's own keys end at its first table
    entry = re.sub(r"upstream_tests = \[.*?\n\]\n", "", text[start:end], flags=re.S)
    entry = re.sub(r'upstream_tests = \[".*?"\]\n', "", entry)
    return text[:start] + entry.rstrip("\n") + "\n" + upstream_tests_toml() + "\n" + text[end:]


def fixture_matrix(dest: Path) -> Path:
    """The default matrix, its #38935 entry naming the fixture files (written to ``dest/upstream.toml``)."""
    dest.mkdir(parents=True, exist_ok=True)
    path = dest / "upstream.toml"
    path.write_text(with_fixture_tests(default_matrix().read_text()))
    return path
