"""The git source on repositories built from the real release trees: mirror, sparse worktree, identity."""

from __future__ import annotations

import filecmp
import json
from pathlib import Path

import pytest

from difflab.errors import ConfigError
from difflab.matrix import load_matrix
from difflab.source import backend_for, side_pin
from difflab.source.git import GitSource, commit_pin_for
from difflab.source.lock import lock_path_for
from difflab.source.mirror import REPO_ENV, UPSTREAM, Mirror, normalise_repo
from test_git_support import ReleaseRepos, git, matrix_copy, release_repos, release_trees
from upstream_fixtures import DOORS


@pytest.fixture(scope="module")
def repos() -> ReleaseRepos:
    return release_repos()


def _same_tree(a: Path, b: Path) -> list[str]:
    """Paths that differ between two folders (recursively), ignoring bytecode caches."""
    cmp = filecmp.dircmp(a, b, ignore=["__pycache__"])
    out = [str(a / n) for n in cmp.left_only + cmp.right_only + cmp.diff_files + cmp.funny_files]
    for sub in cmp.common_dirs:
        out += _same_tree(a / sub, b / sub)
    return out


def test_worktree_holds_the_release_tree_and_records_commit_and_tree(repos: ReleaseRepos, tmp_path: Path) -> None:
    commit = repos.commits["0.5.21"]
    src = GitSource(str(repos.upstream), cache=tmp_path).rev(commit)
    tree = git(repos.upstream, "rev-parse", f"{commit}^{{tree}}")
    assert src.kind == "git" and src.label == commit[:12]
    assert src.identity == {"kind": "git", "repo": str(repos.upstream), "commit": commit, "tree": tree}
    assert src.digest == f"git-tree:{tree}"
    worktree = Path(src.extra["worktree"])
    assert src.root == worktree / "python"
    assert src.tests_root is None
    assert not (worktree / "test").exists(), "test/ is outside the sparse checkout unless asked for"
    assert _same_tree(src.root / "sglang", release_trees()["0.5.21"]) == []
    assert git(worktree, "rev-parse", "HEAD") == commit
    assert git(worktree, "status", "--porcelain") == ""
    # a blobless mirror: blobs of a commit nobody checked out were never fetched
    mirror = Mirror(str(repos.upstream), tmp_path).path
    missing = git(mirror, "rev-list", "--objects", "--missing=print", repos.commits["0.5.19"])
    assert any(line.startswith("?") for line in missing.splitlines())
    assert git(mirror, "config", "remote.origin.partialclonefilter") == "blob:none"


def test_with_tests_checks_out_test_tree_and_cached_worktree_is_reused(repos: ReleaseRepos, tmp_path: Path) -> None:
    source = GitSource(str(repos.upstream), cache=tmp_path, with_tests=True)
    first = source.rev(repos.commits["0.5.21"][:10])  # a short SHA resolves to the same commit
    assert first.identity["commit"] == repos.commits["0.5.21"]
    assert first.tests_root is not None and (first.tests_root / DOORS).is_file()
    again = source.rev(repos.commits["0.5.21"])
    assert (again.root, again.identity, again.digest) == (first.root, first.identity, first.digest)
    older = source.rev(repos.commits["0.5.20"])
    assert older.tests_root is None, "0.5.20 has no test/ tree"
    assert older.identity["tree"] != first.identity["tree"]


def test_branch_and_tag_refs(repos: ReleaseRepos, tmp_path: Path) -> None:
    source = GitSource(str(repos.fork), cache=tmp_path)
    for name in ("revert", "version"):
        sha = source.mirror.commit(repos.fork_refs[name])
        assert sha == repos.fork_commits[name]


def test_backend_for_git_and_default_repo(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, repos: ReleaseRepos) -> None:
    monkeypatch.delenv(REPO_ENV, raising=False)
    assert normalise_repo(None) == UPSTREAM
    monkeypatch.setenv(REPO_ENV, str(repos.upstream))
    backend = backend_for("git", cache=tmp_path)
    assert isinstance(backend, GitSource) and backend.kind == "git" and backend.repo == str(repos.upstream)


def test_commit_pin_prefers_lock_then_matrix_and_names_the_fix(tmp_path: Path, repos: ReleaseRepos) -> None:
    path = matrix_copy(tmp_path, commits_38935=(repos.commits["0.5.20"][:8], repos.commits["0.5.21"][:8]))
    matrix = load_matrix(path)
    fix = matrix.fix("38935")
    # no lock yet: the matrix's commits table
    assert commit_pin_for(fix, "head", path).commit == repos.commits["0.5.21"][:8]
    assert side_pin(fix, "head", "git", path).commit == repos.commits["0.5.21"][:8]
    assert side_pin(fix, "head", "release", path).release == "0.5.21"
    with pytest.raises(ConfigError, match=r"fix '41404': no base commit known"):
        commit_pin_for(matrix.fix("41404"), "base", path)
    # a resolved lock entry gives the full SHA
    lock = {
        "schema": 1,
        "repo": str(repos.upstream),
        "branch": "main",
        "branch_tip": repos.commits["0.5.22"],
        "matrix": path.name,
        "matrix_sha256": matrix.sha256,
        "resolved_at": "2026-11-01T00:00:00Z",
        "entries": {
            "38935": {
                "fix": "38935",
                "pr": 38935,
                "status": "resolved",
                "base": repos.commits["0.5.20"],
                "head": repos.commits["0.5.21"],
                "subject": "s",
                "reason": None,
                "checks": [],
            },
            "41404": {
                "fix": "41404",
                "pr": 41404,
                "status": "unresolved",
                "base": None,
                "head": None,
                "subject": None,
                "reason": "no first-parent commit on main ends with (#41404)",
                "checks": [],
            },
            "36988": {
                "fix": "36988",
                "pr": 36988,
                "status": "mismatch",
                "base": "a" * 40,
                "head": "b" * 40,
                "subject": "s",
                "reason": "matrix head 2ee5742a but ...",
                "checks": [],
            },
        },
    }
    lock_path_for(path).write_text(json.dumps(lock))
    assert commit_pin_for(fix, "base", path).commit == repos.commits["0.5.20"]
    with pytest.raises(ConfigError, match=r"fix '41404'.*no first-parent commit on main ends with \(#41404\)"):
        commit_pin_for(matrix.fix("41404"), "head", path)
    with pytest.raises(ConfigError, match=r"fix '36988'.*mismatch"):
        commit_pin_for(matrix.fix("36988"), "head", path)
    lock_path_for(path).write_text("{not json")
    with pytest.raises(ConfigError, match="cannot read lock file"):
        commit_pin_for(fix, "head", path)
