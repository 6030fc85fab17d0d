"""SGLang's own tests read back and reported from the test child's own records (fast: no child process).

The records are what :func:`difflab.probe.upstream_child.run` returns for the stand-in ``sglang``
(``upstream_fakes``: a base without the fix, a head with it) and its unittest-style files, run
here in this process with each side's ``sglang`` importable alone, as in the child. The jobs are
the replay's own (``jobs_for``), given those results the way a finished job takes its result
file, and read by the replay. Everything after the child is then the product's: outcomes,
changes, the agreement, ``upstream-tests.json``, the JUnit files and the Markdown section. The
same path through a real child process (and a pytest-style file) is in ``test_upstream_tests.py``.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from xml.etree import ElementTree

import pytest
from junitparser import JUnitXml

import upstream_fakes as fakes
from difflab.matrix.model import Fix, SidePin, UpstreamTestFile
from difflab.probe import upstream_child
from difflab.report.upstream_tests import section, write_files
from difflab.source.base import MaterialisedSource
from difflab.upstream_tests.files import Tree, locate
from difflab.upstream_tests.outcomes import Reference
from difflab.upstream_tests.process import Job, plan, run_jobs
from difflab.upstream_tests.replay import FixReplay, Plan, jobs_for, read
from difflab.upstream_tests.symbols import SymbolIndex
from difflab.upstream_tests.witness import (
    agree_on_side,
    agree_with_run,
    for_run,
    for_sources,
    release_reference,
    run_plans,
    source_plans,
    with_flag,
)

D, P, L = fakes.D, fakes.P, fakes.L
DOORS = "TestDoors::test_"
RETIRED, VALID, SENDER, BROKEN = (
    f"{D}::{DOORS}{n}" for n in ("rejected_is_retired", "valid_is_admitted", "needs_no_sender", "broken_helper")
)
PREDICATE = f"{P}::TestPredicate::test_rejected_holding_nothing"
LATER = f"{L}::TestLater::test_uses_a_later_refactor"
OWN = {D: ["TestDoors::test_rejected_is_retired"], P: ["TestPredicate::test_rejected_holding_nothing"]}
LACKS = "lacks sglang.srt.doors.is_unadmitted, which the fix adds (its head has it, its base does not)"
FAKE = "the test's fake SimpleNamespace does not fit this code"
NO_SENDER = "AttributeError: 'types.SimpleNamespace' object has no attribute 'create_sender'"
LATER_WHY = "needs sglang.srt.doors.a_later_refactor, which this code lacks and the fix does not add"
LISTS = "Lists differ: [namespace(rejected=True, slot=-1)] != []"

# A test class whose tests come from a sibling module: a side that cannot import the file does not
# see them (``declared_tests`` reads the file alone), the side that can does.
SHARED_CASES = (
    fakes.HEADER
    + """from types import SimpleNamespace


class DoorCases:
    def test_inherited_rejected(self):
        from sglang.srt.doors import is_unadmitted

        self.assertTrue(is_unadmitted(SimpleNamespace(rejected=True, slot=-1)))
"""
)
INHERITED = (
    fakes.HEADER
    + """import unittest

from fake_door_cases import DoorCases
from sglang.srt.doors import is_unadmitted  # only the fix's head has it


class TestInherited(DoorCases, unittest.TestCase):
    pass
"""
)
INHERITED_LATER = INHERITED.replace("is_unadmitted  # only the fix's head has it", "a_later_refactor")
TWO = (
    fakes.HEADER
    + """import unittest
from types import SimpleNamespace

from sglang.srt.doors import is_unadmitted


class TestTwo(unittest.TestCase):
    def test_nothing_held(self):
        self.assertTrue(is_unadmitted(SimpleNamespace(rejected=True, slot=-1)))

    def test_a_slot_held(self):
        self.assertFalse(is_unadmitted(SimpleNamespace(rejected=True, slot=2)))
"""
)
MARKS = (
    fakes.HEADER
    + """import unittest
from types import SimpleNamespace

from sglang.srt.doors import admit


def _queue():
    return SimpleNamespace(items=[], scheduler=SimpleNamespace(retire=lambda req: None), create_sender=lambda r: True)


class TestMarks(unittest.TestCase):
    @unittest.expectedFailure
    def test_a_rejected_request_is_known_to_be_enqueued(self):
        queue = _queue()
        admit(queue, SimpleNamespace(rejected=True, slot=-1))
        self.assertEqual(queue.items, [])

    def test_two_requests_are_enqueued(self):
        queue = _queue()
        admit(queue, SimpleNamespace(rejected=False, slot=0))
        self.assertEqual(len(queue.items), 2)

    @unittest.skip("needs a GPU")
    def test_on_a_gpu(self):
        pass
"""
)
INHERITS, J, K, M = (f"{fakes.FOLDER}/test_fake_{n}.py" for n in ("inherited", "inherited_later", "two", "marks"))


@contextmanager
def importing_from(root: Path) -> Iterator[None]:
    """``sglang`` importable from ``root`` alone, as in the child; this process's modules and path back after."""
    modules, path = dict(sys.modules), list(sys.path)
    for name in [k for k in sys.modules if k == "sglang" or k.startswith("sglang.")]:
        del sys.modules[name]
    sys.path.insert(0, str(root))
    try:
        yield
    finally:
        sys.path[:] = path
        for name in set(sys.modules) - set(modules):
            del sys.modules[name]
        sys.modules.update(modules)


