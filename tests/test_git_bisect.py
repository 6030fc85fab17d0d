"""``difflab bisect`` finds #38935's merge commit between 0.5.20 (good: old behaviour) and main (bad)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from difflab.cli import main as cli
from difflab.paths import cache_root
from difflab.source.mirror import Mirror
from test_git_support import matrix_copy, release_repos

pytestmark = [pytest.mark.sglang, pytest.mark.xdist_group("git")]


def test_bisect_names_the_commit_that_brought_the_fix(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    repos = release_repos()
    matrix = matrix_copy(tmp_path)
    rc = cli(
        [
            "bisect",
            "--repo",
            str(repos.upstream),
            "--good",
            repos.commits["0.5.20"],
            "--bad",
            "main",
            "--fix",
            "38935",
            "--probe",
            "pr38935_prefill_door",
            "--matrix",
            str(matrix),
            "--json",
        ]
    )
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    result = json.loads(captured.out)
    assert result["first"] == repos.commits["0.5.21"]
    assert result["subject"].endswith("(#38935)")
    assert (result["good_like"], result["bad_like"]) == ("base", "head")
    assert result["steps"] and all(s["answer"] in ("good", "bad") for s in result["steps"])
    assert {s["commit"]: s["answer"] for s in result["steps"]}.get(repos.commits["0.5.21"]) == "bad"
    scratch = cache_root() / "git" / "scratch" / Mirror(str(repos.upstream)).key
    assert not scratch.exists() or not any(scratch.iterdir()), "the bisect worktree is removed afterwards"
