"""Git evidence beside a backport verdict: is the upstream fix commit, or its patch, in the fork?

Evidence never decides the verdict (behaviour does); it explains it. A fork
can hold the fix commit and still lack the behaviour (a later revert), or
carry the behaviour through a cherry-pick whose SHA differs; and a version
string can claim a release whose fix the code lacks. Each question is
answered ``true``/``false``, or ``null`` with a note saying why not.

Upstream commits are fetched into the fork's mirror (under
``refs/difflab/upstream/``) from the upstream repository, which becomes a
second promisor remote there, so ancestry and patch-ids are computed in one
object store. ``patch_equivalent`` uses ``git patch-id --stable``, the test
``git cherry`` applies, over the fork's commits since its merge-base with
the fix (at most ``scan_limit`` of them; a scan cut short at that limit finds no "no").
A commit whose patch-id is that of the fix's diff inverted is a revert.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import git
from packaging.version import InvalidVersion, Version

from difflab.errors import ConfigError, SourceError
from difflab.matrix.model import Fix
from difflab.source.git import commit_pin_for
from difflab.source.mirror import FULL_SHA, Mirror, git_error

DEFAULT_SCAN_LIMIT = 2000


@dataclass
class Evidence:
    """What git says about one fix in the fork's ref."""

    upstream_repo: str | None = None
    fix_commit: str | None = None
    fix_base: str | None = None
    ancestor: bool | None = None
    patch_equivalent: bool | None = None
    equivalent_commits: list[str] = field(default_factory=list)
    scanned_commits: int = 0
    reverting_commits: list[str] | None = None
    """Commits after the fix (or its patch-equivalent) whose patch is the fix's, inverted; None: not looked for."""
    version: str | None = None
    first_release_with_fix: str | None = None
    version_claims_fix: bool | None = None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def patch_ids(cmd: git.Git, *log_args: str) -> dict[str, str]:
    """``commit → patch-id`` for the non-merge commits ``git log`` selects (empty diffs omitted)."""
    proc = cmd.log("-p", "--no-merges", "--no-color", "--format=commit %H", *log_args, as_process=True)
    try:
        out = cmd.patch_id("--stable", istream=proc.proc.stdout)
    finally:
        proc.wait()
    ids: dict[str, str] = {}
    for line in out.splitlines():
        pid, _, commit = line.partition(" ")
        if commit:
            ids[commit.strip()] = pid
    return ids


def inverse_patch_id(cmd: git.Git, head: str) -> str | None:
    """The patch-id a revert of ``head`` has: of the diff from ``head`` back to its parent.

    (``git log -R`` would not do: it swaps the ``a/``, ``b/`` names, which the patch-id covers.)
    """
    proc = cmd.diff("--no-color", head, f"{head}^", as_process=True)
    try:
        out = cmd.patch_id("--stable", istream=proc.proc.stdout)
    finally:
        proc.wait()
    return out.split(" ", 1)[0] or None


def is_ancestor(cmd: git.Git, older: str, newer: str) -> bool:
    try:
        cmd.merge_base("--is-ancestor", older, newer)
        return True
    except git.GitCommandError as exc:
        if exc.status == 1:
            return False
        raise


def _version_claim(ev: Evidence) -> None:
    if not ev.version or not ev.first_release_with_fix:
        return
    try:
        claimed, first = Version(ev.version), Version(ev.first_release_with_fix)
    except InvalidVersion:
        ev.notes.append(f"version {ev.version!r} is not comparable with release {ev.first_release_with_fix}")
        return
    if claimed.is_devrelease or claimed.local:
        ev.notes.append(f"version {ev.version} is a development version: it claims nothing")
        return
    ev.version_claims_fix = claimed >= first


def _upstream_commit(fork: Mirror, upstream: str | None, rev: str, ev: Evidence) -> str | None:
    """``rev`` as a full SHA in the fork's mirror: already there, or fetched from upstream."""
    if found := fork.has_commit(rev):
        return found
    if not FULL_SHA.match(rev):
        ev.notes.append(f"{rev} is a short SHA not in the fork's history; `difflab lock` records full SHAs")
        return None
    if not upstream:
        ev.notes.append(f"{rev} is not in the fork and no upstream repository was given")
        return None
    try:
        return fork.fetch_from(upstream, rev)
    except SourceError as exc:
        ev.notes.append(f"cannot fetch {rev} from upstream: {exc}")
        return None


def gather(
    fork: Mirror,
    ref_sha: str,
    fix: Fix,
    *,
    upstream: str | None,
    matrix_path: Path | None,
    version: str | None,
    scan_limit: int = DEFAULT_SCAN_LIMIT,
) -> Evidence:
    """Evidence for ``fix`` in commit ``ref_sha`` of the fork (already in ``fork``).

    A question git could not answer stays ``null`` with git's own words in the notes: a
    failure never reads as "no".
    """
    ev = Evidence(upstream_repo=upstream, version=version, first_release_with_fix=fix.head.release)
    _version_claim(ev)
    try:
        head_pin = commit_pin_for(fix, "head", matrix_path).commit
    except ConfigError as exc:
        ev.notes.append(f"no upstream fix commit known: {exc}")
        return ev
    assert head_pin is not None
    head = _upstream_commit(fork, upstream, head_pin, ev)
    if head is None:
        return ev
    ev.fix_commit = head
    try:
        _history(fork.repo_unlocked(), head, ref_sha, scan_limit, ev)
    except git.GitCommandError as exc:
        ev.notes.append(f"git could not answer: {git_error(exc)}")
    return ev