def run_here(jobs: list[Job], tmp: Path, died: str | None = None) -> list[Job]:
    """Each job's files run by the child's own code in this process, its result read back as from the file;
    the job of the source labelled ``died`` ends as one whose process left no result."""
    for job in jobs:
        if job.source.label == died:
            job.status, job.error = "error", "test process died (exit 3)\nSegmentation fault"
            continue
        with importing_from(job.source.root), pytest.MonkeyPatch.context() as mp:
            mp.delenv("CUDA_VISIBLE_DEVICES", raising=False)  # the stand-in test_utils reads it, as SGLang's does
            result = upstream_child.run(job.request(tmp / "result.json", None))
        job.done(json.loads(json.dumps(result)))
        job.log = f"ran {len(job.files)} file(s) on {job.source.label}\n"
    return jobs


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("records")
    unittest_files = {rel: text for rel, text in fakes.TEST_FILES.items() if rel != fakes.Y}
    extra = {
        INHERITS: INHERITED,
        J: INHERITED_LATER,
        K: TWO,
        M: MARKS,
        f"{fakes.FOLDER}/fake_door_cases.py": SHARED_CASES,
    }
    return {
        "root": root,
        "base": fakes.fake_source(root / "base", "base", fixed=False).root,
        "head": fakes.fake_source(root / "head", "head", fixed=True).root,
        "tests": fakes.write(root / "tests", unittest_files),
        "more": fakes.write(root / "more", extra),
    }


def sources(lab: dict[str, Path]) -> dict[str, MaterialisedSource]:
    return {
        "base": fakes.fake_source(lab["base"], "base", fixed=False),
        "head": fakes.fake_source(lab["head"], "head", fixed=True),
    }


def replayed(
    lab: dict[str, Path],
    sides: dict[str, str],
    pair: tuple[str, str] | None = None,
    fix: Fix | None = None,
    trees: list[Tree] | None = None,
    died: str | None = None,
) -> FixReplay:
    """The stand-in fix replayed on ``sides`` (each ``base``, ``head`` or why it is unavailable) from the tests
    folder; its pytest-style file is named in the matrix but not in the folder."""
    known = sources(lab)
    chosen: dict[str, MaterialisedSource | str] = {name: known.get(s, s) for name, s in sides.items()}
    ref = Reference(SymbolIndex(known["base"].root), SymbolIndex(known["head"].root))
    tree = [Tree(lab["tests"], "the tests folder")] if trees is None else trees
    p = Plan(fix or fakes.fake_fix(OWN), chosen, tree, ref, pair=pair)
    located, jobs = jobs_for([p])
    (found,) = read([p], located, run_here(jobs, lab["root"], died))
    return found


@pytest.fixture(scope="module")
def lab_python(tmp_path_factory: pytest.TempPathFactory) -> fakes.LabPython:
    """The shared environment's stand-in for the real child processes, its staged pytest kept between them."""
    return fakes.LabPython(tmp_path_factory.mktemp("cache"))


@pytest.fixture
def pair(lab: dict[str, Path]) -> FixReplay:
    return replayed(lab, {"base": "base", "head": "head"}, ("base", "head"))


def cases(path: Path) -> list[tuple[str, str, str, str, str]]:
    """``(classname, name, result, message, type)`` of each case of a JUnit file."""
    out = []
    for case in next(iter(JUnitXml.fromfile(str(path)))):
        result = case.result[0] if case.result else None
        kind = type(result).__name__.lower() if result is not None else "passed"
        message = (result.message or "") if result is not None else ""
        out.append((case.classname, case.name, kind, message, (result.type or "") if result is not None else ""))
    return out


def _import_error(name: str, root: Path) -> str:
    return f"ImportError: cannot import name '{name}' from 'sglang.srt.doors' ({root / 'sglang' / 'srt' / 'doors.py'})"


# -- the replay read back ----------------------------------------------------------------------------------


def test_the_child_s_records_read_into_each_test_s_outcomes_and_change(pair: FixReplay, lab: dict[str, Path]) -> None:
    seen = {row.id: (row.outcome("base"), row.outcome("head"), row.change, row.own) for row in pair.rows}
    assert seen == {
        BROKEN: ("error", "error", "error", False),
        SENDER: ("stale", "passed", "stale", False),
        RETIRED: ("failed", "passed", "fixed", True),
        VALID: ("passed", "passed", "still-passing", False),
        PREDICATE: ("failed", "passed", "fixed", True),
        LATER: ("stale", "stale", "stale", False),
    }
    assert [row.id for row in pair.rows] == list(seen), "in the order the sides saw them"
    assert [f.id for f in pair.files] == [D, P, L] and {f.origin for f in pair.files} == {"the tests folder"}
    assert pair.not_found == [fakes.Y] and pair.note == f"not found: {fakes.Y}"
    base = pair.sides["base"]
    assert (base.status, base.error, base.source) == ("ok", None, {"kind": "fake", "label": "base"})
    assert base.runner["retry_unwrapped"] == ["sglang.test.test_utils.CustomTestCase"]
    assert base.log == "ran 3 file(s) on base\n"
    predicate = base.tests[PREDICATE]
    assert (predicate.outcome, predicate.phase, predicate.why) == ("failed", "import", LACKS)


