"""A commit of a mirror, checked out once as a detached, sparse worktree.

Only ``python/`` (and ``test/`` when asked) is checked out: that is all a
probe or an upstream test imports, and a blobless mirror then fetches only
those blobs. The worktree sits in
``$DIFFLAB_CACHE/git/worktrees/<mirror>/<sha>[+test]`` and counts as done
only once its marker file (holding the tree hash) exists beside it, so a
crash halfway through is redone, never used. Before a finished worktree is
used again, ``git status`` (which rehashes only files whose stat changed)
must find it exactly at its commit: a changed, added or deleted file is named
and the worktree is checked out afresh. Unlike a release tree it stays
writable (git itself writes there).

Locks: the worktree's own lock around the whole checkout (two runs wanting
the same commit wait for one checkout), and the mirror's lock only around
``git worktree add/remove`` (which write the mirror's admin files). The
checkout itself may fetch blobs into the shared object store; git writes
objects atomically, so that needs no mirror lock.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import git
from filelock import FileLock

from difflab.errors import SourceError
from difflab.source.mirror import Mirror, git_error


@dataclass(frozen=True)
class Worktree:
    """A finished checkout: ``path`` is the worktree root (holding ``python/``)."""

    path: Path
    commit: str
    tree: str
    sparse: tuple[str, ...]


def sparse_dirs(with_tests: bool) -> tuple[str, ...]:
    return ("python", "test") if with_tests else ("python",)


def worktree_path(mirror: Mirror, sha: str, with_tests: bool) -> Path:
    suffix = "+test" if with_tests else ""
    return mirror.cache / "git" / "worktrees" / mirror.key / f"{sha}{suffix}"


def _marker(path: Path) -> Path:
    return path.with_name(path.name + ".done")


def _stderr(message: str) -> None:
    print(f"difflab: {message}", file=sys.stderr, flush=True)


def changed_files(path: Path) -> list[str]:
    """Every file of the worktree that is not as its commit has it (modified, added, deleted), named."""
    wt = git.Git(str(path))
    try:
        out = wt.status("--porcelain=v1", "-z", "--untracked-files=all", "--no-renames", "--ignore-submodules")
    except git.GitCommandError as exc:
        return [f"(git status failed: {git_error(exc, 1)})"]
    kinds = {"?": "added", "D": "removed", "A": "added"}
    found = []
    for entry in filter(None, out.split("\0")):
        code, name = entry[:2], entry[3:]
        kind = next((kinds[c] for c in code if c in kinds), "content differs from the commit")
        found.append(f"{name} ({kind})")
    return sorted(found)


def checkout(mirror: Mirror, sha: str, with_tests: bool = False, say: Callable[[str], None] = _stderr) -> Worktree:
    """The sparse worktree of commit ``sha`` (already in the mirror), made on first use, checked on every use."""
    path = worktree_path(mirror, sha, with_tests)
    dirs = sparse_dirs(with_tests)
    tree = mirror.tree_of(sha)
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path) + ".lock"):
        marker = _marker(path)
        if marker.exists() and marker.read_text().strip() == tree and (path / ".git").exists():
            changed = changed_files(path)
            if not changed:
                return Worktree(path, sha, tree, dirs)
            shown = ", ".join(changed[:5]) + (f" and {len(changed) - 5} more" if len(changed) > 5 else "")
            say(f"git worktree {path} no longer matches commit {sha} ({shown}); checking it out again")
        marker.unlink(missing_ok=True)
        _discard(mirror, path)
        with mirror.locked() as repo:
            try:
                repo.worktree("add", "--detach", "--no-checkout", str(path), sha)
            except git.GitCommandError as exc:
                raise SourceError(
                    f"git repository {mirror.repo}: cannot add a worktree for {sha}: {git_error(exc)}"
                ) from None
        wt = git.Git(str(path))
        wt.update_environment(GIT_TERMINAL_PROMPT="0")
        try:
            wt.sparse_checkout("set", "--cone", *dirs)
            wt.checkout("--quiet", "--detach", sha)
            head = wt.rev_parse("HEAD").strip()
            actual = wt.rev_parse("HEAD^{tree}").strip()
        except git.GitCommandError as exc:
            raise SourceError(f"git repository {mirror.repo}: cannot check out {sha}: {git_error(exc)}") from None
        if head != sha or actual != tree:
            raise SourceError(f"worktree {path} is at {head} (tree {actual}), expected {sha} (tree {tree})")
        marker.write_text(tree + "\n")
    return Worktree(path, sha, tree, dirs)


def _discard(mirror: Mirror, path: Path) -> None:
    """Remove a half-made worktree left by a crash (and its admin entry in the mirror)."""
    if not path.exists():
        with mirror.locked() as repo:
            repo.worktree("prune")
        return
    with mirror.locked() as repo:
        try:
            repo.worktree("remove", "--force", "--force", str(path))
        except git.GitCommandError:
            shutil.rmtree(path, ignore_errors=True)
        repo.worktree("prune")


def remove(mirror: Mirror, path: Path) -> None:
    """Drop a worktree (bisect uses a throwaway one)."""
    _marker(path).unlink(missing_ok=True)
    _discard(mirror, path)


def scratch(mirror: Mirror, sha: str, name: str, with_tests: bool = False) -> Path:
    """A throwaway sparse worktree at ``sha`` that a caller may move around (``git bisect``)."""
    path = mirror.cache / "git" / "scratch" / mirror.key / name
    path.parent.mkdir(parents=True, exist_ok=True)
    _discard(mirror, path)
    with mirror.locked() as repo:
        try:
            repo.worktree("add", "--detach", "--no-checkout", str(path), sha)
        except git.GitCommandError as exc:
            raise SourceError(f"git repository {mirror.repo}: cannot add a worktree: {git_error(exc)}") from None
    wt = git.Git(str(path))
    wt.update_environment(GIT_TERMINAL_PROMPT="0")
    try:
        wt.sparse_checkout("set", "--cone", *sparse_dirs(with_tests))
        wt.checkout("--quiet", "--detach", sha)
    except git.GitCommandError as exc:
        remove(mirror, path)
        raise SourceError(f"git repository {mirror.repo}: cannot check out {sha}: {git_error(exc)}") from None
    return path
