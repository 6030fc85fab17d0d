"""SGLang's own tests as a second witness: facts, outcomes, changes, agreement, files, matrix (fast).

The replay through a real test child on a stand-in ``sglang`` is in ``test_upstream_child.py``,
its reading and reports from the child's own records in ``test_upstream_records.py``, the same
path on the real releases in ``test_upstream_replay.py``.
"""

from __future__ import annotations

import os
import sys
import types
import unittest
from dataclasses import asdict
from pathlib import Path
from unittest import mock

import pytest

import upstream_fakes as fakes
from difflab.cli import main as cli
from difflab.errors import ConfigError
from difflab.matrix import load_matrix
from difflab.probe import upstream_facts as facts
from difflab.runner import box
from difflab.upstream_tests.agreement import pair_agreement, single_agreement
from difflab.upstream_tests.files import ENV, Tree, locate
from difflab.upstream_tests.files import tests_dir as resolve_tests_dir
from difflab.upstream_tests.outcomes import Outcome, Reference, change, read_part, read_test
from difflab.upstream_tests.process import child_env
from difflab.upstream_tests.replay import Row
from difflab.upstream_tests.staging import closure, stage_pytest
from difflab.upstream_tests.symbols import SymbolIndex, symbol_name
from difflab.upstream_tests.witness import with_flag
from matrix_samples import RELEASES


def test_the_child_drops_an_empty_cuda_visible_devices_and_autoloaded_pytest_plugins(tmp_path: Path) -> None:
    src = fakes.fake_source(tmp_path / "s", "s", fixed=True)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CUDA_VISIBLE_DEVICES", "")
        env = child_env(src, tmp_path / "cache", tmp_path / "home")
    assert "CUDA_VISIBLE_DEVICES" not in env and env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] == "1"
    child, source = env["PYTHONPATH"].split(os.pathsep)
    assert source == str(src.root), "behind the lab's own package"
    assert Path(child).parent == tmp_path / "cache" / "childlib" and (Path(child) / "difflab" / "probe").is_dir()
    assert (env["HOME"], env["PYTHONPYCACHEPREFIX"]) == (str(tmp_path / "home"), str(tmp_path / "cache" / "pycache"))
    assert env[box.SOURCE_ENV] == str(src.root)


# -- facts, read inside the child ------------------------------------------------------------------


def _raised(fn: object) -> BaseException:
    try:
        fn()  # type: ignore[operator]
    except BaseException as exc:  # noqa: BLE001
        return exc
    raise AssertionError("nothing raised")


def test_missing_symbol_names_module_attribute_import_and_class_attribute() -> None:
    module = types.ModuleType("sglang.srt.fake")
    sys.modules["sglang.srt.fake"] = module
    try:
        assert facts.missing_symbol(_raised(lambda: module.absent)) == {"module": "sglang.srt.fake", "name": "absent"}
    finally:
        del sys.modules["sglang.srt.fake"]
    cannot = ImportError("cannot import name 'is_x' from 'sglang.srt.disaggregation.utils' (/x/utils.py)")
    assert facts.missing_symbol(cannot) == {"module": "sglang.srt.disaggregation.utils", "name": "is_x"}
    missing = ModuleNotFoundError("No module named 'sglang.srt.runtime_context'", name="sglang.srt.runtime_context")
    assert facts.missing_symbol(missing) == {"module": "sglang.srt.runtime_context", "name": None}
    assert facts.missing_symbol(ModuleNotFoundError("numpy", name="numpy")) is None
    patched = AttributeError("<module 'sglang.srt.x' from '/a/x.py'> does not have the attribute 'helper'")
    assert facts.missing_symbol(patched) == {"module": "sglang.srt.x", "name": "helper"}
    cls = type("Scheduler", (), {"__module__": "sglang.srt.managers.scheduler"})
    exc = _raised(lambda: cls.retire)
    assert facts.missing_symbol(exc) == {"owners": ["sglang.srt.managers.scheduler:Scheduler"], "name": "retire"}
    assert facts.missing_symbol(_raised(lambda: types.SimpleNamespace().x)) is None


