"""Concurrent runs share one mirror: the lock serialises writers and nothing gets corrupted."""

from __future__ import annotations

import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

from filelock import FileLock

from difflab.source.git import GitSource
from difflab.source.mirror import Mirror
from test_git_support import git, tiny_repo


def _materialise(repo: str, cache: str, rev: str) -> tuple[str, str, str]:
    src = GitSource(repo, cache=Path(cache), with_tests=True).rev(rev)
    return src.identity["commit"], src.identity["tree"], str(src.root)


def test_parallel_processes_share_one_mirror_safely(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    shas = tiny_repo(repo, [1, 2, 3, 4])
    cache = tmp_path / "cache"
    wanted = [shas[0], shas[1], shas[0], shas[2], shas[3], shas[1], shas[2], shas[3]]
    with ProcessPoolExecutor(max_workers=8, mp_context=get_context("spawn")) as pool:
        results = list(pool.map(_materialise, [str(repo)] * len(wanted), [str(cache)] * len(wanted), wanted))
    for rev, (commit, tree, root) in zip(wanted, results, strict=True):
        assert commit == rev
        assert tree == git(repo, "rev-parse", f"{rev}^{{tree}}")
        assert Path(root, "sglang", "__init__.py").is_file()
    assert len({r for _, _, r in results}) == 4, "one worktree per commit, however many asked at once"
    mirror = Mirror(str(repo), cache).path
    git(mirror, "fsck", "--no-progress")  # raises if the object store or refs are damaged
    listed = git(mirror, "worktree", "list", "--porcelain").count("worktree ")
    assert listed == 5  # the bare mirror itself + 4 worktrees


def test_a_held_mirror_lock_blocks_another_process(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    shas = tiny_repo(repo, [1])
    cache = tmp_path / "cache"
    mirror = Mirror(str(repo), cache)
    with mirror.locked():  # creates the mirror, then holds its lock
        proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import sys; from pathlib import Path; from difflab.source.git import GitSource; "
                "print(GitSource(sys.argv[1], cache=Path(sys.argv[2])).rev(sys.argv[3]).identity['commit'])",
                str(repo),
                str(cache),
                shas[0],
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        time.sleep(3)
        assert proc.poll() is None, "the second process must wait for the mirror lock"
        assert not mirror.has_commit(shas[0])
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert out.strip() == shas[0]
    assert FileLock(str(mirror.path) + ".lock").acquire(timeout=5)
