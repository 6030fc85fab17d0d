"""One bare, blobless mirror per git repository, shared by every run through a lock.

The mirror lives in ``$DIFFLAB_CACHE/git/mirrors/<name>-<hash>.git``. Only
the commits a run needs are fetched (by SHA where the server allows it,
``--filter=blob:none`` where it supports partial clone); blobs arrive lazily
when a worktree checks files out. Every fetch and ref update happens under a
:class:`filelock.FileLock` on the mirror, so parallel xdist workers or nox
sessions cannot interleave writes; fetched commits are pinned under
``refs/difflab/`` so no garbage collection drops them.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import git
from filelock import FileLock

from difflab.errors import SourceError
from difflab.files.atomic import atomic_folder
from difflab.paths import cache_root

UPSTREAM = "https://github.com/sgl-project/sglang.git"
"""SGLang's public repository: the default ``--repo``."""

REPO_ENV = "DIFFLAB_SGLANG_REPO"
FULL_SHA = re.compile(r"^[0-9a-f]{40}$")
SHORT_SHA = re.compile(r"^[0-9a-f]{7,40}$")
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://|^[^/\s]+@[^/\s]+:")
_GIT_ENV = {
    "GIT_TERMINAL_PROMPT": "0",  # an unreachable or private URL must fail, not wait for a password
    "GIT_ASKPASS": "true",
    "GIT_LFS_SKIP_SMUDGE": "1",
}


def default_repo() -> str:
    """``$DIFFLAB_SGLANG_REPO``, else SGLang's public GitHub repository."""
    return os.environ.get(REPO_ENV) or UPSTREAM


def normalise_repo(repo: str | None) -> str:
    """A URL as given, or a local path made absolute (it must exist)."""
    repo = (repo or default_repo()).strip()
    if not repo:
        raise SourceError("empty git repository location")
    if _URL.match(repo):
        return repo
    path = Path(repo).expanduser()
    if not path.exists():
        raise SourceError(f"git repository {repo!r} is unreachable: no such path")
    return str(path.resolve())


def fetch_url(repo: str) -> str:
    """Local paths go through ``file://`` so the server side honours ``--filter``."""
    return repo if _URL.match(repo) else Path(repo).as_uri()


def git_error(exc: git.GitCommandError, lines: int = 4) -> str:
    text = (exc.stderr or exc.stdout or str(exc)).strip()
    text = text.replace("stderr: ", "").strip(" '\n")
    return " | ".join(t.strip() for t in text.splitlines()[-lines:] if t.strip()) or f"exit {exc.status}"


