"""``difflab run --source git`` end to end: locked commits, real probes, and upstream test replay."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from junitparser import JUnitXml

from difflab.cli import main as cli
from test_git_support import UPSTREAM_TEST, matrix_copy, release_repos

pytestmark = [pytest.mark.sglang, pytest.mark.xdist_group("git")]

TEST_CLASS = f"{UPSTREAM_TEST}::TestAdmissionAbortNotEnqueued"


def test_run_on_git_commits_confirms_the_fix_and_replays_its_upstream_tests(tmp_path: Path) -> None:
    repos = release_repos()
    matrix = matrix_copy(tmp_path / "m")
    assert cli(["lock", "--matrix", str(matrix), "--repo", str(repos.upstream)]) == 1  # 41404 unresolved
    out = tmp_path / "run"
    rc = cli(
        [
            "run",
            "--source",
            "git",
            "--repo",
            str(repos.upstream),
            "--matrix",
            str(matrix),
            "--fix",
            "38935",
            "--out",
            str(out),
            "--no-bundle",
        ]
    )
    assert rc == 0
    diff = json.loads((out / "diff.json").read_text())
    fix = diff["fixes"][0]
    assert fix["verdict"] == "confirmed"
    assert fix["base"]["commit"] == repos.commits["0.5.20"] and fix["head"]["commit"] == repos.commits["0.5.21"]
    assert fix["head"]["kind"] == "git" and len(fix["head"]["tree"]) == 40

    replay = json.loads((out / "upstream-tests.json").read_text())["fixes"][0]
    assert replay["fix"] == "38935" and replay["files"] == [UPSTREAM_TEST]
    assert replay["tests_from"]["commit"] == repos.commits["0.5.21"], "the head's test files, run on both sides"
    assert replay["summary"] == {
        "pass": [f"{TEST_CLASS}::test_valid_request_is_enqueued"],
        "fixed": [f"{TEST_CLASS}::test_rejected_request_is_not_enqueued"],
        "error": [f"{TEST_CLASS}::test_rejected_request_retired_before_any_sender"],
    }
    base = replay["sides"]["base"]
    assert base["failed"] == [f"{TEST_CLASS}::test_rejected_request_is_not_enqueued"]
    assert [(e["error_type"], e["stale_fake"]) for e in base["errors"]] == [("AttributeError", True)]
    assert len(replay["sides"]["head"]["passed"]) == 3
    for side, failures, errors in (("base", 1, 1), ("head", 0, 0)):
        suite = next(iter(JUnitXml.fromfile(str(out / "upstream-tests" / "38935" / f"{side}.xml"))))
        assert (suite.tests, suite.failures, suite.errors) == (3, failures, errors)


def test_git_source_gives_the_same_verdicts_as_the_release_source(tmp_path: Path) -> None:
    """Same code, two ways of getting it: every verdict must agree (#41404 has no merge commit here)."""
    repos = release_repos()
    matrix = matrix_copy(tmp_path / "m")
    cli(["lock", "--matrix", str(matrix), "--repo", str(repos.upstream)])
    picks = ["--fix", "36988", "--fix", "38935", "--fix", "43719"]
    verdicts = {}
    for kind in ("release", "git"):
        out = tmp_path / kind
        extra = ["--repo", str(repos.upstream)] if kind == "git" else []
        rc = cli(["run", "--source", kind, *extra, "--matrix", str(matrix), *picks, "--out", str(out), "--no-bundle"])
        assert rc == 0, kind
        diff = json.loads((out / "diff.json").read_text())
        verdicts[kind] = {f["id"]: f["verdict"] for f in diff["fixes"]}
        if kind == "git":
            assert {f["base"]["kind"] for f in diff["fixes"]} == {"git"}
    assert (
        verdicts["git"]
        == verdicts["release"]
        == {
            "36988": "confirmed",
            "38935": "confirmed",
            "43719a": "confirmed",
            "43719b": "unavailable",
        }
    )
