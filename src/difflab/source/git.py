"""Git back end: a commit of SGLang's repository (or a fork), checked out sparsely from a mirror.

``--source git`` pins each side to a commit: the full SHA from the lock file
next to the matrix (``difflab lock``), else the matrix's ``commits`` table.
The materialised root is ``<worktree>/python`` (the folder holding
``sglang/``); the identity records repository, commit and tree hash, so two
commits with identical trees share cached results (digest ``git-tree:``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from difflab.errors import ConfigError, SourceError
from difflab.matrix.model import Fix, Matrix, SidePin
from difflab.paths import cache_root
from difflab.source.base import MaterialisedSource
from difflab.source.lock import default_lock_path, read_lock
from difflab.source.mirror import Mirror, default_repo, normalise_repo
from difflab.source.worktree import checkout


@dataclass
class GitSource:
    """Materialises commits of ``repo`` (URL or path; default ``$DIFFLAB_SGLANG_REPO`` or upstream)."""

    repo: str | None = None
    cache: Path | None = None
    with_tests: bool = False
    kind: str = "git"
    say: Callable[[str], None] = lambda message: print(f"difflab: {message}", file=sys.stderr, flush=True)
    """Where a worktree found changed (and checked out again) is reported."""

    def __post_init__(self) -> None:
        self.repo = normalise_repo(self.repo or default_repo())
        self.cache = self.cache or cache_root()
        self.mirror = Mirror(self.repo, self.cache)

    @classmethod
    def for_matrix(cls, matrix: Matrix, repo: str | None = None) -> GitSource:
        """The back end ``difflab run --source git`` uses: sides with their ``test/`` trees (upstream tests)."""
        return cls(repo=repo, with_tests=True)

    @staticmethod
    def pin(fix: Fix, side: str, matrix_path: Path | None = None) -> SidePin:
        """The side's commit (lock file, else the matrix's ``commits``), or the matrix's unavailable pin."""
        pin: SidePin = getattr(fix, side)
        return pin if pin.unavailable else commit_pin_for(fix, side, matrix_path)

    def materialise(self, fix: Fix, side: str, pin: SidePin) -> MaterialisedSource:
        if not pin.commit:
            raise ConfigError(f"fix {fix.id!r}: {side} is not a commit pin ({pin.label}); use commit_pin_for()")
        return self.rev(pin.commit, what=f"{pin.commit} (fix {fix.id} {side})")

    def rev(self, rev: str, what: str | None = None) -> MaterialisedSource:
        """Any revision (SHA, short SHA, branch, tag) of the repository, checked out."""
        sha = self.mirror.commit(rev, what=what)
        wt = checkout(self.mirror, sha, with_tests=self.with_tests, say=self.say)
        root = wt.path / "python"
        if not (root / "sglang" / "__init__.py").is_file():
            raise SourceError(f"git repository {self.repo}: commit {sha} has no python/sglang package")
        tests = wt.path if self.with_tests and (wt.path / "test").is_dir() else None
        return MaterialisedSource(
            label=sha[:12],
            kind="git",
            root=root,
            identity={"kind": "git", "repo": self.repo, "commit": sha, "tree": wt.tree},
            digest=f"git-tree:{wt.tree}",
            tests_root=tests,
            extra={"worktree": str(wt.path), "subject": self.mirror.subject(sha), "ref": rev},
        )


def commit_pin_for(fix: Fix, side: str, matrix_path: Path | None = None) -> SidePin:
    """The commit for one side: the lock file's full SHA, else the matrix's ``commits`` table.

    ``matrix_path`` picks the lock next to that matrix; without it,
    ``$DIFFLAB_LOCK`` or the default matrix's lock. A lock entry counts only
    for the same PR; a ``mismatch`` entry is refused until someone decides
    which SHA is right.
    """
    lock_path = default_lock_path(matrix_path)
    lock = read_lock(lock_path)
    entry = lock.entries.get(fix.id) if lock else None
    if entry is not None and entry.pr == fix.pr:
        if entry.status == "resolved" and entry.sha(side):
            return SidePin(commit=entry.sha(side))
        if entry.status == "mismatch":
            raise ConfigError(
                f"fix {fix.id!r}: {lock_path} records a SHA mismatch ({entry.reason}); "
                "correct the matrix's commits table or re-run `difflab lock`"
            )
    pin = fix.commits.get(side)
    if pin is not None:
        return SidePin(commit=pin.sha)
    why = f" ({entry.reason})" if entry is not None and entry.reason else ""
    raise ConfigError(
        f"fix {fix.id!r}: no {side} commit known for --source git: {lock_path} does not resolve it{why} "
        f"and the matrix has no commits.{side}; run `difflab lock` or add the commit to the matrix"
    )
