"""``difflab run --source git`` end to end: locked commits, real probes, and upstream test replay."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from junitparser import JUnitXml

from difflab.cli import main as cli
from test_bundle_support import make_key
from test_git_support import matrix_copy, release_repos
from upstream_fixtures import EXPECTED, FILES

pytestmark = [pytest.mark.sglang, pytest.mark.xdist_group("git")]


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
    assert replay["fix"] == "38935" and [f["file"] for f in replay["files"]] == list(FILES)
    head = repos.commits["0.5.21"][:12]
    assert {f["from"] for f in replay["files"]} == {f"head {head}'s own test/ tree"}, "the head's files, both sides"
    seen = {
        t["id"]: (t["outcomes"]["base"]["outcome"], t["outcomes"]["head"]["outcome"], t["change"])
        for t in replay["tests"]
    }
    assert seen == EXPECTED
    assert replay["agreement"]["agrees"] is True and replay["agreement"]["text"].startswith("probe: confirmed; ")
    assert fix["upstream_tests"] == replay["agreement"], "diff.json carries the agreement beside the verdict"
    for side, failures in (("base", 4), ("head", 0)):
        suite = next(iter(JUnitXml.fromfile(str(out / "upstream-tests" / "38935" / f"{side}.xml"))))
        assert (suite.tests, suite.failures, suite.errors) == (len(EXPECTED), failures, 0)


def test_git_source_gives_the_same_verdicts_as_the_release_source(tmp_path: Path) -> None:
    """Same code, two ways of getting it: every verdict must agree (#41404 has no merge commit here)."""
    repos = release_repos()
    matrix = matrix_copy(tmp_path / "m")
    cli(["lock", "--matrix", str(matrix), "--repo", str(repos.upstream)])
    picks = ["--fix", "36988", "--fix", "38935", "--fix", "43719a", "--fix", "43719b"]
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


def test_selfcheck_mutates_the_locked_git_head_and_its_sealed_folder_verifies(tmp_path: Path) -> None:
    """``selfcheck --source git``: the head is the locked commit's worktree, mutated; the folder is sealed."""
    repos = release_repos()
    matrix = matrix_copy(tmp_path / "m")
    cli(["lock", "--matrix", str(matrix), "--repo", str(repos.upstream)])
    private, public = make_key(tmp_path / "keys")
    out = tmp_path / "selfcheck"
    argv = ["selfcheck", "--source", "git", "--repo", str(repos.upstream), "--matrix", str(matrix)]
    rc = cli([*argv, "--fix", "38935", "--out", str(out), "--timeout", "120", "--key", str(private)])
    doc = json.loads((out / "selfcheck.json").read_text())
    assert rc == 0, [(m["mutation"], m["outcome"], m["reason"]) for m in doc["mutations"]]
    head = repos.commits["0.5.21"]
    assert doc["passed"] and doc["mutations"] and {m["head"] for m in doc["mutations"]} == {head[:12]}
    observed = [o["source"] for m in doc["mutations"] for o in m["observations"]]
    assert observed and {(s["kind"], s["commit"]) for s in observed} == {("git", head)}
    assert {s["mutation"] for s in observed} == {m["mutation"] for m in doc["mutations"]}
    run = json.loads((out / "run.json").read_text())
    assert (run["command"], run["source_kind"], run["exit_code"]) == ("selfcheck", "git", 0)
    assert cli(["verify", str(out), "--key", str(public)]) == 0
    (out / "selfcheck.json").write_text(json.dumps({**doc, "passed": False}))
    assert cli(["verify", str(out), "--key", str(public)]) != 0, "the seal covers the self-check's result"
