"""A tiny stand-in ``sglang`` (a base without a fix, a head with it) and test files in SGLang's style, for fast tests.

Holds no tests. Not SGLang's code nor its tests: written for the lab, so the replay's whole
path (child process, unittest and pytest runners, classification, change) runs in about a
second without the real releases. The stand-in ``sglang.test.test_utils`` reproduces the two
behaviours of SGLang's own module the replay must undo: it reads ``CUDA_VISIBLE_DEVICES[0]``
at import, and ``CustomTestCase`` re-raises every failure as a bare ``Exception``.
"""

from __future__ import annotations

import hashlib
import sys
from dataclasses import dataclass
from pathlib import Path

from difflab.matrix.model import Fix, SidePin, UpstreamTestFile
from difflab.source.base import MaterialisedSource

HEADER = "# difflab test fixture -- NOT one of SGLang's tests (a stand-in written for the lab's own tests).\n"

TEST_UTILS = '''"""Stand-in for sglang.test.test_utils (difflab fixture): its import-time read and its retry wrapper."""

import os
import unittest

DEFAULT_PORT_FOR_SRT_TEST_RUNNER = 20000 + int(os.environ.get("CUDA_VISIBLE_DEVICES", "0")[0]) * 1000


def retry(fn, max_retry):
    for attempt in range(max_retry + 1):
        try:
            return fn()
        except unittest.SkipTest:
            raise
        except Exception:
            if attempt >= max_retry:
                raise Exception("retry() exceed maximum number of retries.")


class CustomTestCase(unittest.TestCase):
    def _callTestMethod(self, method):
        retry(lambda: super(CustomTestCase, self)._callTestMethod(method), max_retry=0)
'''

DOORS_BASE = '''"""Stand-in door (difflab fixture), before the fix: every request is admitted."""


def admit(queue, req):
    queue.create_sender(req)
    queue.items.append(req)
'''

DOORS_HEAD = '''"""Stand-in door (difflab fixture), with the fix: a rejected request is retired first."""


def is_unadmitted(req):
    return req.rejected and req.slot < 0


def admit(queue, req):
    if is_unadmitted(req):
        queue.scheduler.retire(req)
        return
    queue.create_sender(req)
    queue.items.append(req)
'''

UNITTEST_FILE = (
    HEADER
    + """import unittest
from types import SimpleNamespace

from sglang.srt.doors import admit
from sglang.test.test_utils import CustomTestCase


def _queue():
    return SimpleNamespace(items=[], scheduler=SimpleNamespace(retire=lambda req: None), create_sender=lambda r: True)


class TestDoors(CustomTestCase):
    def test_rejected_is_retired(self):
        for kind in ("prefill", "decode"):
            with self.subTest(door=kind):
                queue = _queue()
                admit(queue, SimpleNamespace(rejected=True, slot=-1))
                self.assertEqual(queue.items, [])

    def test_valid_is_admitted(self):
        queue = _queue()
        admit(queue, SimpleNamespace(rejected=False, slot=-1))
        self.assertEqual(len(queue.items), 1)

    def test_needs_no_sender(self):
        queue = SimpleNamespace(items=[], scheduler=SimpleNamespace(retire=lambda req: None))
        admit(queue, SimpleNamespace(rejected=True, slot=-1))

    def test_broken_helper(self):
        raise ValueError("the test itself is broken")


if __name__ == "__main__":
    unittest.main()
"""
)

PREDICATE_FILE = (
    HEADER
    + """import unittest
from types import SimpleNamespace

from sglang.srt.doors import is_unadmitted


class TestPredicate(unittest.TestCase):
    def test_rejected_holding_nothing(self):
        self.assertTrue(is_unadmitted(SimpleNamespace(rejected=True, slot=-1)))
"""
)

LATER_FILE = (
    HEADER
    + """import unittest

from sglang.srt.doors import a_later_refactor


class TestLater(unittest.TestCase):
    def test_uses_a_later_refactor(self):
        self.assertTrue(a_later_refactor())
"""
)

PYTEST_FILE = (
    HEADER
    + """from types import SimpleNamespace

import pytest

from sglang.srt.doors import admit


@pytest.fixture
def queue():
    return SimpleNamespace(items=[], scheduler=SimpleNamespace(retire=lambda req: None), create_sender=lambda r: True)


def test_rejected_is_not_enqueued(queue):
    admit(queue, SimpleNamespace(rejected=True, slot=-1))
    assert queue.items == []


@pytest.mark.parametrize("slot", [0, 4])
def test_holding_a_slot_is_enqueued(queue, slot):
    admit(queue, SimpleNamespace(rejected=True, slot=slot))
    assert len(queue.items) == 1
"""
)

FOLDER = "test/unit"
TEST_FILES = {
    f"{FOLDER}/test_fake_doors.py": UNITTEST_FILE,
    f"{FOLDER}/test_fake_predicate.py": PREDICATE_FILE,
    f"{FOLDER}/test_fake_later.py": LATER_FILE,
    f"{FOLDER}/test_fake_pytest.py": PYTEST_FILE,
}
D, P, L, Y = (f"{FOLDER}/test_fake_{n}.py" for n in ("doors", "predicate", "later", "pytest"))
EXPECTED = {
    # id: (base outcome, head outcome, change)
    f"{D}::TestDoors::test_rejected_is_retired": ("failed", "passed", "fixed"),
    f"{D}::TestDoors::test_valid_is_admitted": ("passed", "passed", "still-passing"),
    f"{D}::TestDoors::test_needs_no_sender": ("stale", "passed", "stale"),
    f"{D}::TestDoors::test_broken_helper": ("error", "error", "error"),
    f"{P}::TestPredicate::test_rejected_holding_nothing": ("failed", "passed", "fixed"),
    f"{L}::TestLater::test_uses_a_later_refactor": ("stale", "stale", "stale"),
    f"{Y}::test_rejected_is_not_enqueued": ("failed", "passed", "fixed"),
    f"{Y}::test_holding_a_slot_is_enqueued[0]": ("passed", "passed", "still-passing"),
    f"{Y}::test_holding_a_slot_is_enqueued[4]": ("passed", "passed", "still-passing"),
}


def write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def fake_source(root: Path, label: str, fixed: bool) -> MaterialisedSource:
    files = {
        "sglang/__init__.py": f'__version__ = "{label}"\n',
        "sglang/test/__init__.py": "",
        "sglang/test/test_utils.py": TEST_UTILS,
        "sglang/srt/__init__.py": "",
        "sglang/srt/doors.py": DOORS_HEAD if fixed else DOORS_BASE,
    }
    write(root, files)
    digest = hashlib.sha256((DOORS_HEAD if fixed else DOORS_BASE).encode()).hexdigest()
    return MaterialisedSource(label, "fake", root, {"kind": "fake", "label": label}, f"fake:{digest}")


def fake_fix(own: dict[str, list[str]] | None = None) -> Fix:
    own = own or {}
    tests = tuple(UpstreamTestFile(rel, tuple(own.get(rel, []))) for rel in TEST_FILES)
    return Fix("1", 1, "stand-in fix", SidePin(release="base"), SidePin(release="head"), (), upstream_tests=tests)


@dataclass
class LabPython:
    """The lab's own interpreter standing in for the shared environment (the stand-in sglang needs nothing)."""

    cache: Path
    python: Path = Path(sys.executable)

    def ensure(self, progress: object = None) -> LabPython:
        return self