def _more(lab: dict[str, Path]) -> FixReplay:
    files = tuple(UpstreamTestFile(f, ()) for f in (INHERITS, J, K, M))
    fix = Fix("2", 2, "t", SidePin(release="base"), SidePin(release="head"), (), upstream_tests=files)
    return replayed(lab, {"base": "base", "head": "head"}, ("base", "head"), fix, [Tree(lab["more"], "more")])


def test_a_regression_an_unexpected_success_and_a_skip_are_reported_as_such(
    lab: dict[str, Path], tmp_path: Path
) -> None:
    r = _more(lab)
    known, both, gpu = (
        f"{M}::TestMarks::{n}"
        for n in ("test_a_rejected_request_is_known_to_be_enqueued", "test_two_requests_are_enqueued", "test_on_a_gpu")
    )
    seen = {row.id: (row.outcome("base"), row.outcome("head"), row.change) for row in r.rows if row.id.startswith(M)}
    assert seen == {
        known: ("passed", "failed", "regressed"),
        gpu: ("skipped", "skipped", "skipped"),
        both: ("failed", "failed", "still-failing"),
    }
    write_files(tmp_path, [r], None)
    marks = [c for c in cases(tmp_path / "upstream-tests" / "2" / "head.xml") if c[0] == "test.unit.test_fake_marks"]
    lists = "AssertionError: 1 != 2"
    assert marks == [
        (
            marks[0][0],
            "TestMarks::test_a_rejected_request_is_known_to_be_enqueued",
            "failure",
            "unexpected success of an expectedFailure test",
            "",
        ),
        (marks[0][0], "TestMarks::test_on_a_gpu", "skipped", "needs a GPU", ""),
        (marks[0][0], "TestMarks::test_two_requests_are_enqueued", "failure", lists, "AssertionError"),
    ]
    md = section([r])
    assert "| `TestMarks::test_a_rejected_request_is_known_to_be_enqueued` | | passed | failed | regressed |" in md
    assert not [line for line in md if line.startswith("- base, passed")], "an expected failure passed: no why"
    summary = [c for c in cases(tmp_path / "upstream-tests.xml") if c[1].startswith("TestMarks::")]
    assert summary == [
        (
            "upstream.2",
            "TestMarks::test_a_rejected_request_is_known_to_be_enqueued",
            "failure",
            "regressed: base: passed; head: failed",
            "regressed",
        ),
        ("upstream.2", "TestMarks::test_on_a_gpu", "skipped", "skipped: base: skipped; head: skipped", ""),
        (
            "upstream.2",
            "TestMarks::test_two_requests_are_enqueued",
            "failure",
            "still-failing: base: failed; head: failed",
            "still-failing",
        ),
    ]


def test_a_file_that_does_not_import_on_a_later_side_fails_each_test_an_earlier_side_names(
    lab: dict[str, Path],
) -> None:
    fix = Fix(
        "2", 2, "t", SidePin(release="a"), SidePin(release="b"), (), upstream_tests=(UpstreamTestFile(INHERITS, ()),)
    )
    r = replayed(lab, {"0.5.21": "head", "0.5.20": "base"}, None, fix, [Tree(lab["more"], "more")])
    inherited = f"{INHERITS}::TestInherited::test_inherited_rejected"
    assert [(row.id, row.outcome("0.5.21"), row.outcome("0.5.20")) for row in r.rows] == [
        (inherited, "passed", "failed")
    ]
    assert list(r.sides["0.5.20"].tests) == [inherited]


def test_a_file_that_does_not_import_on_one_side_fails_each_test_the_other_side_names(lab: dict[str, Path]) -> None:
    files = tuple(UpstreamTestFile(f, ()) for f in (INHERITS, J, K))
    fix = Fix("2", 2, "t", SidePin(release="base"), SidePin(release="head"), (), upstream_tests=files)
    r = replayed(lab, {"base": "base", "head": "head"}, ("base", "head"), fix, [Tree(lab["more"], "more")])
    inherited, one, two = (
        f"{INHERITS}::TestInherited::test_inherited_rejected",
        f"{K}::TestTwo::test_a_slot_held",
        f"{K}::TestTwo::test_nothing_held",
    )
    seen = {row.id: (row.outcome("base"), row.outcome("head"), row.change) for row in r.rows}
    assert seen == {
        inherited: ("failed", "passed", "fixed"),
        f"{J}::(import)": ("stale", "stale", "stale"),
        one: ("failed", "passed", "fixed"),
        two: ("failed", "passed", "fixed"),
    }
    assert f"{INHERITS}::(import)" not in r.sides["base"].tests, "the file's one import failure became its tests'"
    assert r.sides["base"].tests[inherited].why == LACKS
    assert r.summary() == {"stale": [f"{J}::(import)"], "fixed": [two, one, inherited]}, "in the order first seen"
    stopped = f"- base, failed: {LACKS}; {_import_error('is_unadmitted', lab['base'])} — "
    why = [line for line in section([r]) if line.startswith(stopped)]
    held, nothing = "`TestTwo::test_a_slot_held`", "`TestTwo::test_nothing_held`"
    assert why == [f"{stopped}{nothing}, {held}, `TestInherited::test_inherited_rejected`"], "one reason, said once"