def test_fake_kind_recognises_the_tests_own_fakes(tmp_path: Path) -> None:
    test_file = tmp_path / "test" / "test_x.py"
    test_file.parent.mkdir()
    test_file.write_text("def fake_send(room):\n    pass\n")
    where = facts.Where(test_file, tmp_path / "test", tmp_path / "src")
    assert facts.fake_kind(_raised(lambda: types.SimpleNamespace().x), where) == "SimpleNamespace"
    assert facts.fake_kind(_raised(lambda: mock.Mock(spec=[]).x), where) == "Mock"
    assert facts.fake_kind(TypeError("<lambda>() missing 1 required positional argument: 'x'"), where) == "<lambda>"
    assert facts.fake_kind(TypeError("fake_send() takes 1 positional argument but 2 were given"), where) == "fake_send"
    assert facts.fake_kind(TypeError("unsupported operand"), where) is None
    assert facts.fake_kind(_raised(lambda: object().x), where) is None


def test_unwrap_retries_gives_back_the_assertion() -> None:
    class Wrapped(unittest.TestCase):
        def _callTestMethod(self, method):  # noqa: N802 - unittest's name
            try:
                method()
            except Exception:
                raise Exception("retry() exceed maximum number of retries.") from None

    class T(Wrapped):
        def test_x(self) -> None:
            self.assertEqual(1, 2)

    assert facts.unwrap_retries(T) == [f"{Wrapped.__module__}.{Wrapped.__qualname__}"]
    result = unittest.TestResult()
    T("test_x").run(result)
    assert len(result.failures) == 1 and not result.errors


def test_declared_tests_reads_both_styles(tmp_path: Path) -> None:
    path = tmp_path / "t.py"
    path.write_text(
        "import unittest\nclass Mixin:\n    def test_inherited(self): pass\n"
        "class TestA(Mixin, CustomTestCase):\n    def test_a(self): pass\n    def helper(self): pass\n"
        "class Plain:\n    def test_not_collected(self): pass\n"
    )
    assert facts.declared_tests(path) == ("unittest", ["TestA::test_a", "TestA::test_inherited"])
    path.write_text("import pytest\ndef test_f(): pass\nclass TestB:\n    def test_m(self): pass\n")
    assert facts.declared_tests(path) == ("pytest", ["TestB::test_m", "test_f"])


# -- reading outcomes, changes, agreement ----------------------------------------------------------


def test_read_part_separates_behaviour_from_drift(tmp_path: Path) -> None:
    (tmp_path / "head" / "sglang").mkdir(parents=True)
    (tmp_path / "head" / "sglang" / "utils.py").write_text("def added(): pass\nclass Queue:\n    def add(self): pass\n")
    (tmp_path / "base" / "sglang").mkdir(parents=True)
    (tmp_path / "base" / "sglang" / "utils.py").write_text("class Queue:\n    pass\n")
    ref = Reference(SymbolIndex(tmp_path / "base"), SymbolIndex(tmp_path / "head"))
    err = {"outcome": "error", "phase": "call"}
    assert read_part({"outcome": "failed"}, ref) == ("failed", None)
    added = {**err, "missing": {"module": "sglang.utils", "name": "added"}, "error_type": "ImportError"}
    assert read_part(added, ref)[0] == "failed"
    method = {**err, "missing": {"owners": ["sglang.utils:Queue"], "name": "add"}, "error_type": "AttributeError"}
    assert read_part(method, ref)[0] == "failed", "a method the fix adds to a class"
    assert read_part({**method, "missing": {"owners": ["sglang.utils:Queue"], "name": "x"}}, ref)[0] == "stale"
    assert read_part({**err, "fake": "SimpleNamespace", "error_type": "AttributeError"}, ref)[0] == "stale"
    assert read_part({**err, "phase": "setup", "error_type": "TypeError"}, ref)[0] == "stale"
    binding = "Scheduler.__init__() got an unexpected keyword argument 'server_args'"
    assert read_part({**err, "raised_in": "test", "error_type": "TypeError", "message": binding}, ref)[0] == "stale"
    assert read_part({**err, "raised_in": "test", "error_type": "TypeError"}, ref)[0] == "error"
    assert read_part({**err, "error_type": "RuntimeError"}, ref) == ("error", None)
    assert read_part({**err, "phase": "import", "error_type": "ModuleNotFoundError"}, ref) == ("error", None)
    unknown_head = Reference(SymbolIndex(tmp_path / "base"), None)
    assert read_part(added, unknown_head)[0] == "stale", "without the fix's head nothing is attributed to it"


