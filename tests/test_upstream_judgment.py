"""How SGLang's own tests are read beside a verdict: behaviour against drift, and who has a say.

The exceptions here are real: raised by a module laid out as SGLang's code
(``sglang/srt/managers/queue.py`` under a source root) called from a test file beside
it, and turned into the test child's facts by the child's own ``describe``. So where
each was raised (SGLang's code or the test's own frame) is what the traceback says.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from difflab.probe import upstream_facts as facts
from difflab.upstream_tests.agreement import pair_agreement, single_agreement
from difflab.upstream_tests.outcomes import Outcome, Reference, read_part
from difflab.upstream_tests.replay import Row

QUEUE = '''
class Queue:
    """Shaped like a scheduler queue: reads its limit from the server args it is given."""

    def __init__(self, server_args):
        self.limit = server_args.max_queued + 1
        self.items = []

    def pop_batch(self):
        return None  # the defect: the caller expects a list
'''

TEST = """
from sglang.srt.managers.queue import Queue


def build(args):
    return Queue(args)


def build_with_extra_arguments():
    return Queue(1, 2, 3)


def batch_size(queue):
    return len(queue.pop_batch())
"""


@pytest.fixture
def code(tmp_path: Path) -> Iterator[tuple[types.ModuleType, facts.Where]]:
    """The test module (importing the SGLang-shaped one) and the child's view of where each file is."""
    source = tmp_path / "src"
    (source / "sglang" / "srt" / "managers").mkdir(parents=True)
    for folder in ("sglang", "sglang/srt", "sglang/srt/managers"):
        (source / folder / "__init__.py").write_text("")
    (source / "sglang" / "srt" / "managers" / "queue.py").write_text(QUEUE)
    test_file = tmp_path / "test" / "test_queue.py"
    test_file.parent.mkdir()
    test_file.write_text(TEST)
    saved = {k: v for k, v in sys.modules.items() if k == "sglang" or k.startswith("sglang.")}
    for name in saved:
        del sys.modules[name]
    sys.path.insert(0, str(source))
    try:
        spec = importlib.util.spec_from_file_location("test_queue", test_file)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module, facts.Where(test_file, test_file.parent, source)
    finally:
        sys.path.remove(str(source))
        for name in [k for k in sys.modules if k == "sglang" or k.startswith("sglang.")]:
            del sys.modules[name]
        sys.modules.update(saved)


def _raw(action: Callable[[], Any], where: facts.Where, phase: str) -> dict[str, Any]:
    """The child's record of a part that raised: its facts, as ``upstream_facts.describe`` gives them."""
    try:
        action()
    except Exception as exc:  # noqa: BLE001 - any exception is the fact under test
        return {"outcome": "error", "phase": phase, **facts.describe(exc, where)}
    raise AssertionError("the action did not raise")


def test_set_up_errors_raised_inside_sglang_are_errors_not_drift(code) -> None:
    module, where = code
    missing_field = _raw(lambda: module.build(None), where, "setup")
    assert (missing_field["error_type"], missing_field["raised_in"]) == ("AttributeError", "sglang")
    assert read_part(missing_field, Reference()) == ("error", None)
    wrong_type = _raw(lambda: module.build(types.SimpleNamespace(max_queued="8")), where, "setup")
    assert (wrong_type["error_type"], wrong_type["raised_in"]) == ("TypeError", "sglang")
    assert read_part(wrong_type, Reference()) == ("error", None)


def test_set_up_drift_is_still_stale(code) -> None:
    module, where = code
    fake = _raw(lambda: module.build(types.SimpleNamespace()), where, "setup")  # the test's fake lacks a field
    assert fake["fake"] == "SimpleNamespace"
    assert read_part(fake, Reference()) == ("stale", "the test's fake SimpleNamespace does not fit this code")
    extra = _raw(module.build_with_extra_arguments, where, "setup")
    assert (extra["error_type"], extra["raised_in"]) == ("TypeError", "test")
    assert read_part(extra, Reference())[0] == "stale"


def test_a_type_error_in_the_test_frame_is_drift_only_when_it_binds_a_call(code) -> None:
    module, where = code
    extra = _raw(module.build_with_extra_arguments, where, "call")
    assert facts.BINDING.match(extra["message"]), extra["message"]
    assert read_part(extra, Reference()) == ("stale", "the test calls this code with arguments it does not take")
    queue = module.build(types.SimpleNamespace(max_queued=8))
    result = _raw(lambda: module.batch_size(queue), where, "call")  # len(None): what the code returned
    assert (result["error_type"], result["raised_in"]) == ("TypeError", "test")
    assert read_part(result, Reference()) == ("error", None)


def _rows(*specs: tuple[str, bool, str]) -> list[Row]:
    return [Row(f"test_queue.py::{name}", own, {}, change) for name, own, change in specs]


def test_a_base_like_verdict_is_contradicted_by_the_fix_s_own_test_passing() -> None:
    own_passes = [Row("test_queue.py::own", True, {"r": Outcome("passed")})]
    for verdict in ("absent", "bug"):
        said = single_agreement(verdict, "r", own_passes)
        assert said.agrees is False and said.disagreements == ["own passes here"]
    others_pass = [
        Row("test_queue.py::own", True, {"r": Outcome("failed")}),
        Row("test_queue.py::other", False, {"r": Outcome("passed")}),
    ]
    assert single_agreement("absent", "r", others_pass).agrees is True  # only the fix's own tests speak
    head_like = single_agreement("present", "r", own_passes)
    assert head_like.agrees is True and head_like.disagreements == []


def test_not_reproduced_has_a_say() -> None:
    agrees = pair_agreement("not-reproduced", _rows(("own", True, "still-passing")))
    assert agrees.agrees is True and agrees.disagreements == []
    fixed = pair_agreement("not-reproduced", _rows(("own", True, "fixed"), ("other", False, "still-passing")))
    assert fixed.agrees is False
    assert fixed.disagreements == ["own fixed (fails on the base, passes on the head)"]
    assert pair_agreement("not-reproduced", _rows(("own", True, "still-failing"))).agrees is None


def test_the_fix_s_own_tests_decide_the_pair_agreement() -> None:
    others = pair_agreement("confirmed", _rows(("own", True, "stale"), ("other", False, "fixed")))
    assert others.agrees is None  # another test's fix is not the fix's own test saying so
    own = pair_agreement("confirmed", _rows(("own", True, "fixed"), ("other", False, "still-failing")))
    assert own.agrees is True and own.disagreements == []
    not_fixed = pair_agreement("not-fixed", _rows(("own", True, "still-passing"), ("other", False, "fixed")))
    assert not_fixed.agrees is None and not_fixed.disagreements == []