def test_the_agreement_beside_the_run_s_verdict(pair: FixReplay) -> None:
    said = agree_with_run([pair], {"1": "confirmed"})
    counted = "SGLang's tests: 2 fixed, 1 still-passing, 2 stale, 1 error (the fix's own: 2 fixed)"
    assert said == {"1": pair.agreement} and pair.agreement is not None
    assert pair.agreement.text == f"probe: confirmed; {counted} — they agree" and pair.agreement.agrees is True
    (no_verdict,) = agree_with_run([pair], {}).values()
    assert no_verdict.text == f"probe: error; {counted} — no say on behaviour" and no_verdict.agrees is None
    (not_fixed,) = agree_with_run([pair], {"1": "not-fixed"}).values()
    assert not_fixed.disagreements == [
        "TestDoors::test_rejected_is_retired fixed (fails on the base, passes on the head)",
        "TestPredicate::test_rejected_holding_nothing fixed (fails on the base, passes on the head)",
    ]
    assert with_flag("1 probe(s): ...", not_fixed) == "1 probe(s): ...; " + not_fixed.flag
    assert not_fixed.flag.startswith("SGLang's tests disagree: TestDoors::test_rejected_is_retired fixed")


def test_a_side_whose_test_process_died_is_an_error_and_no_test_changes(lab: dict[str, Path], tmp_path: Path) -> None:
    on_head = replayed(lab, {"base": "base", "head": "head"}, ("base", "head"), died="base")
    assert {row.change for row in on_head.rows} == {"only-head"} and on_head.sides["base"].status == "error"
    r = replayed(lab, {"base": "base", "head": "head"}, ("base", "head"), died="head")
    head = r.sides["head"]
    assert (head.status, head.error, head.tests) == ("error", "test process died (exit 3)\nSegmentation fault", {})
    assert {row.change for row in r.rows} == {"only-base"} and len(r.rows) == 6
    (said,) = agree_with_run([r], {"1": "confirmed"}).values()
    assert said.agrees is None and said.text.endswith(
        "SGLang's tests: 6 only-base (the fix's own: 2 only-base) — no say on behaviour"
    )
    write_files(tmp_path, [r], None)
    run_case, *tests = cases(tmp_path / "upstream-tests" / "1" / "head.xml")
    assert run_case == ("upstream.1.head", "(run)", "error", "test process died (exit 3) Segmentation fault", "error")
    assert tests == []
    summary = cases(tmp_path / "upstream-tests.xml")
    assert summary[2] == ("upstream.1", "TestDoors::test_rejected_is_retired", "skipped", "only-base: base: failed", "")


def test_no_test_file_found_is_said_and_written(lab: dict[str, Path], tmp_path: Path) -> None:
    r = replayed(lab, {"base": "base", "head": "head"}, ("base", "head"), trees=[Tree(tmp_path, "an empty folder")])
    assert (r.files, r.rows, r.sides) == ([], [], {}) and r.not_found == list(fakes.TEST_FILES)
    assert r.note == "no test file found in an empty folder"
    assert replayed(lab, {"base": "base"}, trees=[]).note == "no test file found in no test tree"
    write_files(tmp_path / "out", [r], None)
    assert cases(tmp_path / "out" / "upstream-tests.xml") == [
        ("upstream.1", "(no tests)", "skipped", "no test file found in an empty folder", "")
    ]
    assert not (tmp_path / "out" / "upstream-tests").exists(), "no side ran"
    assert section([r]) == [
        "",
        "## SGLang's own tests (supporting evidence)",
        "",
        "### #1",
        "",
        "Note: no test file found in an empty folder",
        "",
        "",
    ]
    assert section([r, _more(lab)])[8:10] == ["### #2", ""], "the next fix follows"


def test_a_pair_with_neither_side_available_ran_no_test(lab: dict[str, Path], tmp_path: Path) -> None:
    fix = Fix("1", 1, "t", SidePin(release="a"), SidePin(release="b"), (), upstream_tests=(UpstreamTestFile(D, ()),))
    unavailable = {"base": "no such commit", "head": "no such commit"}
    r = replayed(lab, unavailable, ("base", "head"), fix)
    assert (r.rows, r.note, [s.status for s in r.sides.values()]) == ([], None, ["unavailable"] * 2)
    write_files(tmp_path, [r], None)
    assert cases(tmp_path / "upstream-tests.xml") == [("upstream.1", "(no tests)", "skipped", "no test ran", "")]


# -- the files a replay leaves in a results folder --------------------------------------------------------