def test_a_test_fails_when_any_part_or_subtest_does() -> None:
    raw = {
        "parts": [{"outcome": "passed", "phase": "call"}],
        "subtests": [
            {"name": "(door='a')", "outcome": "passed"},
            {"name": "(door='b')", "outcome": "failed", "error_type": "AssertionError", "message": "1 != 2"},
            {"name": "(door='c')", "outcome": "error", "error_type": "AttributeError", "fake": "Mock"},
        ],
    }
    o = read_test(raw, Reference())
    assert (o.outcome, o.message) == ("failed", "(door='b'): 1 != 2")
    assert [s.outcome for s in o.subtests] == ["passed", "failed", "stale"]
    assert read_test({"parts": [], "subtests": []}, Reference()).outcome == "error"


def test_a_sub_test_is_read_like_a_part_and_a_test_keeps_its_duration(tmp_path: Path) -> None:
    (tmp_path / "head" / "sglang").mkdir(parents=True)
    (tmp_path / "head" / "sglang" / "doors.py").write_text("def is_unadmitted(req): pass\n")
    (tmp_path / "base" / "sglang").mkdir(parents=True)
    (tmp_path / "base" / "sglang" / "doors.py").write_text("")
    ref = Reference(SymbolIndex(tmp_path / "base"), SymbolIndex(tmp_path / "head"))
    lacking = {
        "outcome": "error",
        "error_type": "ImportError",
        "missing": {"module": "sglang.doors", "name": "is_unadmitted"},
    }
    raw = {
        "parts": [{"outcome": "passed", "phase": "call"}],
        "subtests": [{"name": "(door='a')", "outcome": "failed"}, {"name": "(door='b')", **lacking, "message": "no"}],
        "duration_s": 0.25,
    }
    o = read_test(raw, ref)
    assert (o.outcome, o.message, o.phase, o.why, o.duration_s) == ("failed", "(door='a')", "call", None, 0.25)
    assert [(s.phase, s.outcome, s.why) for s in o.subtests] == [
        ("call", "failed", None),
        ("call", "failed", "lacks sglang.doors.is_unadmitted, which the fix adds (its head has it, its base does not)"),
    ]
    assert o.to_dict()["subtests"] == [asdict(s) for s in o.subtests] and o.to_dict()["duration_s"] == 0.25
    assert Outcome("passed", duration_s=0.12345678).to_dict()["duration_s"] == 0.123457
    assert read_test({"parts": [{"outcome": "passed", "phase": "call"}]}, ref).duration_s == 0.0
    assert read_test({"subtests": [{"name": "(x=1)", "outcome": "passed"}]}, ref).outcome == "passed"
    assert read_test({"duration_s": 0.5}, ref) == Outcome("error", "the test left no result", duration_s=0.5)
    assert read_test({}, ref) == Outcome("error", "the test left no result", duration_s=0.0)


def test_an_attribute_error_in_the_set_up_outside_sglang_is_drift() -> None:
    for etype in ("AttributeError", "TypeError"):
        raw = {"outcome": "error", "phase": "setup", "error_type": etype, "raised_in": "test"}
        assert read_part(raw, Reference()) == ("stale", "the test's set-up does not fit this code")
    assert read_part({**raw, "error_type": "KeyError"}, Reference()) == ("error", None)


@pytest.mark.parametrize(
    ("base", "head", "expected"),
    [
        ("failed", "passed", "fixed"),
        ("passed", "failed", "regressed"),
        ("passed", "passed", "still-passing"),
        ("failed", "failed", "still-failing"),
        ("stale", "passed", "stale"),
        ("failed", "error", "error"),
        ("skipped", "passed", "skipped"),
        (None, "passed", "only-head"),
        ("passed", None, "only-base"),
    ],
)
def test_change(base: str | None, head: str | None, expected: str) -> None:
    assert change(Outcome(base) if base else None, Outcome(head) if head else None) == expected


