"""``difflab lock``: PR numbers resolved to merge commits on main, never guessed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from difflab.cli import main as cli
from difflab.matrix import load_matrix
from difflab.source.lock import lock_path_for, read_lock, resolve_lock
from difflab.source.mirror import REPO_ENV, Mirror
from matrix_samples import RELEASES
from test_git_support import ReleaseRepos, matrix_copy, release_repos, tiny_repo


@pytest.fixture(scope="module")
def repos() -> ReleaseRepos:
    return release_repos()


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "cache"
    monkeypatch.setenv("DIFFLAB_CACHE", str(path))
    return path


def _fixes(*prs: int) -> str:
    return "".join(
        f'\n[[fixes]]\nid = "{pr}"\npr = {pr}\ntitle = "t"\nbase = {{ release = "0.5.20" }}\n'
        f'head = {{ release = "0.5.21" }}\n'
        for pr in prs
    )


def test_lock_resolves_each_pr_to_its_merge_commit_and_first_parent(
    repos: ReleaseRepos, tmp_path: Path, cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    c = repos.commits
    path = matrix_copy(tmp_path / "m", commits_38935=(c["0.5.20"][:8], c["0.5.21"]))
    rc = cli(["lock", "--matrix", str(path), "--repo", str(repos.upstream)])
    out = capsys.readouterr().out
    assert rc == 1, "41404 has no commit: the lock is incomplete and says so"
    lock = read_lock(lock_path_for(path))
    assert lock is not None and lock_path_for(path) == path.with_name("upstream.lock.json")
    assert lock.repo == str(repos.upstream) and lock.branch_tip == c["0.5.22"]
    e = lock.entries
    assert (e["36988"].status, e["36988"].base, e["36988"].head) == ("resolved", c["0.5.19"], c["0.5.20"])
    assert (e["38935"].status, e["38935"].base, e["38935"].head) == ("resolved", c["0.5.20"], c["0.5.21"])
    assert [(k.side, k.ok) for k in e["38935"].checks] == [("base", True), ("head", True)]
    assert e["38935"].subject.endswith("(#38935)")
    for part in ("43719a", "43719b"):
        assert (e[part].status, e[part].base, e[part].head) == ("resolved", c["0.5.21"], c["0.5.22"])
    assert e["41404"].status == "unresolved" and e["41404"].base is None and e["41404"].head is None
    assert "(#41404)" in e["41404"].reason
    assert "41404    unresolved" in out and "MISMATCH" not in out
    raw = json.loads(lock_path_for(path).read_text())
    assert raw["schema"] == 1 and raw["matrix_sha256"] == load_matrix(path).sha256


def test_lock_reports_a_short_sha_that_disagrees(
    repos: ReleaseRepos, tmp_path: Path, cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = matrix_copy(tmp_path, commits_38935=("deadbeef", repos.commits["0.5.21"][:12]))
    assert cli(["lock", "--matrix", str(path), "--repo", str(repos.upstream)]) == 1
    entry = read_lock(lock_path_for(path)).entries["38935"]  # type: ignore[union-attr]
    assert entry.status == "mismatch"
    assert [(k.side, k.ok) for k in entry.checks] == [("base", False), ("head", True)]
    assert "deadbeef" in entry.reason and repos.commits["0.5.20"] in entry.reason
    assert "matrix base deadbeef: MISMATCH" in capsys.readouterr().out


def test_ambiguous_and_root_commits_stay_unresolved(tmp_path: Path, cache: Path) -> None:
    shas = tiny_repo(tmp_path / "repo", [300, 100, 200, 100])
    path = tmp_path / "m.toml"
    path.write_text(RELEASES + _fixes(100, 200, 300, 400))
    lock = resolve_lock(load_matrix(path), Mirror(str(tmp_path / "repo"), cache))
    e = lock.entries
    assert e["100"].status == "unresolved" and "ambiguous: 2 commits" in e["100"].reason
    assert (e["200"].status, e["200"].base, e["200"].head) == ("resolved", shas[1], shas[2])
    assert e["300"].status == "unresolved" and "root commit" in e["300"].reason
    assert e["400"].status == "unresolved"


def test_lock_uses_the_repo_env_var_and_fails_clearly_when_unreachable(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    tiny_repo(tmp_path / "repo", [90, 100])
    path = tmp_path / "m.toml"
    path.write_text(RELEASES + _fixes(100))
    monkeypatch.setenv(REPO_ENV, str(tmp_path / "repo"))
    assert cli(["lock", "--matrix", str(path)]) == 0
    assert read_lock(lock_path_for(path)).repo == str(tmp_path / "repo")  # type: ignore[union-attr]
    for repo in (str(tmp_path / "nowhere"), "file:///nonexistent/sglang.git"):
        assert cli(["lock", "--matrix", str(path), "--repo", repo]) == 2
        err = capsys.readouterr().err
        assert "unreachable" in err and repo.rsplit("/", 1)[-1] in err
    assert cli(["lock", "--matrix", str(path), "--repo", str(tmp_path / "repo"), "--branch", "release"]) == 2
    assert "branch 'release' not found" in capsys.readouterr().err