def test_upstream_tests_json_holds_every_side_and_test(pair: FixReplay, lab: dict[str, Path], tmp_path: Path) -> None:
    agree_with_run([pair], {"1": "confirmed"})
    assert write_files(tmp_path, [pair], lab["tests"]) == tmp_path / "upstream-tests.json"
    doc = json.loads((tmp_path / "upstream-tests.json").read_text())
    assert (doc["schema"], doc["tests_dir"]) == (2, str(lab["tests"]))
    (fix,) = doc["fixes"]
    assert fix == json.loads(json.dumps(pair.to_dict()))
    assert (fix["fix"], fix["label"], fix["pair"], fix["note"]) == (
        "1",
        "#1",
        ["base", "head"],
        f"not found: {fakes.Y}",
    )
    assert fix["own"] == [RETIRED, PREDICATE] and fix["agreement"]["agrees"] is True
    assert fix["summary"] == {
        "error": [BROKEN],
        "stale": [SENDER, LATER],
        "fixed": [RETIRED, PREDICATE],
        "still-passing": [VALID],
    }
    assert set(fix) == {
        "fix",
        "label",
        "files",
        "not_found",
        "own",
        "note",
        "sides",
        "tests",
        "pair",
        "summary",
        "agreement",
    }
    doors = pair.files[0]
    assert fix["files"][0] == {"file": D, "from": "the tests folder", "path": str(doors.path), "sha256": doors.sha256}
    assert fix["not_found"] == [fakes.Y] and list(fix["sides"]) == ["base", "head"]
    row = next(t for t in fix["tests"] if t["id"] == RETIRED)
    assert set(row) == {"id", "own", "outcomes", "change"} and (row["own"], row["change"]) == (True, "fixed")
    valid = pair.sides["base"].tests[VALID]
    assert fix["sides"]["base"]["tests"][VALID] == {
        "outcome": "passed",
        "message": None,
        "error_type": None,
        "why": None,
        "phase": "call",
        "duration_s": round(valid.duration_s, 6),
        "subtests": [],
        "traceback": None,
    }
    side = fix["sides"]["head"]
    assert set(side) == {"side", "source", "status", "error", "runner", "tests"}
    assert (side["side"], side["source"], side["status"], side["error"]) == (
        "head",
        {"kind": "fake", "label": "head"},
        "ok",
        None,
    )
    assert side["runner"]["retry_unwrapped"] == ["sglang.test.test_utils.CustomTestCase"] and len(side["tests"]) == 6
    assert [(s["name"], s["outcome"]) for s in row["outcomes"]["base"]["subtests"]] == [
        ("(door='prefill')", "failed"),
        ("(door='decode')", "failed"),
    ]
    for side in ("base", "head"):
        folder = tmp_path / "upstream-tests" / "1"
        assert json.loads((folder / f"{side}.json").read_text()) == json.loads(json.dumps(pair.sides[side].to_dict()))
        assert (folder / f"{side}.log").read_text() == f"ran 3 file(s) on {side}\n"
    write_files(tmp_path / "bare", [pair], None)
    assert json.loads((tmp_path / "bare" / "upstream-tests.json").read_text())["tests_dir"] is None


def test_each_side_s_junit_file_has_a_case_per_test_and_stale_is_a_skip(
    pair: FixReplay, lab: dict[str, Path], tmp_path: Path
) -> None:
    write_files(tmp_path, [pair], None)
    folder = tmp_path / "upstream-tests" / "1"
    doors, predicate, later = "test.unit.test_fake_doors", "test.unit.test_fake_predicate", "test.unit.test_fake_later"
    stale_later = f"stale: {LATER_WHY}; {_import_error('a_later_refactor', lab['base'])}"
    assert cases(folder / "base.xml") == [
        (doors, "TestDoors::test_broken_helper", "error", "ValueError: the test itself is broken", "ValueError"),
        (doors, "TestDoors::test_needs_no_sender", "skipped", f"stale: {FAKE}; {NO_SENDER}", ""),
        (
            doors,
            "TestDoors::test_rejected_is_retired",
            "failure",
            f"AssertionError: (door='prefill'): {LISTS}",
            "AssertionError",
        ),
        (doors, "TestDoors::test_valid_is_admitted", "passed", "", ""),
        (
            predicate,
            "TestPredicate::test_rejected_holding_nothing",
            "failure",
            f"{LACKS}; {_import_error('is_unadmitted', lab['base'])}",
            "ImportError",
        ),
        (later, "TestLater::test_uses_a_later_refactor", "skipped", stale_later, ""),
    ]
    head = cases(folder / "head.xml")
    assert [c[2] for c in head] == ["error", "passed", "passed", "passed", "passed", "skipped"]
    suite = next(iter(JUnitXml.fromfile(str(folder / "base.xml"))))
    assert suite.name == "upstream-tests.1.base"
    broken = next(c for c in suite if c.name == "TestDoors::test_broken_helper")
    assert broken.system_err.rstrip().endswith("ValueError: the test itself is broken"), "the traceback kept"
    assert broken.time == round(pair.sides["base"].tests[BROKEN].duration_s, 3)
    stale = next(c for c in suite if c.name == "TestDoors::test_needs_no_sender")
    assert stale.system_err.rstrip().endswith(NO_SENDER), "a stale test keeps its traceback and its time too"
    timed = {c.get("name"): c.get("time") for c in ElementTree.parse(folder / "base.xml").iter("testcase")}
    assert timed["TestDoors::test_needs_no_sender"] == str(round(pair.sides["base"].tests[SENDER].duration_s, 3))
    passed = next(c for c in suite if c.name == "TestDoors::test_valid_is_admitted")
    assert passed.system_err is None


def test_the_summary_junit_file_has_a_case_per_test_and_its_change(pair: FixReplay, tmp_path: Path) -> None:
    write_files(tmp_path, [pair], None)
    assert cases(tmp_path / "upstream-tests.xml") == [
        ("upstream.1", "TestDoors::test_broken_helper", "error", "error: base: error; head: error", "error"),
        ("upstream.1", "TestDoors::test_needs_no_sender", "skipped", "stale: base: stale; head: passed", ""),
        ("upstream.1", "TestDoors::test_rejected_is_retired", "passed", "", ""),
        ("upstream.1", "TestDoors::test_valid_is_admitted", "passed", "", ""),
        ("upstream.1", "TestPredicate::test_rejected_holding_nothing", "passed", "", ""),
        ("upstream.1", "TestLater::test_uses_a_later_refactor", "skipped", "stale: base: stale; head: stale", ""),
    ]
    suite = next(iter(JUnitXml.fromfile(str(tmp_path / "upstream-tests.xml"))))
    assert suite.name == "upstream-tests"


