"""Bad input to the git source and its commands: a clear error naming what is wrong (exit 2), no fallback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from difflab.cli import main as cli
from difflab.errors import SourceError
from difflab.source.git import GitSource
from difflab.source.lock import lock_path_for
from test_git_support import git, matrix_copy, tiny_repo


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "cache"
    monkeypatch.setenv("DIFFLAB_CACHE", str(path))
    return path


@pytest.fixture
def repo(tmp_path: Path) -> tuple[Path, list[str]]:
    path = tmp_path / "repo"
    return path, tiny_repo(path, [11, 12])


@pytest.mark.parametrize("where", ["missing-path", "file:///nonexistent/sglang.git", "http://127.0.0.1:9/sglang.git"])
def test_unreachable_repository(where: str, tmp_path: Path, cache: Path) -> None:
    repo = str(tmp_path / "nowhere") if where == "missing-path" else where
    with pytest.raises(SourceError, match="unreachable") as info:
        GitSource(repo, cache=cache).rev("a" * 40)
    assert repo in str(info.value)


@pytest.mark.parametrize("rev", ["f" * 40, "abcdef1", "no-such-branch"])
def test_missing_commit_is_named(rev: str, repo: tuple[Path, list[str]], cache: Path) -> None:
    with pytest.raises(SourceError, match=f"commit {rev} not found"):
        GitSource(str(repo[0]), cache=cache).rev(rev)


def test_unusable_ref_and_commit_without_sglang(repo: tuple[Path, list[str]], cache: Path, tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="not a usable git ref"):
        GitSource(str(repo[0]), cache=cache).rev("--upload-pack=evil")
    bare = tmp_path / "no-python"
    bare.mkdir()
    git(bare, "init", "--quiet", "--initial-branch=main")
    (bare / "README.md").write_text("no package here\n")
    git(bare, "add", "-A")
    git(bare, "commit", "--quiet", "-m", "Docs only (#1)")
    with pytest.raises(SourceError, match="has no python/sglang package"):
        GitSource(str(bare), cache=cache).rev("main")


def test_backport_bad_input_exits_2(
    repo: tuple[Path, list[str]], cache: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    matrix = matrix_copy(tmp_path / "m")
    base = ["backport", "--matrix", str(matrix), "--out", str(tmp_path / "out"), "--no-bundle"]
    assert cli([*base, "--repo", str(repo[0]), "--ref", "main", "--fix", "99999"]) == 2
    assert "unknown fix '99999'" in capsys.readouterr().err
    assert cli([*base, "--repo", str(tmp_path / "nowhere"), "--ref", "main", "--fix", "38935"]) == 2
    assert "unreachable" in capsys.readouterr().err
    assert cli([*base, "--repo", str(repo[0]), "--ref", "0" * 40, "--fix", "38935"]) == 2
    assert f"commit {'0' * 40!r} not found" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out")], "no partial folder left behind"


def test_bisect_and_run_bad_input_exit_2(
    repo: tuple[Path, list[str]], cache: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    matrix = matrix_copy(tmp_path / "m")
    assert (
        cli(
            [
                "bisect",
                "--matrix",
                str(matrix),
                "--repo",
                str(repo[0]),
                "--good",
                "main~1",
                "--bad",
                "main",
                "--fix",
                "99999",
            ]
        )
        == 2
    )
    assert "unknown fix '99999'" in capsys.readouterr().err
    assert (
        cli(
            [
                "bisect",
                "--matrix",
                str(matrix),
                "--repo",
                str(repo[0]),
                "--good",
                "main",
                "--bad",
                "main",
                "--fix",
                "38935",
                "--probe",
                "no_such_probe",
            ]
        )
        == 2
    )
    assert "no probe(s) ['no_such_probe']" in capsys.readouterr().err
    run = [
        "run",
        "--source",
        "git",
        "--repo",
        str(repo[0]),
        "--matrix",
        str(matrix),
        "--no-bundle",
        "--out",
        str(tmp_path / "run"),
    ]
    # no commit known for #41404: not in the matrix, and no lock
    assert cli([*run, "--fix", "41404"]) == 2
    assert "fix '41404': no base commit known for --source git" in capsys.readouterr().err
    # an unresolved PR in the lock says so, and is never replaced by a guess
    lock_path_for(matrix).write_text(
        json.dumps(
            {
                "schema": 1,
                "repo": str(repo[0]),
                "branch": "main",
                "branch_tip": repo[1][-1],
                "matrix": matrix.name,
                "matrix_sha256": "0" * 64,
                "resolved_at": "2026-11-01T00:00:00Z",
                "entries": {
                    "41404": {
                        "fix": "41404",
                        "pr": 41404,
                        "status": "unresolved",
                        "base": None,
                        "head": None,
                        "subject": None,
                        "checks": [],
                        "reason": "no first-parent commit on main has a subject ending with (#41404)",
                    }
                },
            }
        )
    )
    assert cli([*run, "--fix", "41404"]) == 2
    assert "ending with (#41404)" in capsys.readouterr().err