@dataclass
class Mirror:
    """The cached bare mirror of ``repo`` (a URL or an absolute path)."""

    repo: str
    cache: Path = field(default_factory=cache_root)

    @property
    def key(self) -> str:
        name = re.sub(r"[^A-Za-z0-9_.-]+", "-", self.repo.rstrip("/").rsplit("/", 1)[-1]).removesuffix(".git")
        return f"{name or 'repo'}-{hashlib.sha256(self.repo.encode()).hexdigest()[:12]}"

    @property
    def path(self) -> Path:
        return self.cache / "git" / "mirrors" / f"{self.key}.git"

    @property
    def url(self) -> str:
        return fetch_url(self.repo)

    @contextmanager
    def locked(self) -> Iterator[git.Git]:
        """The mirror, created if needed, with its lock held."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(self.path) + ".lock"):
            if not (self.path / "HEAD").exists():
                self._create()
            yield self._open()

    def repo_unlocked(self) -> git.Git:
        """For read-only queries (rev-parse, log, cat-file): git reads are safe beside a writer."""
        if not (self.path / "HEAD").exists():
            with self.locked():
                pass
        return self._open()

    def _create(self) -> None:
        """``git init --bare`` in a temp sibling renamed into place: never a half-made mirror."""
        with atomic_folder(self.path) as tmp:
            git.Git(str(tmp)).init("--quiet", "--bare", str(tmp))
            cmd = git.Git(str(tmp))
            cmd.update_environment(GIT_DIR=str(tmp))
            # Worktrees keep their sparse-checkout settings in per-worktree config. Enable
            # that here, the way `git sparse-checkout` would: format version 1, and core.bare
            # in the main worktree's own config so linked worktrees do not inherit it.
            cmd.config("core.repositoryformatversion", "1")
            cmd.config("extensions.worktreeConfig", "true")
            cmd.config("--unset", "core.bare")
            cmd.config("--worktree", "core.bare", "true")
            cmd.config("gc.auto", "0")  # never prune pinned objects behind a running worktree
            cmd.config("maintenance.auto", "false")
            self._add_remote(cmd, "origin", self.url)
            cmd.config("remote.origin.fetch", "+refs/heads/*:refs/remotes/origin/*")

    @staticmethod
    def _add_remote(cmd: git.Git, name: str, url: str) -> None:
        """A promisor remote: objects missing locally (blobs) are fetched from it on demand."""
        cmd.config(f"remote.{name}.url", url)
        cmd.config(f"remote.{name}.promisor", "true")
        cmd.config(f"remote.{name}.partialclonefilter", "blob:none")

    def _open(self) -> git.Git:
        """A git command runner bound to the mirror (GIT_DIR: never discovered from the cwd)."""
        cmd = git.Git(str(self.path))
        cmd.update_environment(GIT_DIR=str(self.path), **_GIT_ENV)
        return cmd

    # -- queries (no lock needed: git reads are safe against concurrent writers) --------------
    def has_commit(self, rev: str) -> str | None:
        """The full SHA of ``rev`` if it names a commit already in the mirror.

        ``rev-list --missing=print`` never fetches: in a partial clone, plain
        ``rev-parse``/``cat-file`` would lazily fetch a missing object from the
        promisor remote, i.e. write to the mirror without its lock.
        """
        repo = self.repo_unlocked()
        try:
            out = repo.rev_list("-n1", "--no-walk", "--missing=print", rev, "--")
        except git.GitCommandError:
            return None
        first = out.strip().splitlines()[:1]
        return first[0] if first and FULL_SHA.match(first[0]) else None

    def tree_of(self, sha: str) -> str:
        return self.repo_unlocked().rev_parse(f"{sha}^{{tree}}").strip()

    def subject(self, sha: str) -> str:
        return self.repo_unlocked().log("-1", "--format=%s", sha).strip()

    # -- fetching (under the lock) -------------------------------------------------------------
    def commit(self, rev: str, what: str | None = None) -> str:
        """Make commit ``rev`` (full or short SHA, branch, tag) present and return its full SHA.

        Raises :class:`SourceError` naming the repository if it cannot be
        reached, and naming the commit if the repository does not have it.
        """
        rev = rev.strip()
        label = what or rev
        if FULL_SHA.match(rev) and (sha := self.has_commit(rev)):
            return sha
        with self.locked() as repo:
            if FULL_SHA.match(rev):
                if not (sha := self.has_commit(rev)):
                    sha = self._fetch_sha(repo, rev)
                if not sha:
                    self._fetch_heads(repo)
                    sha = self.has_commit(rev)
            elif SHORT_SHA.match(rev):
                sha = self._resolve_short(repo, rev)
            else:
                sha = self._fetch_ref(repo, rev)
            if not sha:
                raise SourceError(f"git repository {self.repo}: commit {label} not found")
            repo.update_ref(f"refs/difflab/commits/{sha}", sha)
            return sha

    def branch(self, name: str) -> str:
        """Fetch branch ``name`` (all its history, blobless) and return its tip."""
        with self.locked() as repo:
            self._fetch(repo, f"+refs/heads/{name}:refs/remotes/origin/{name}", missing_ok=True)
            sha = self.has_commit(f"refs/remotes/origin/{name}")
        if not sha:
            raise SourceError(f"git repository {self.repo}: branch {name!r} not found")
        return sha

    def fetch_from(self, url: str, sha: str) -> str | None:
        """Fetch one commit of another repository into this mirror (evidence for forks).

        The other repository becomes a second promisor remote, so the blobs a
        patch-id needs can be fetched lazily from wherever they live.
        """
        if found := self.has_commit(sha):
            return found
        url = fetch_url(normalise_repo(url))
        name = f"difflab-{hashlib.sha256(url.encode()).hexdigest()[:12]}"
        with self.locked() as repo:
            self._add_remote(repo, name, url)
            try:
                repo.fetch("--quiet", "--no-tags", "--filter=blob:none", name, f"+{sha}:refs/difflab/upstream/{sha}")
            except git.GitCommandError as exc:
                raise SourceError(f"git repository {url}: cannot fetch commit {sha}: {git_error(exc)}") from None
        return self.has_commit(sha)

    def _fetch(self, repo: git.Git, refspec: str, *, missing_ok: bool = False) -> bool:
        """Fetch ``refspec``; False if the server does not have it, SourceError if unreachable."""
        try:
            repo.fetch("--quiet", "--no-tags", "--filter=blob:none", "origin", refspec)
            return True
        except git.GitCommandError as exc:
            detail = git_error(exc)
        self._check_reachable(repo)
        if missing_ok:
            return False
        raise SourceError(f"git repository {self.repo}: cannot fetch {refspec}: {detail}")

    def _check_reachable(self, repo: git.Git) -> None:
        try:
            repo.ls_remote("--heads", "origin")
        except git.GitCommandError as exc:
            raise SourceError(f"git repository {self.repo} is unreachable: {git_error(exc)}") from None

    def _fetch_sha(self, repo: git.Git, sha: str) -> str | None:
        if self._fetch(repo, f"+{sha}:refs/difflab/commits/{sha}", missing_ok=True):
            return self.has_commit(sha)
        return None

    def _fetch_heads(self, repo: git.Git) -> None:
        """Servers that refuse a fetch by SHA: take every branch (blobless) and look again."""
        self._fetch(repo, "+refs/heads/*:refs/remotes/origin/*", missing_ok=True)

    def _resolve_short(self, repo: git.Git, short: str) -> str | None:
        if sha := self.has_commit(short):
            return sha
        self._fetch_heads(repo)
        try:
            out = repo.rev_parse("--disambiguate=" + short)
        except git.GitCommandError:
            return None
        hits = [line for line in out.split() if self.has_commit(line) == line]
        if len(hits) > 1:
            raise SourceError(f"git repository {self.repo}: short SHA {short} is ambiguous ({len(hits)} commits)")
        return hits[0] if hits else None

    def _fetch_ref(self, repo: git.Git, ref: str) -> str | None:
        if ref.startswith("-") or ".." in ref or any(c.isspace() for c in ref):
            raise SourceError(f"{ref!r} is not a usable git ref")
        if not self._fetch(repo, ref, missing_ok=True):
            return None
        return self.has_commit("FETCH_HEAD")