def _rows(*specs: tuple[str, bool, str]) -> list[Row]:
    return [Row(f"f.py::{i}", own, {}, c) for i, own, c in specs]


def test_pair_agreement_flags_a_regression_and_the_fixs_own_tests() -> None:
    agree = pair_agreement("confirmed", _rows(("a", True, "fixed"), ("b", False, "stale")))
    assert agree.agrees is True and agree.flag == ""
    assert agree.text == "probe: confirmed; SGLang's tests: 1 fixed, 1 stale (the fix's own: 1 fixed) — they agree"
    regressed = pair_agreement("confirmed", _rows(("a", True, "fixed"), ("b", False, "regressed")))
    assert regressed.agrees is False and regressed.disagreements == [
        "b regressed (passes on the base, fails on the head)"
    ]
    assert (
        with_flag("2 probe(s): ...", regressed)
        == "2 probe(s): ...; SGLang's tests disagree: b regressed (passes on the base, fails on the head)"
    )
    own_fails = pair_agreement("confirmed", _rows(("a", True, "still-failing"), ("b", False, "still-failing")))
    assert own_fails.disagreements == ["a fails on both sides"], "only the fix's own tests must see it"
    not_fixed = pair_agreement("not-fixed", _rows(("a", True, "fixed")))
    assert not_fixed.agrees is False and "a fixed" in not_fixed.flag
    quiet = pair_agreement("confirmed", _rows(("a", True, "stale")))
    assert quiet.agrees is None and quiet.text.endswith("— no say on behaviour")
    assert pair_agreement("error", _rows(("a", True, "fixed"))).agrees is None


def test_without_own_tests_every_test_judges_the_pair() -> None:
    confirmed = pair_agreement("confirmed", _rows(("a", False, "fixed"), ("b", False, "stale")))
    assert confirmed.agrees is True
    assert confirmed.text == "probe: confirmed; SGLang's tests: 1 fixed, 1 stale — they agree", "no own: not said"
    assert confirmed.to_dict() == {"probe": "confirmed", "text": confirmed.text, "agrees": True, "disagreements": []}
    not_fixed = pair_agreement("not-fixed", _rows(("a", False, "fixed"), ("b", False, "still-failing")))
    assert not_fixed.to_dict() == {
        "probe": "not-fixed",
        "text": "probe: not-fixed; SGLang's tests: 1 fixed, 1 still-failing — they DISAGREE: "
        "a fixed (fails on the base, passes on the head)",
        "agrees": False,
        "disagreements": ["a fixed (fails on the base, passes on the head)"],
    }
    still = pair_agreement("not-fixed", _rows(("a", True, "still-failing"), ("b", False, "fixed")))
    assert still.agrees is True and still.disagreements == [], "the fix's own test still fails: not fixed"
    assert pair_agreement("not-fixed", _rows(("a", True, "still-passing"))).agrees is None
    error = pair_agreement("error", _rows(("a", True, "fixed")))
    assert (error.agrees, error.disagreements, error.flag) == (None, [], "")
    assert error.text == "probe: error; SGLang's tests: 1 fixed (the fix's own: 1 fixed) — no say on behaviour"


def test_a_disagreement_is_added_to_the_reason_only_when_there_is_one() -> None:
    agrees = pair_agreement("confirmed", _rows(("a", True, "fixed")))
    disagrees = pair_agreement("confirmed", _rows(("a", True, "regressed")))
    assert with_flag("probes: ...", None) == "probes: ..." and with_flag("probes: ...", agrees) == "probes: ..."
    flag = "SGLang's tests disagree: a regressed (passes on the base, fails on the head)"
    assert disagrees.flag == flag and with_flag("", disagrees) == flag and with_flag("r", disagrees) == f"r; {flag}"
    assert with_flag("", None) == ""