def test_the_markdown_section_says_the_agreement_the_files_and_each_test(pair: FixReplay, lab: dict[str, Path]) -> None:
    agree_with_run([pair], {"1": "confirmed"})
    sha = {f.id: f.sha256[:16] for f in pair.files}
    escaped = LISTS.replace("[", "&#91;").replace("]", "&#93;")
    assert section([pair]) == [
        "",
        "## SGLang's own tests (supporting evidence)",
        "",
        "### #1",
        "",
        "probe: confirmed; SGLang's tests: 2 fixed, 1 still-passing, 2 stale, 1 error (the fix's own: 2 fixed)"
        " — they agree",
        "",
        f"Note: not found: {fakes.Y}",
        "",
        f"- `{D}` from the tests folder (sha256 `{sha[D]}`)",
        f"- `{P}` from the tests folder (sha256 `{sha[P]}`)",
        f"- `{L}` from the tests folder (sha256 `{sha[L]}`)",
        "",
        "| test | own | base | head | change |",
        "|---|---|---|---|---|",
        "| `TestDoors::test_broken_helper` | | error | error | error |",
        "| `TestDoors::test_needs_no_sender` | | stale | passed | stale |",
        "| `TestDoors::test_rejected_is_retired` | ✓ | failed | passed | fixed |",
        "| `TestDoors::test_valid_is_admitted` | | passed | passed | still-passing |",
        "| `TestPredicate::test_rejected_holding_nothing` | ✓ | failed | passed | fixed |",
        "| `TestLater::test_uses_a_later_refactor` | | stale | stale | stale |",
        "",
        "<details><summary>why each test that did not pass did not</summary>",
        "",
        "- base, error: ValueError: the test itself is broken — `TestDoors::test_broken_helper`",
        "- head, error: ValueError: the test itself is broken — `TestDoors::test_broken_helper`",
        f"- base, stale: {FAKE}; {NO_SENDER} — `TestDoors::test_needs_no_sender`",
        f"- base, failed: AssertionError: (door='prefill'): {escaped} — `TestDoors::test_rejected_is_retired`",
        f"- base, failed: {LACKS}; {_import_error('is_unadmitted', lab['base'])}"
        " — `TestPredicate::test_rejected_holding_nothing`",
        f"- base, stale: {LATER_WHY}; {_import_error('a_later_refactor', lab['base'])}"
        " — `TestLater::test_uses_a_later_refactor`",
        f"- head, stale: {LATER_WHY}; {_import_error('a_later_refactor', lab['head'])}"
        " — `TestLater::test_uses_a_later_refactor`",
        "",
        "</details>",
        "",
    ]


# -- one source per side: releases, a fork --------------------------------------------------------------------


def test_releases_each_report_their_own_outcomes_and_an_unavailable_one_its_reason(
    lab: dict[str, Path], tmp_path: Path
) -> None:
    r = replayed(lab, {"0.5.20": "base", "0.5.21": "head", "0.5.19": "no wheel for 0.5.19"})
    assert r.pair is None and {row.change for row in r.rows} == {None}
    assert {tuple(row.to_dict()) for row in r.rows} == {("id", "own", "outcomes")}, "no change without a pair"
    assert r.sides["0.5.19"].to_dict() == {
        "side": "0.5.19",
        "source": {},
        "status": "unavailable",
        "error": "no wheel for 0.5.19",
        "runner": {},
        "tests": {},
    }
    assert r.summary()["0.5.20: failed"] == [RETIRED, PREDICATE] and r.summary()["0.5.21: passed"] == [
        SENDER,
        RETIRED,
        VALID,
        PREDICATE,
    ]
    said = agree_on_side([r], {("1", "0.5.20"): "absent", ("1", "0.5.21"): "present"})
    assert {k: a.agrees for k, a in said.items()} == {
        ("1", "0.5.20"): True,
        ("1", "0.5.21"): True,
        ("1", "0.5.19"): None,
    }
    assert r.agreement is None, "three sources: no one agreement for the fix"
    unavailable = "probe: error; SGLang's tests: none ran (the fix's own: none ran) — no say on behaviour"
    assert said[("1", "0.5.19")].text == unavailable, "a side where nothing ran counts nothing"
    write_files(tmp_path, [r], None)
    summary = cases(tmp_path / "upstream-tests.xml")
    assert summary[:3] == [
        (
            "upstream.1",
            "TestDoors::test_broken_helper @ 0.5.20",
            "error",
            "ValueError: the test itself is broken",
            "ValueError",
        ),
        (
            "upstream.1",
            "TestDoors::test_broken_helper @ 0.5.21",
            "error",
            "ValueError: the test itself is broken",
            "ValueError",
        ),
        ("upstream.1", "TestDoors::test_needs_no_sender @ 0.5.20", "skipped", f"stale: {FAKE}; {NO_SENDER}", ""),
    ]
    assert len(summary) == 12 and not any("0.5.19" in c[1] for c in summary)
    assert cases(tmp_path / "upstream-tests" / "1" / "0.5.19.xml") == [
        ("upstream.1.0.5.19", "(run)", "error", "no wheel for 0.5.19", "unavailable")
    ]
    md = section([r])
    assert "| test | own | 0.5.20 | 0.5.21 | 0.5.19 |" in md
    assert "| `TestDoors::test_rejected_is_retired` | ✓ | failed | passed | — |" in md


