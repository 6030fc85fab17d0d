"""SGLang's own tests replayed through a real test child process on a stand-in ``sglang`` (a few seconds).

The whole replay path runs here on ``upstream_fakes``: a base without the fix, a head with it,
and test files in SGLang's style -- ``CustomTestCase`` with its retry wrapper,
``CUDA_VISIBLE_DEVICES`` read at import, ``subTest``, a pytest file with a fixture and
parametrised tests, a module-level import of a name only the head has. Left out of the
mutation pass's tests (each mutant would pay for the child processes): the same reading and
reporting from the child's own records is in ``test_upstream_records.py``, the same path on
the real releases in ``test_upstream_replay.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from junitparser import JUnitXml

import upstream_fakes as fakes
from difflab.report.upstream_tests import section, write_files
from difflab.upstream_tests.agreement import pair_agreement
from difflab.upstream_tests.files import Tree
from difflab.upstream_tests.outcomes import Reference
from difflab.upstream_tests.replay import Plan, replay
from difflab.upstream_tests.symbols import SymbolIndex


@pytest.fixture(scope="module")
def replayed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list]:
    root = tmp_path_factory.mktemp("fake-replay")
    base = fakes.fake_source(root / "base", "base", fixed=False)
    head = fakes.fake_source(root / "head", "head", fixed=True)
    tests = fakes.write(root / "tests", fakes.TEST_FILES)
    own = {fakes.D: ["TestDoors::test_rejected_is_retired"], fakes.Y: ["test_rejected_is_not_enqueued"]}
    plan = Plan(
        fakes.fake_fix(own),
        {"base": base, "head": head},
        [Tree(tests, "the tests folder")],
        Reference(SymbolIndex(base.root), SymbolIndex(head.root)),
        pair=("base", "head"),
    )
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CUDA_VISIBLE_DEVICES", "")  # the child must not pass an empty value on
        found = replay([plan], fakes.LabPython(root / "cache"))  # type: ignore[arg-type]
    return root, found


def test_replay_reads_every_test_of_every_style_on_both_sides(replayed: tuple[Path, list]) -> None:
    _, (r,) = replayed
    assert {row.id: (row.outcome("base"), row.outcome("head"), row.change) for row in r.rows} == fakes.EXPECTED
    runner = r.sides["base"].runner
    assert runner["retry_unwrapped"] == ["sglang.test.test_utils.CustomTestCase"]
    assert runner["pytest"], "the pytest-style file ran under pytest"


def test_a_custom_test_case_failure_is_its_assertion_and_each_failing_subtest_is_kept(
    replayed: tuple[Path, list],
) -> None:
    _, (r,) = replayed
    doors = r.sides["base"].tests[f"{fakes.D}::TestDoors::test_rejected_is_retired"]
    assert doors.outcome == "failed" and doors.error_type == "AssertionError", "not retry()'s bare Exception"
    assert [(s.name, s.outcome) for s in doors.subtests] == [
        ("(door='prefill')", "failed"),
        ("(door='decode')", "failed"),
    ]
    assert r.sides["head"].tests[f"{fakes.D}::TestDoors::test_rejected_is_retired"].subtests[0].outcome == "passed"


def test_a_name_only_the_head_has_fails_the_base_and_a_name_nobody_has_is_stale(replayed: tuple[Path, list]) -> None:
    _, (r,) = replayed
    lacking = r.sides["base"].tests[f"{fakes.P}::TestPredicate::test_rejected_holding_nothing"]
    assert lacking.outcome == "failed" and lacking.phase == "import"
    assert "lacks sglang.srt.doors.is_unadmitted, which the fix adds" in (lacking.why or "")
    later = r.sides["head"].tests[f"{fakes.L}::TestLater::test_uses_a_later_refactor"]
    assert later.outcome == "stale" and "a_later_refactor" in (later.why or "")
    fake = r.sides["base"].tests[f"{fakes.D}::TestDoors::test_needs_no_sender"]
    assert fake.outcome == "stale" and "SimpleNamespace" in (fake.why or "")


def test_agreement_is_said_and_the_files_are_written(replayed: tuple[Path, list]) -> None:
    root, (r,) = replayed
    r.agreement = pair_agreement("confirmed", r.rows)
    assert r.agreement.agrees is True and r.agreement.text.startswith("probe: confirmed; SGLang's tests: 3 fixed")
    assert "(the fix's own: 2 fixed)" in r.agreement.text
    out = root / "run"
    write_files(out, [r], root / "tests")
    doc = json.loads((out / "upstream-tests.json").read_text())
    (fix,) = doc["fixes"]
    assert [f["from"] for f in fix["files"]] == ["the tests folder"] * 4 and len(fix["files"][0]["sha256"]) == 64
    row = next(t for t in fix["tests"] if t["id"] == f"{fakes.D}::TestDoors::test_rejected_is_retired")
    assert row["own"] is True and row["change"] == "fixed" and row["outcomes"]["base"]["outcome"] == "failed"
    base = next(iter(JUnitXml.fromfile(str(out / "upstream-tests" / "1" / "base.xml"))))
    assert (base.tests, base.failures, base.errors, base.skipped) == (9, 3, 1, 2), "stale is a skip, not red"
    summary = next(iter(JUnitXml.fromfile(str(out / "upstream-tests.xml"))))
    assert (summary.tests, summary.failures, summary.errors) == (9, 0, 1)
    md = "\n".join(section([r]))
    assert "probe: confirmed; SGLang's tests: 3 fixed" in md and "| `TestDoors::test_rejected_is_retired` | ✓ |" in md
    assert (out / "upstream-tests" / "1" / "base.log").is_file()