def test_single_agreement_reads_the_fix_s_own_tests_on_one_source() -> None:
    rows = [Row("f.py::a", True, {"r": Outcome("failed")}), Row("f.py::b", False, {"r": Outcome("passed")})]
    assert single_agreement("bug", "r", rows).agrees is True
    fixed = single_agreement("fixed", "r", rows)
    assert fixed.agrees is False and fixed.disagreements == ["a fails here"]
    assert single_agreement("partial", "r", rows).agrees is None
    assert single_agreement("present", "r", rows[1:]).agrees is None, "no own test: no say"
    none_own = single_agreement("absent", "r", rows[1:])
    assert none_own.text == "probe: absent; SGLang's tests: 1 passed — no say on behaviour", "no own: not said"
    stale = [Row("f.py::a", True, {"r": Outcome("stale")})]
    assert single_agreement("absent", "r", stale).agrees is None, "a stale own test says nothing"
    assert single_agreement("present", "r", stale).agrees is None


def test_symbol_index_reads_bindings_without_importing(tmp_path: Path) -> None:
    pkg = tmp_path / "sglang" / "srt"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub.py").write_text("")
    (pkg / "m.py").write_text(
        "import os.path as osp\nfrom x import y as z\nA, B = 1, 2\ntry:\n    import fast\nexcept ImportError:\n"
        "    fast = None\nclass C:\n    attr: int = 0\n    def m(self):\n        self.inst = 1\n"
        "    class Inner:\n        def n(self): pass\n"
    )
    idx = SymbolIndex(tmp_path)
    assert all(idx.defines("sglang.srt.m", n) for n in ("osp", "z", "A", "B", "fast", "C"))
    assert idx.defines("sglang.srt", "sub") and not idx.defines("sglang.srt.m", "os")
    assert idx.class_defines("sglang.srt.m:C", "m") and idx.class_defines("sglang.srt.m:C", "attr")
    assert not idx.class_defines("sglang.srt.m:C", "inst"), "an instance attribute is the fake's to set"
    assert idx.class_defines("sglang.srt.m:C.Inner", "n") and not idx.class_defines("sglang.srt.m:D", "m")
    assert not idx.class_defines("sglang.srt.nowhere:C", "m"), "no such module: no such class"
    assert idx.has({"module": "sglang.srt.sub", "name": None}) and not idx.has({"module": "sglang.nope", "name": None})


def test_symbol_index_reads_every_branch_of_a_try_and_a_dotted_import(tmp_path: Path) -> None:
    (tmp_path / "sglang").mkdir()
    (tmp_path / "sglang" / "compat.py").write_text(
        "import torch.cuda\ntry:\n    from fast import kernel\nexcept ImportError:\n    slow = True\n"
        "except RuntimeError:\n    broken = True\nelse:\n    fast_ok = True\nfinally:\n    probed = True\n"
    )
    idx = SymbolIndex(tmp_path)
    assert all(idx.defines("sglang.compat", n) for n in ("torch", "kernel", "slow", "broken", "fast_ok", "probed"))
    assert not idx.defines("sglang.compat", "cuda") and not idx.defines("sglang.compat", "torch.cuda")
    owned = {"owners": ["sglang.srt.managers.scheduler:Scheduler.Inner"], "name": "retire"}
    assert symbol_name(owned) == "Scheduler.Inner.retire"
    assert symbol_name({"module": "sglang.srt.doors", "name": None}) == "sglang.srt.doors"


# -- where files come from, the matrix, the command line ---------------------------------------------


def test_tests_dir_from_the_option_or_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV, raising=False)
    assert resolve_tests_dir(None) is None
    (tmp_path / "ok" / "test").mkdir(parents=True)
    assert resolve_tests_dir(tmp_path / "ok") == (tmp_path / "ok").resolve()
    monkeypatch.setenv(ENV, str(tmp_path / "ok"))
    assert resolve_tests_dir(None) == (tmp_path / "ok").resolve()
    assert resolve_tests_dir("") == (tmp_path / "ok").resolve(), "an empty option is no option"
    with pytest.raises(ConfigError, match=r"--upstream-tests .*nowhere: not a folder"):
        resolve_tests_dir(tmp_path / "nowhere")
    monkeypatch.setenv(ENV, str(tmp_path))
    with pytest.raises(ConfigError) as refused:
        resolve_tests_dir(None)
    assert str(refused.value) == (
        f"$DIFFLAB_UPSTREAM_TESTS {tmp_path}: has no test/ folder; give a folder laid out like SGLang's repository "
        "(test/registered/unit/...), e.g. a sparse checkout of SGLang's test/ tree"
    )


