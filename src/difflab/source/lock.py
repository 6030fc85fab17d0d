"""The lock file: each fix's PR resolved to full commit SHAs on the repository's main branch.

SGLang squash-merges every PR, ending the subject with ``(#N)``. So a PR's
head is the one first-parent commit of ``main`` whose subject ends with
``(#N)`` and its base is that commit's first parent. Nothing is guessed: no
such commit, or more than one, leaves the fix ``unresolved`` with the reason;
a short SHA in the matrix that the resolved commit does not start with makes
it ``mismatch``, and neither is ever used as a pin.

The lock lives next to its matrix (``upstream.toml`` → ``upstream.lock.json``):
JSON because it is machine-written and the standard library reads it.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from difflab.errors import ConfigError
from difflab.files.atomic import write_atomic
from difflab.matrix.model import Fix, Matrix
from difflab.paths import default_matrix
from difflab.source.mirror import Mirror

LOCK_SCHEMA = 1
LOCK_ENV = "DIFFLAB_LOCK"
STATUSES = ("resolved", "unresolved", "mismatch")
_PR_SUFFIX = re.compile(r"\(#(\d+)\)\s*$")


def lock_path_for(matrix_path: Path) -> Path:
    """``matrices/upstream.toml`` → ``matrices/upstream.lock.json``."""
    return matrix_path.with_name(f"{matrix_path.stem}.lock.json")


def default_lock_path(matrix_path: Path | None = None) -> Path:
    """The given matrix's lock, else ``$DIFFLAB_LOCK``, else the default matrix's lock."""
    if matrix_path is not None:
        return lock_path_for(Path(matrix_path))
    env = os.environ.get(LOCK_ENV)
    return Path(env) if env else lock_path_for(default_matrix())


@dataclass
class ShaCheck:
    """A SHA the matrix quotes, checked against the resolved one."""

    side: str
    matrix_sha: str
    resolved: str | None
    ok: bool


@dataclass
class LockEntry:
    """One fix: ``resolved`` (base and head set), ``unresolved`` or ``mismatch`` (with ``reason``)."""

    fix: str
    pr: int
    status: str
    base: str | None = None
    head: str | None = None
    subject: str | None = None
    reason: str | None = None
    checks: list[ShaCheck] = field(default_factory=list)

    def sha(self, side: str) -> str | None:
        return self.base if side == "base" else self.head


@dataclass
class LockFile:
    """Everything ``difflab lock`` resolved, and against what."""

    repo: str
    branch: str
    branch_tip: str
    matrix: str
    matrix_sha256: str
    resolved_at: str
    entries: dict[str, LockEntry]
    schema: int = LOCK_SCHEMA

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["entries"] = {k: asdict(v) for k, v in sorted(self.entries.items())}
        return data

    @property
    def complete(self) -> bool:
        return all(e.status == "resolved" for e in self.entries.values())


# -- resolution ------------------------------------------------------------------------------


@dataclass(frozen=True)
class MainCommit:
    sha: str
    parents: tuple[str, ...]
    subject: str


def main_commits(mirror: Mirror, tip: str) -> dict[int, list[MainCommit]]:
    """First-parent commits from ``tip`` down, by the PR number their subject ends with."""
    out = mirror.repo_unlocked().log("--first-parent", "--format=%H%x00%P%x00%s", tip)
    by_pr: dict[int, list[MainCommit]] = {}
    for line in out.splitlines():
        sha, parents, subject = line.split("\x00", 2)
        m = _PR_SUFFIX.search(subject)
        if m:
            by_pr.setdefault(int(m.group(1)), []).append(MainCommit(sha, tuple(parents.split()), subject))
    return by_pr


def resolve_fix(fix: Fix, by_pr: dict[int, list[MainCommit]], branch: str) -> LockEntry:
    """The lock entry for one fix; never a guess."""
    hits = by_pr.get(fix.pr, [])
    if not hits:
        return LockEntry(
            fix.id,
            fix.pr,
            "unresolved",
            reason=f"no first-parent commit on {branch} has a subject ending with (#{fix.pr})",
        )
    if len(hits) > 1:
        shas = ", ".join(h.sha[:12] for h in hits)
        return LockEntry(
            fix.id,
            fix.pr,
            "unresolved",
            reason=f"ambiguous: {len(hits)} commits on {branch} end with (#{fix.pr}): {shas}",
        )
    hit = hits[0]
    if not hit.parents:
        return LockEntry(
            fix.id, fix.pr, "unresolved", subject=hit.subject, reason=f"{hit.sha[:12]} is a root commit: no base"
        )
    entry = LockEntry(fix.id, fix.pr, "resolved", base=hit.parents[0], head=hit.sha, subject=hit.subject)
    for side, pin in sorted(fix.commits.items()):
        resolved = entry.sha(side)
        ok = resolved is not None and resolved.startswith(pin.sha)
        entry.checks.append(ShaCheck(side, pin.sha, resolved, ok))
    bad = [c for c in entry.checks if not c.ok]
    if bad:
        entry.status = "mismatch"
        entry.reason = "; ".join(
            f"matrix {c.side} {c.matrix_sha} but (#{fix.pr}) resolves to {c.resolved}" for c in bad
        )
    return entry


def resolve_lock(matrix: Matrix, mirror: Mirror, branch: str = "main") -> LockFile:
    """Resolve every fix of ``matrix`` against ``branch`` of the mirror's repository."""
    tip = mirror.branch(branch)
    by_pr = main_commits(mirror, tip)
    entries = {fix.id: resolve_fix(fix, by_pr, branch) for fix in matrix.fixes}
    return LockFile(
        repo=mirror.repo,
        branch=branch,
        branch_tip=tip,
        matrix=matrix.path.name,
        matrix_sha256=matrix.sha256,
        resolved_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z"),
        entries=entries,
    )


# -- files -------------------------------------------------------------------------------------


def write_lock(path: Path, lock: LockFile) -> None:
    """Atomically: a reader never sees half a lock file."""
    write_atomic(path, json.dumps(lock.to_dict(), indent=2, sort_keys=True) + "\n")


def read_lock(path: Path) -> LockFile | None:
    """The lock at ``path``, None if there is none; ConfigError if it is malformed."""
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: cannot read lock file: {exc}") from None
    try:
        if raw.get("schema") != LOCK_SCHEMA:
            raise ValueError(f"expected schema {LOCK_SCHEMA}, got {raw.get('schema')!r}")
        entries = {}
        for key, e in raw["entries"].items():
            checks = [ShaCheck(**c) for c in e.pop("checks", [])]
            entry = LockEntry(**e, checks=checks)
            if entry.status not in STATUSES:
                raise ValueError(f"entry {key!r}: unknown status {entry.status!r}")
            entries[key] = entry
        fields = {k: raw[k] for k in ("repo", "branch", "branch_tip", "matrix", "matrix_sha256", "resolved_at")}
        return LockFile(**fields, entries=entries)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ConfigError(f"{path}: malformed lock file: {exc}") from None