def test_one_source_s_agreement_is_the_fix_s_and_a_contradiction_is_said(lab: dict[str, Path]) -> None:
    r = replayed(lab, {"fork": "head"})
    (said,) = agree_on_side([r], {("1", "fork"): "bug"}).values()
    assert r.agreement is said and said.agrees is False
    assert said.disagreements == [
        "TestDoors::test_rejected_is_retired passes here",
        "TestPredicate::test_rejected_holding_nothing passes here",
    ]
    assert said.text == (
        "probe: bug; SGLang's tests: 4 passed, 1 error, 1 stale (the fix's own: 2 passed) — they DISAGREE: "
        "TestDoors::test_rejected_is_retired passes here; TestPredicate::test_rejected_holding_nothing passes here"
    )
    md = section([r])
    assert said.text in md and "| test | own | fork |" in md


# -- the processes: one per source, every file it needs ------------------------------------------------------


def test_one_process_per_source_with_every_file_it_needs(lab: dict[str, Path], tmp_path: Path) -> None:
    known = sources(lab)
    a, b = locate(D, [Tree(lab["tests"], "t")]), locate(P, [Tree(lab["tests"], "t")])
    fork_copy = locate(D, [Tree(fakes.write(tmp_path / "fork", {D: "# the fork's copy\n"}), "fork")])
    assert a is not None and b is not None and fork_copy is not None
    jobs = plan([(known["base"], a), (known["head"], a), (known["base"], b), (known["base"], a)])
    assert [(j.source.label, [f.id for f in j.files]) for j in jobs] == [("base", [D, P]), ("head", [D])]
    clash = plan([(known["base"], a), (known["base"], fork_copy)])
    assert [[f.origin for f in j.files] for j in clash] == [["t"], ["fork"]], "one id per process"
    moved = MaterialisedSource("base", "fake", tmp_path, {}, known["base"].digest)
    assert len(plan([(known["base"], a), (moved, a)])) == 2, "the same digest in another folder is another source"
    assert jobs[0].request(tmp_path / "r.json", tmp_path / "pytest") == {
        "out": str(tmp_path / "r.json"),
        "source_root": str(known["base"].root),
        "pytest_path": str(tmp_path / "pytest"),
        "files": [a.request(), b.request()],
    }
    assert jobs[1].request(tmp_path / "r.json", None)["pytest_path"] is None
    jobs[0].done({"tests": [{"id": f"{D}::x", "file": D}, {"id": f"{P}::y", "file": P}], "runner": {"python": "3"}})
    assert (jobs[0].status, jobs[0].runner, jobs[0].records(P)) == (
        "ok",
        {"python": "3"},
        [{"id": f"{P}::y", "file": P}],
    )
    jobs[1].done({})
    assert (jobs[1].status, jobs[1].tests, jobs[1].runner) == ("ok", [], {})


def test_a_test_process_that_dies_is_an_error_with_its_output(tmp_path: Path, lab_python: fakes.LabPython) -> None:
    """A real child: a fork's replay whose test file ends the process at import."""
    fork = fakes.fake_source(tmp_path / "src", "fork", fixed=True)
    exits = f"{fakes.FOLDER}/test_exits.py"
    leaves = "import os\n\nprint('leaving', os.getcwd(), os.environ['HOME'], flush=True)\nos._exit(3)\n"
    tests = fakes.write(tmp_path / "tests", {exits: fakes.HEADER + leaves})
    fix = Fix(
        "1", 1, "t", SidePin(release="a"), SidePin(release="b"), (), upstream_tests=(UpstreamTestFile(exits, ()),)
    )
    said: list[str] = []
    (r,) = for_sources([fix], {"fork": fork}, {"1": Reference()}, lab_python, tests, said.append)  # type: ignore[arg-type]
    side = r.sides["fork"]
    assert (side.status, side.tests, r.rows) == ("error", {}, [])
    assert side.error is not None and side.error.startswith("test process died (exit 3)\n") and "leaving" in side.error
    folder = re.fullmatch(r"leaving (\S*/difflab-upstream-\w+) (\S+)\n", side.log)
    assert folder is not None, f"run from an empty folder of its own, with a home in it: {side.log!r}"
    assert folder[2] == f"{folder[1]}/home"
    assert (lab_python.cache / "childlib-pytest").is_dir(), "the lab's pytest staged in the environment's cache"
    assert float(said[0].split(" in ")[1].removesuffix(" s")) < 300
    assert len(said) == 1 and re.fullmatch(r"upstream tests on fork: 0 test\(s\) in \d+\.\d s", said[0]), said
    assert run_jobs([], fakes.LabPython(tmp_path / "unused")) == []  # type: ignore[arg-type]
    assert not (tmp_path / "unused").exists(), "nothing staged when nothing runs"