def test_locate_takes_the_first_tree_holding_the_file(tmp_path: Path) -> None:
    fakes.write(tmp_path / "fork", {"test/a.py": "# fork's copy\n"})
    fakes.write(tmp_path / "dir", {"test/a.py": "# folder's copy\n", "test/b.py": ""})
    trees = [Tree(tmp_path / "fork", "fork"), Tree(tmp_path / "dir", "dir")]
    a, b = locate("test/a.py", trees), locate("test/b.py", trees)
    assert a is not None and a.origin == "fork" and a.path.read_text() == "# fork's copy\n"
    assert b is not None and b.origin == "dir" and locate("test/c.py", trees) is None


def _matrix(tmp_path: Path, tests: str) -> Path:
    path = tmp_path / "m.toml"
    path.write_text(
        RELEASES
        + '[[fixes]]\nid = "1"\npr = 1\ntitle = "t"\nbase = { release = "0.5.20" }\nhead = { release = "0.5.21" }\n'
        + f"upstream_tests = {tests}\n"
    )
    return path


def test_matrix_names_files_and_the_fixs_own_test_ids(tmp_path: Path) -> None:
    fix = load_matrix(_matrix(tmp_path, '["test/a.py", { file = "test/b.py", own = ["T::test_x", "test_y"] }]')).fix(
        "1"
    )
    assert [(t.file, t.own) for t in fix.upstream_tests] == [("test/a.py", ()), ("test/b.py", ("T::test_x", "test_y"))]


@pytest.mark.parametrize(
    ("tests", "message"),
    [
        ('"test/a.py"', r"upstream_tests: expected a list"),
        ('["/abs/a.py"]', r"upstream_tests\[0\]\.file: '/abs/a.py' is not a relative path"),
        ('["test/../a.py"]', r"is not a relative path"),
        ('["test/a.txt"]', r"is not a relative path to a \.py file"),
        ('[{ file = "test/a.py", tests = [] }]', r"upstream_tests\[0\]: unknown key\(s\) \['tests'\]"),
        ('[{ file = "test/a.py", own = "T::x" }]', r"upstream_tests\[0\]\.own: expected a list of test ids"),
        ('["test/a.py", "test/a.py"]', r"upstream_tests\[1\]: test/a.py is listed twice"),
    ],
)
def test_matrix_refuses_bad_upstream_tests(tmp_path: Path, tests: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_matrix(_matrix(tmp_path, tests))


def test_a_bad_folder_stops_every_command_before_it_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "no-such-folder"
    assert cli(["run", "--fix", "38935", "--upstream-tests", str(missing), "--out", str(tmp_path / "r")]) == 2
    assert f"--upstream-tests {missing}: not a folder" in capsys.readouterr().err
    assert not (tmp_path / "r").exists(), "nothing half-written"
    monkeypatch.setenv(ENV, str(missing))
    assert cli(["contains", "--fix", "38935", "--out", str(tmp_path / "c")]) == 2
    assert f"$DIFFLAB_UPSTREAM_TESTS {missing}: not a folder" in capsys.readouterr().err
    assert cli(["backport", "--repo", str(tmp_path), "--ref", "main", "--fix", "38935"]) == 2
    assert "not a folder" in capsys.readouterr().err


def test_the_staged_pytest_holds_what_pytest_needs_and_nothing_else(tmp_path: Path) -> None:
    names = {str(d.metadata["Name"]).lower() for d in closure()}
    assert {"pytest", "pluggy", "iniconfig"} <= names and "pytest-xdist" not in names
    staged = stage_pytest(tmp_path)
    assert (staged / "pytest" / "__init__.py").is_file() and (staged / "_pytest").is_dir()
    assert stage_pytest(tmp_path) == staged, "content-keyed: staged once"
    assert not list(staged.rglob("__pycache__"))
