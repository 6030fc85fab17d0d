"""The CI workflow: valid YAML, matrix generated from nox, only existing sessions, JUnit merge."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
from junitparser import Failure, JUnitXml, TestCase, TestSuite

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW = ROOT / "ci" / "workflows" / "difflab.yml"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "ci" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    return module


gen = _load("gen_workflow")
merge_junit = _load("merge_junit")


@pytest.fixture(scope="module")
def sessions():
    return gen.nox_sessions()


FIX_IDS = ("36988", "38935", "41404", "43719a", "43719b")  # the default matrix's fixes, written out


def test_matrix_is_generated_from_every_nox_session(sessions):
    names = {s["name"] for s in sessions}
    assert {"lab", "side", "merge", "contains", "tests", "lint", "mutation"} <= names
    include = gen.matrix(sessions)["include"]
    cells = {c["session"] for c in include}
    # lab and merge do the cells' work in another shape; mutation is the nightly job
    assert cells == {"contains", "tests", "lint"} | {
        f"side(fix='{f}', side='{s}')" for f in FIX_IDS for s in ("base", "head")
    }
    assert set(gen.NOT_CELLS) == {"lab", "merge", "mutation"}
    side = [c for c in include if c["name"] == "side"]
    assert len(side) == 10  # one cell per fix x side
    assert {(c["fix"], c["side"]) for c in side} == {(f, s) for f in FIX_IDS for s in ("base", "head")}
    assert len({c["slug"] for c in include}) == len(include)  # artifact names never collide
    tests = next(c for c in include if c["name"] == "tests")
    assert tests["posargs"] == "--junitxml=results/junit/tests.xml"


def test_workflow_names_only_existing_sessions(sessions):
    assert gen.check(WORKFLOW, sessions) == []
    assert set(gen.referenced(WORKFLOW.read_text())) == {"${{ matrix.session }}", "merge"}


def test_check_catches_a_stale_workflow(sessions, tmp_path: Path):
    stale = tmp_path / "w.yml"
    stale.write_text("jobs:\n  x:\n    steps:\n      - run: nox -s integration\n")
    problems = gen.check(stale, sessions)
    assert any("nox -s integration: no such session" in p for p in problems)
    assert any("fromJSON(needs.plan.outputs.matrix)" in p for p in problems)


def test_workflow_structure():
    yaml = pytest.importorskip("yaml", reason="PyYAML is not installed (ask for it in the [dev] extra)")
    doc = yaml.safe_load(WORKFLOW.read_text())
    jobs = doc["jobs"]
    assert list(jobs) == ["plan", "cpu", "merge", "gpu", "report", "sign"]
    assert jobs["cpu"]["strategy"]["matrix"] == "${{ fromJSON(needs.plan.outputs.matrix) }}"
    assert jobs["plan"]["outputs"]["matrix"] == "${{ steps.generate.outputs.matrix }}"
    assert any(s.get("run") == "python ci/gen_workflow.py matrix --github-output" for s in jobs["plan"]["steps"])
    assert jobs["gpu"]["runs-on"] == ["self-hosted", "linux", "gpu", "${{ matrix.gpu }}"]
    assert jobs["gpu"]["strategy"]["matrix"]["gpu"] == ["h100", "h200"]
    assert "pull_request" in jobs["gpu"]["if"]  # self-hosted runners never run PR code
    assert doc["permissions"] == {"contents": "read"}
    assert jobs["sign"]["permissions"]["id-token"] == "write"
    assert any("sigstore sign" in s.get("run", "") for s in jobs["sign"]["steps"])
    report_runs = " ".join(s.get("run", "") for s in jobs["report"]["steps"])
    assert "ci/merge_junit.py" in report_runs and "$GITHUB_STEP_SUMMARY" in report_runs
    assert set(jobs["report"]["needs"]) == {"cpu", "merge", "gpu"}


def test_workflow_text_minimal_checks():
    """Without PyYAML: no tabs, every job named, the generated matrix wired in."""
    text = WORKFLOW.read_text()
    assert "\t" not in text
    for job in ("plan:", "cpu:", "merge:", "gpu:", "report:", "sign:"):
        assert f"\n  {job}\n" in text
    assert "matrix: ${{ fromJSON(needs.plan.outputs.matrix) }}" in text


def test_generator_cli(tmp_path: Path):
    out = tmp_path / "gh_output"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "ci" / "gen_workflow.py"), "matrix", "--github-output"],
        capture_output=True,
        text=True,
        env={"GITHUB_OUTPUT": str(out), "PATH": "/usr/bin:/bin"},
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert out.read_text().startswith('matrix={"include":[')


def _junit(path: Path, suite: str, failing: bool) -> None:
    s = TestSuite(suite)
    ok = TestCase("passes", "fix.a")
    bad = TestCase("fails", "fix.b")
    if failing:
        bad.result = [Failure("not-fixed: head still shows the bug", "not-fixed")]
    s.add_testcase(ok)
    s.add_testcase(bad)
    doc = JUnitXml()
    doc.add_testsuite(s)
    path.parent.mkdir(parents=True, exist_ok=True)
    doc.write(str(path))


def test_merge_junit_and_summary(tmp_path: Path, capsys):
    _junit(tmp_path / "a" / "cpu-tests" / "junit.xml", "tests", failing=False)
    _junit(tmp_path / "a" / "gpu-h100" / "junit.xml", "difflab-gpu", failing=True)
    summary = tmp_path / "summary.md"
    code = merge_junit.main(
        [
            "--out",
            str(tmp_path / "merged.xml"),
            "--summary",
            str(summary),
            str(tmp_path / "a" / "**" / "junit*.xml"),
        ]
    )
    assert code == 1  # a failing case fails the report job, after writing everything
    merged = JUnitXml.fromfile(str(tmp_path / "merged.xml"))
    assert sorted(s.name for s in merged) == ["difflab-gpu (gpu-h100)", "tests (cpu-tests)"]
    text = summary.read_text()
    assert "| ✅ tests (cpu-tests) | 2 | 0 | 0 | 0 |" in text
    assert "| ❌ difflab-gpu (gpu-h100) | 2 | 1 | 0 | 0 |" in text
    assert "`fix.b.fails`: not-fixed: head still shows the bug" in text
    assert merge_junit.main(["--out", str(tmp_path / "m2.xml"), str(tmp_path / "none" / "*.xml")]) == 2