def test_a_run_replays_its_base_and_head_each_in_its_own_test_process(
    lab: dict[str, Path], lab_python: fakes.LabPython
) -> None:
    fix = Fix("1", 1, "t", SidePin(release="a"), SidePin(release="b"), (), upstream_tests=(UpstreamTestFile(P, ()),))
    known = sources(lab)
    said: list[str] = []
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("CUDA_VISIBLE_DEVICES", raising=False)
        (r,) = for_run(
            [fix],
            {("1", "base"): known["base"], ("1", "head"): known["head"]},
            lab_python,  # type: ignore[arg-type]
            lab["tests"],
            said.append,
        )
    assert [(row.id, row.outcome("base"), row.outcome("head"), row.change) for row in r.rows] == [
        (PREDICATE, "failed", "passed", "fixed")
    ]
    assert r.sides["base"].tests[PREDICATE].why == LACKS and r.files[0].origin == f"--upstream-tests {lab['tests']}"
    assert sorted(s.split(":")[0] for s in said) == ["upstream tests on base", "upstream tests on head"]


# -- which sides and test trees each workflow replays ---------------------------------------------------------


def _checkout(root: Path, label: str, fixed: bool) -> MaterialisedSource:
    """A git-style source: the sglang package and its own ``test/`` tree."""
    src = fakes.fake_source(root / "python", label, fixed)
    fakes.write(root, {D: fakes.UNITTEST_FILE})
    return MaterialisedSource(label, "git", src.root, src.identity, src.digest, tests_root=root)


def test_a_run_replays_base_and_head_from_their_own_trees_then_the_folder(tmp_path: Path) -> None:
    base, head = _checkout(tmp_path / "b", "abc123", False), _checkout(tmp_path / "h", "def456", True)
    fix, untested = fakes.fake_fix(OWN), Fix("2", 2, "t", SidePin(release="base"), SidePin(release="head"), ())
    sources = {("1", "base"): base, ("1", "head"): head, ("2", "base"): base}
    (p,) = run_plans([untested, fix], sources, tmp_path / "folder")
    assert p.fix is fix and p.sides == {"base": base, "head": head} and p.pair == ("base", "head")
    assert [(t.root, t.origin) for t in p.trees] == [
        (tmp_path / "h", "head def456's own test/ tree"),
        (tmp_path / "b", "base abc123's own test/ tree"),
        (tmp_path / "folder", f"--upstream-tests {tmp_path / 'folder'}"),
    ]
    assert p.reference.base is not None and p.reference.base.root == base.root
    assert p.reference.head is not None and p.reference.head.root == head.root
    (lone,) = run_plans([fix], {("1", "base"): base, ("1", "head"): "no such commit"}, None)
    assert lone.sides == {"base": base, "head": "no such commit"} and lone.reference.head is None
    assert [t.origin for t in lone.trees] == ["base abc123's own test/ tree"], "an unavailable side has no tree"
    assert for_run([untested], sources, fakes.LabPython(tmp_path / "c"), None) == []  # type: ignore[arg-type]


def test_releases_and_a_fork_replay_every_side_from_their_own_trees_then_the_folder(tmp_path: Path) -> None:
    wheel = fakes.fake_source(tmp_path / "w", "0.5.20", fixed=False)
    fork = _checkout(tmp_path / "f", "fork@main", True)
    ref = Reference(SymbolIndex(wheel.root), SymbolIndex(fork.root))
    fix, untested = fakes.fake_fix(OWN), Fix("2", 2, "t", SidePin(release="a"), SidePin(release="b"), ())
    (p,) = source_plans([untested, fix], {"0.5.20": wheel, "fork": fork}, {"1": ref}, tmp_path / "folder")
    assert p.fix is fix and p.sides == {"0.5.20": wheel, "fork": fork} and p.pair is None and p.reference is ref
    assert [t.origin for t in p.trees] == ["fork fork@main's own test/ tree", f"--upstream-tests {tmp_path / 'folder'}"]
    assert [t.root for t in source_plans([fix], {"0.5.20": wheel}, {"1": ref}, None)[0].trees] == []
    env = fakes.LabPython(tmp_path / "c")
    assert for_sources([untested], {"0.5.20": wheel}, {}, env, None) == []  # type: ignore[arg-type]


@dataclass
class Releases:
    """Releases already unpacked, by version (the lab's release source downloads and checks them first)."""

    trees: dict[str, MaterialisedSource]
    asked: list[str] = field(default_factory=list)

    def release(self, version: str) -> MaterialisedSource:
        self.asked.append(version)
        return self.trees[version]


def test_the_fix_s_own_base_and_head_releases_tell_what_the_fix_adds(tmp_path: Path) -> None:
    old, new = fakes.fake_source(tmp_path / "a", "0.5.20", False), fakes.fake_source(tmp_path / "b", "0.5.21", True)
    releases = Releases({"0.5.20": old, "0.5.21": new})
    fix = Fix("1", 1, "t", SidePin(release="0.5.20"), SidePin(release="0.5.21"), ())
    ref = release_reference(fix, releases)  # type: ignore[arg-type]
    assert ref.base is not None and ref.head is not None and (ref.base.root, ref.head.root) == (old.root, new.root)
    assert ref.added_by_fix({"module": "sglang.srt.doors", "name": "is_unadmitted"})
    pinned = Fix("1", 1, "t", SidePin(commit="abc"), SidePin(release="0.5.21", unavailable="yanked"), ())
    assert release_reference(pinned, releases) == Reference(None, None)  # type: ignore[arg-type]
    assert releases.asked == ["0.5.20", "0.5.21"], "a commit or an unavailable release is not fetched"
