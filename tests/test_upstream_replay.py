"""SGLang-style tests replayed on the real release wheels: ``run`` and ``contains`` with ``--upstream-tests DIR``.

The test files are the lab's own fixtures (``upstream_fixtures``: marked as such, not SGLang's),
in SGLang's conventions: the real ``CustomTestCase`` of each release's ``sglang.test.test_utils``
(retry wrapper, ``CUDA_VISIBLE_DEVICES`` read at import), ``subTest`` over both doors, a
module-level import of ``is_unadmitted_reject`` (only 0.5.21 has it), and a pytest-style file.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from junitparser import JUnitXml

from difflab.cli import main as cli
from upstream_fixtures import DOORS, EXPECTED, FILES, fixture_matrix, write_tests

pytestmark = [pytest.mark.sglang, pytest.mark.xdist_group("upstream-replay")]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("upstream")
    return write_tests(root / "sglang-tests"), fixture_matrix(root / "matrix")


def test_run_on_release_wheels_replays_the_tests_beside_the_verdict(
    folder: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tests, matrix = folder
    monkeypatch.setenv("DIFFLAB_CONFIG", str(tmp_path / "config"))  # a throwaway signing key for the bundle
    out = tmp_path / "run"
    rc = cli(["run", "--matrix", str(matrix), "--fix", "38935", "--upstream-tests", str(tests), "--out", str(out)])
    assert rc == 0
    fix = json.loads((out / "diff.json").read_text())["fixes"][0]
    assert fix["verdict"] == "confirmed", "the verdict is the probes', whatever the tests say"
    (replay,) = json.loads((out / "upstream-tests.json").read_text())["fixes"]
    seen = {
        t["id"]: (t["outcomes"]["base"]["outcome"], t["outcomes"]["head"]["outcome"], t["change"])
        for t in replay["tests"]
    }
    assert seen == EXPECTED
    assert {f["file"]: f["from"] for f in replay["files"]} == {rel: f"--upstream-tests {tests}" for rel in FILES}
    for side in ("base", "head"):
        runner = replay["sides"][side]["runner"]
        assert runner["retry_unwrapped"] == ["sglang.test.test_utils.CustomTestCase"] and runner["pytest"]
    doors = next(t for t in replay["tests"] if t["id"].endswith("test_rejected_request_is_retired_at_each_door"))
    base = doors["outcomes"]["base"]
    assert base["error_type"] == "AssertionError", "CustomTestCase's bare Exception is unwrapped"
    assert [(s["name"], s["outcome"]) for s in base["subtests"]] == [
        ("(door='prefill')", "failed"),
        ("(door='decode')", "failed"),
    ]
    agreement = replay["agreement"]
    assert agreement["text"] == (
        "probe: confirmed; SGLang's tests: 4 fixed, 3 still-passing, 1 stale (the fix's own: 3 fixed) — they agree"
    )
    assert fix["upstream_tests"] == agreement and "disagree" not in fix["reason"]
    summary = (out / "summary.md").read_text()
    assert "## SGLang's own tests (supporting evidence)" in summary and agreement["text"] in summary
    cases = next(iter(JUnitXml.fromfile(str(out / "upstream-tests.xml"))))
    assert (cases.tests, cases.failures, cases.errors, cases.skipped) == (8, 0, 0, 1)
    run = json.loads((out / "run.json").read_text())
    assert set(run["upstream_tests"]["files"]) == set(FILES) and run["upstream_tests"]["dir"] == str(tests)
    sums = (out / "SHA256SUMS").read_text()
    assert "upstream-tests.json" in sums and "upstream-tests/38935/base.json" in sums, "sealed with the run"
    fingerprint = (out / "keys" / "signing-key.fingerprint").read_text().strip()
    assert cli(["verify", str(out), "--fingerprint", fingerprint]) == 0


def test_contains_replays_the_tests_on_each_release(folder: tuple[Path, Path], tmp_path: Path) -> None:
    tests, matrix = folder
    out = tmp_path / "contains"
    rc = cli(
        ["contains", "--matrix", str(matrix), "--fix", "38935", "--release", "0.5.20"]
        + ["--upstream-tests", str(tests), "--out", str(out)]
    )
    assert rc == 0
    (cell,) = json.loads((out / "contains.json").read_text())["cells"]
    assert cell["verdict"] == "absent" and cell["upstream"]["agrees"] is True, "the fix's own tests fail on 0.5.20"
    (replay,) = json.loads((out / "upstream-tests.json").read_text())["fixes"]
    seen = {t["id"]: t["outcomes"]["0.5.20"]["outcome"] for t in replay["tests"]}
    assert seen == {tid: expected[0] for tid, expected in EXPECTED.items()}
    predicate = next(t for t in replay["tests"] if "Predicate" in t["id"])["outcomes"]["0.5.20"]
    assert "which the fix adds" in predicate["why"], "judged against the fix's own base and head releases"
    assert "## SGLang's own tests" in (out / "contains.md").read_text()
    assert (out / "upstream-tests" / "38935" / "0.5.20.xml").is_file()
    assert DOORS in {f["file"] for f in replay["files"]}