def _history(cmd: git.Git, head: str, ref_sha: str, scan_limit: int, ev: Evidence) -> None:
    """Ancestry, patch equivalence and reverts of the fix commit ``head`` in ``ref_sha``'s history."""
    if cmd.log("-1", "--format=%P", head).strip():
        ev.fix_base = cmd.rev_parse(f"{head}^").strip()
    ev.ancestor = is_ancestor(cmd, head, ref_sha)
    if ev.ancestor:
        ev.patch_equivalent, ev.equivalent_commits = True, [head]
        ev.notes.append("the fix commit itself is in the ref's history")
        _reverts_after_the_fix(cmd, head, ref_sha, scan_limit, ev)
        return
    wanted = patch_ids(cmd, "-1", head).get(head)
    if wanted is None:
        ev.notes.append(f"{head[:12]} has an empty diff: no patch to look for")
        return
    scan = _scan_since_shared_history(cmd, head, ref_sha, scan_limit, ev)
    _patch_equivalence(scan, wanted, scan_limit, ev)
    ev.reverting_commits = reverting(cmd, head, scan) if ev.fix_base else None


def reverting(cmd: git.Git, head: str, scan: dict[str, str]) -> list[str]:
    """The scanned commits whose patch is ``head``'s inverted."""
    inverse = inverse_patch_id(cmd, head)
    return sorted(c for c, pid in scan.items() if inverse and pid == inverse)


def _reverts_after_the_fix(cmd: git.Git, head: str, ref_sha: str, scan_limit: int, ev: Evidence) -> None:
    """Only commits after the fix that touch its files can revert it; a git failure here leaves that unknown."""
    if not ev.fix_base:
        return
    try:
        files = [f for f in cmd.diff_tree("--no-commit-id", "--name-only", "-z", "-r", head).split("\0") if f]
        scan = patch_ids(cmd, f"--max-count={scan_limit}", ref_sha, f"^{head}", "--", *files) if files else {}
        ev.reverting_commits = reverting(cmd, head, scan)
    except git.GitCommandError as exc:
        ev.notes.append(f"git could not look for a revert of the fix: {git_error(exc)}")


def _scan_since_shared_history(cmd: git.Git, head: str, ref_sha: str, scan_limit: int, ev: Evidence) -> dict[str, str]:
    """Patch-ids of the ref's commits since its merge-base with the fix (exit 1 of merge-base: none shared)."""
    try:
        since = cmd.merge_base(ref_sha, head).strip()
    except git.GitCommandError as exc:
        if exc.status != 1:
            raise
        ev.notes.append("the fork and the fix share no history; scanned the ref's latest commits")
        return patch_ids(cmd, f"--max-count={scan_limit}", ref_sha)
    return patch_ids(cmd, f"--max-count={scan_limit}", ref_sha, f"^{since}")


def _patch_equivalence(scan: dict[str, str], wanted: str, scan_limit: int, ev: Evidence) -> None:
    """Found, or not found in every commit that could hold it; a scan cut short at the limit says neither."""
    ev.scanned_commits = len(scan)
    ev.equivalent_commits = sorted(c for c, pid in scan.items() if pid == wanted)
    if ev.equivalent_commits:
        ev.patch_equivalent = True
    elif len(scan) >= scan_limit:
        ev.notes.append(
            f"no patch-equivalent commit among the ref's latest {scan_limit} commits; older ones were not "
            "scanned (--scan-limit)"
        )
    else:
        ev.patch_equivalent = False


def disagreements(verdict: str, ev: Evidence) -> list[str]:
    """Where git or the version string says one thing and the behaviour another: read these first."""
    out = []
    if ev.version_claims_fix and verdict != "present":
        out.append(
            f"the version string {ev.version} claims release {ev.first_release_with_fix} (which carries "
            f"the fix), but the behaviour is {verdict}"
        )
    reverts = ev.reverting_commits or []
    reverted = f"reverted by {', '.join(c[:12] for c in reverts)}" if reverts else ""
    if ev.ancestor and verdict != "present":
        out.append(
            f"the fix commit {ev.fix_commit} is in the history, but the behaviour is {verdict}: "
            + (reverted or "reverted or changed later?")
        )
    elif ev.patch_equivalent and verdict != "present":
        found = ", ".join(c[:12] for c in ev.equivalent_commits)
        out.append(
            f"a patch-equivalent commit ({found}) is in the history, but the behaviour is {verdict}"
            + (f": {reverted}" if reverted else "")
        )
    if verdict == "present" and ev.ancestor is False and ev.patch_equivalent is False:
        out.append(
            "the behaviour is present without the fix commit or a patch-equivalent commit "
            "(re-implemented, squashed with other changes, or conflict-resolved)"
        )
    return out
