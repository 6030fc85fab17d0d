"""Backport verdicts and git evidence: the wording on synthetic observations, and the evidence itself
gathered from real git repositories (an upstream with a squash-merged fix, a fork that cherry-picks,
reverts or re-implements it).
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import git
import pytest

from difflab.backport.evidence import Evidence, _version_claim, disagreements, gather
from difflab.diff.likeness import judge_backport
from difflab.matrix import load_matrix
from difflab.observation import Observation
from difflab.source.mirror import Mirror
from matrix_samples import RELEASES

MATRIX = (
    RELEASES
    + """
[[fixes]]
id = "38935"
pr = 38935
title = "t"
base = { release = "0.5.20" }
head = { release = "0.5.21" }
[[fixes.probes]]
name = "prefill"
[fixes.probes.expect]
"rejected.enqueued" = [true, false]
"rejected.retired" = [false, true]
[fixes.probes.controls]
"valid.enqueued" = true
[[fixes.probes]]
name = "decode"
[fixes.probes.expect]
"rejected.pending" = [true, false]
"""
)

HEAD = {
    "prefill": {"rejected.enqueued": False, "rejected.retired": True, "valid.enqueued": True},
    "decode": {"rejected.pending": False},
}
BASE = {
    "prefill": {"rejected.enqueued": True, "rejected.retired": False, "valid.enqueued": True},
    "decode": {"rejected.pending": True},
}


@pytest.fixture
def fix(tmp_path: Path):
    path = tmp_path / "m.toml"
    path.write_text(MATRIX)
    return load_matrix(path).fix("38935")


def _obs(probe: str, fields: dict, status: str = "ok", error: str | None = None) -> Observation:
    return Observation(fix="38935", probe=probe, side="fork", source={}, status=status, fields=fields, error=error)


def _judge(fix, prefill: dict, decode: dict, **kw):
    return judge_backport(fix, {"prefill": _obs("prefill", prefill, **kw), "decode": _obs("decode", decode)})


def test_present_absent_partial(fix) -> None:
    assert _judge(fix, HEAD["prefill"], HEAD["decode"]).verdict == "present"
    assert _judge(fix, BASE["prefill"], BASE["decode"]).verdict == "absent"
    partial = _judge(fix, BASE["prefill"], HEAD["decode"])
    assert partial.verdict == "partial" and partial.reason == "like head: decode; like base: prefill"
    doc = partial.to_dict()
    assert doc["head_like"] == ["decode"] and doc["base_like"] == ["prefill"] and not doc["passed"]
    mixed = _judge(fix, {**HEAD["prefill"], "rejected.retired": False}, HEAD["decode"])
    assert mixed.verdict == "partial" and "mixed within the probe: prefill" in mixed.reason


def test_untrustworthy_observations_are_errors(fix) -> None:
    drift = _judge(fix, {**HEAD["prefill"], "valid.enqueued": False}, HEAD["decode"])
    assert drift.verdict == "error" and "valid.enqueued" in drift.reason
    other = _judge(fix, {**HEAD["prefill"], "rejected.enqueued": "maybe"}, HEAD["decode"])
    assert other.verdict == "error" and "matches neither side" in other.reason
    crashed = _judge(fix, {}, HEAD["decode"], status="error", error="Traceback\nAttributeError: x")
    assert crashed.verdict == "error" and "AttributeError: x" in crashed.reason
    missing = judge_backport(fix, {"prefill": _obs("prefill", HEAD["prefill"])})
    assert missing.verdict == "error" and "decode: probe error: no observation" in missing.reason


def test_disagreements_between_evidence_and_behaviour() -> None:
    """Each kind of evidence as gather() leaves it: the fix commit itself, a patch-equivalent only, neither."""
    claims = Evidence(
        version="0.5.21",
        first_release_with_fix="0.5.21",
        version_claims_fix=True,
        ancestor=False,
        patch_equivalent=False,
    )
    assert disagreements("absent", claims) == [
        "the version string 0.5.21 claims release 0.5.21 (which carries the fix), but the behaviour is absent"
    ]
    itself = Evidence(fix_commit="c" * 40, ancestor=True, patch_equivalent=True, equivalent_commits=["c" * 40])
    assert disagreements("partial", itself) == [
        f"the fix commit {'c' * 40} is in the history, but the behaviour is partial: reverted or changed later?"
    ]
    assert disagreements("present", itself) == []
    picked = Evidence(fix_commit="c" * 40, ancestor=False, patch_equivalent=True, equivalent_commits=["d" * 40])
    assert disagreements("absent", picked) == [
        f"a patch-equivalent commit ({'d' * 12}) is in the history, but the behaviour is absent"
    ]
    assert disagreements("present", picked) == []  # a cherry-pick is not a re-implementation
    reimplemented = Evidence(ancestor=False, patch_equivalent=False)
    (note,) = disagreements("present", reimplemented)
    assert "re-implemented" in note
    assert disagreements("absent", reimplemented) == []
    unknown = Evidence(ancestor=None, patch_equivalent=None, notes=["git could not answer: fatal: bad object"])
    assert disagreements("present", unknown) == [] and disagreements("absent", unknown) == []
    scan_cut_short = Evidence(ancestor=False, patch_equivalent=None)
    assert disagreements("present", scan_cut_short) == []


# -- git evidence from real repositories ----------------------------------------------------------------

DECODE = "python/sglang/srt/disaggregation/decode.py"
BASE_CODE = "def retire(req):\n    req.pending = True\n\n\ndef admit(req):\n    return True\n"
FIXED_CODE = BASE_CODE.replace("    req.pending = True\n", "    req.pending = False\n    req.finished = True\n")
OWN_CODE = BASE_CODE.replace(
    "    req.pending = True\n", "    req.finished = True  # our own way\n    req.pending = 0\n"
)


def _git(cwd: Path, *args: str) -> str:
    env = {
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.com",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.com",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_CONFIG_NOSYSTEM": "1",
        "PATH": os.environ["PATH"],
    }
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout.strip()


def _commit(repo: Path, message: str, files: dict[str, str]) -> str:
    for rel, text in files.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", message)
    return _git(repo, "rev-parse", "HEAD")


@dataclass
class Histories:
    """An upstream with #38935 squash-merged, and a fork whose branches carry it in every way git can tell."""

    upstream: Path
    fork: Path
    base: str
    fix: str
    commits: dict[str, str]
    """Branch -> the commit that matters on it (the cherry-pick, the revert, ...)."""


@pytest.fixture(scope="module")
def histories(tmp_path_factory: pytest.TempPathFactory) -> Histories:
    root = tmp_path_factory.mktemp("histories")
    up = root / "upstream"
    _git(root, "init", "-q", "-b", "main", str(up))
    base = _commit(up, "Release 0.5.20", {DECODE: BASE_CODE, "python/sglang/version.py": '__version__ = "0.5.20"\n'})
    fix = _commit(up, "Retire rejected requests at the prefill door (#38935)", {DECODE: FIXED_CODE})
    _commit(up, "Unrelated upstream work (#39000)", {"python/sglang/other.py": "x = 1\n"})
    fork = root / "fork"
    _git(root, "clone", "-q", str(up), str(fork))
    commits: dict[str, str] = {}
    _git(fork, "checkout", "-q", "-b", "cherry", base)
    _git(fork, "cherry-pick", "-x", fix)
    commits["cherry"] = _git(fork, "rev-parse", "HEAD")
    _commit(fork, "Fork: our own tweak", {"python/sglang/fork.py": "FORK = True\n"})
    _git(fork, "checkout", "-q", "-b", "cherry-revert")
    _git(fork, "revert", "--no-edit", commits["cherry"])
    commits["cherry-revert"] = _git(fork, "rev-parse", "HEAD")
    _git(fork, "checkout", "-q", "-b", "merged-revert", fix)
    _commit(fork, "Fork: our own tweak", {"python/sglang/fork.py": "FORK = True\n"})
    _git(fork, "revert", "--no-edit", fix)
    commits["merged-revert"] = _git(fork, "rev-parse", "HEAD")
    _git(fork, "checkout", "-q", "-b", "reimplemented", base)
    commits["reimplemented"] = _commit(fork, "Fork: retire rejected requests our way", {DECODE: OWN_CODE})
    _git(fork, "checkout", "-q", "-b", "revert-then-work", fix)  # the revert lies below later fork work
    _git(fork, "revert", "--no-edit", fix)
    commits["revert-then-work"] = _git(fork, "rev-parse", "HEAD")
    _commit(fork, "Fork: later work elsewhere", {"python/sglang/fork.py": "FORK = 2\n"})
    _git(fork, "checkout", "-q", "--orphan", "imported")  # the code imported as a fresh history, fix on top
    _git(fork, "rm", "-rq", "--cached", ".")
    _commit(fork, "Import SGLang 0.5.20", {DECODE: BASE_CODE, "python/sglang/version.py": '__version__ = "0.5.20"\n'})
    commits["imported"] = _commit(fork, "Retire rejected requests (from upstream)", {DECODE: FIXED_CODE})
    return Histories(up, fork, base, fix, commits)


def _gather(histories: Histories, tmp_path: Path, branch: str, **kw) -> Evidence:
    matrix = tmp_path / "m.toml"
    pins = (
        f'commits = {{ base = {{ sha = "{histories.base}", confirmed = false }}, '
        f'head = {{ sha = "{histories.fix}", confirmed = false }} }}\n'
    )
    matrix.write_text(MATRIX.replace('id = "38935"\n', 'id = "38935"\n' + pins))
    mirror = kw.pop("mirror", None) or Mirror(str(histories.fork), cache=tmp_path / "cache")
    tip = kw.pop("ref_sha", None) or mirror.branch(branch)
    fix = load_matrix(matrix).fix("38935")
    return gather(mirror, tip, fix, upstream=str(histories.upstream), matrix_path=matrix, version=None, **kw)


def test_a_cherry_pick_is_patch_equivalent_and_no_re_implementation(histories: Histories, tmp_path: Path) -> None:
    ev = _gather(histories, tmp_path, "cherry")
    assert ev.fix_commit == histories.fix and ev.fix_base == histories.base
    assert ev.ancestor is False and ev.patch_equivalent is True
    assert ev.equivalent_commits == [histories.commits["cherry"]] and ev.reverting_commits == []
    assert ev.scanned_commits == 2  # the cherry-pick and the fork's tweak since the shared base
    assert disagreements("present", ev) == []
    assert disagreements("absent", ev) == [
        f"a patch-equivalent commit ({histories.commits['cherry'][:12]}) is in the history, but the behaviour is absent"
    ]


def test_a_cherry_pick_then_reverted_is_a_disagreement_naming_the_revert(histories: Histories, tmp_path: Path) -> None:
    ev = _gather(histories, tmp_path, "cherry-revert")
    assert ev.patch_equivalent is True and ev.equivalent_commits == [histories.commits["cherry"]]
    assert ev.reverting_commits == [histories.commits["cherry-revert"]]
    (said,) = disagreements("absent", ev)
    assert said == (
        f"a patch-equivalent commit ({histories.commits['cherry'][:12]}) is in the history, but the behaviour is "
        f"absent: reverted by {histories.commits['cherry-revert'][:12]}"
    )


def test_the_fix_commit_merged_then_reverted_names_the_revert(histories: Histories, tmp_path: Path) -> None:
    ev = _gather(histories, tmp_path, "merged-revert")
    assert ev.ancestor is True and ev.patch_equivalent is True and ev.equivalent_commits == [histories.fix]
    assert ev.reverting_commits == [histories.commits["merged-revert"]]
    assert disagreements("absent", ev) == [
        f"the fix commit {histories.fix} is in the history, but the behaviour is absent: "
        f"reverted by {histories.commits['merged-revert'][:12]}"
    ]


def test_only_a_real_re_implementation_gets_the_note(histories: Histories, tmp_path: Path) -> None:
    ev = _gather(histories, tmp_path, "reimplemented")
    assert ev.ancestor is False and ev.patch_equivalent is False and ev.scanned_commits == 1
    (note,) = disagreements("present", ev)
    assert "re-implemented" in note
    assert disagreements("absent", ev) == []


def test_a_scan_cut_short_by_the_limit_says_neither_yes_nor_no(histories: Histories, tmp_path: Path) -> None:
    """The cherry-pick lies below the one commit scanned: not found is not "not there"."""
    ev = _gather(histories, tmp_path, "cherry", scan_limit=1)
    assert ev.ancestor is False and ev.scanned_commits == 1
    assert ev.patch_equivalent is None and ev.equivalent_commits == []
    assert ev.notes == [
        "no patch-equivalent commit among the ref's latest 1 commits; older ones were not scanned (--scan-limit)"
    ]
    assert disagreements("present", ev) == []


def test_a_git_failure_is_never_a_no(histories: Histories, tmp_path: Path) -> None:
    """A ref the mirror does not hold: ``merge-base --is-ancestor`` exits 128, not 1."""
    ev = _gather(histories, tmp_path, "cherry", ref_sha="f" * 40)
    assert ev.fix_commit == histories.fix
    assert ev.ancestor is None and ev.patch_equivalent is None and ev.equivalent_commits == []
    assert ev.reverting_commits is None  # not looked for, not "none found"
    assert any(n.startswith("git could not answer:") and "f" * 40 in n for n in ev.notes), ev.notes
    assert disagreements("present", ev) == [] and disagreements("absent", ev) == []


class _FailingMergeBase:
    """The mirror's own git, but ``merge-base A B`` fails as git does on a broken object store (exit 128)."""

    def __init__(self, real: git.Git) -> None:
        self._real = real

    def __getattr__(self, name: str):
        return getattr(self._real, name)

    def merge_base(self, *args: str) -> str:
        if "--is-ancestor" in args:
            return self._real.merge_base(*args)
        raise git.GitCommandError(["git", "merge-base", *args], 128, b"fatal: unable to read tree 0123abcd")


def test_a_merge_base_failure_is_not_read_as_no_shared_history(
    histories: Histories, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mirror = Mirror(str(histories.fork), cache=tmp_path / "cache")
    tip = mirror.branch("reimplemented")
    real = Mirror.repo_unlocked
    monkeypatch.setattr(Mirror, "repo_unlocked", lambda self: _FailingMergeBase(real(self)))
    ev = _gather(histories, tmp_path, "reimplemented", mirror=mirror, ref_sha=tip)
    assert ev.ancestor is False and ev.patch_equivalent is None
    assert not any("share no history" in n for n in ev.notes), ev.notes
    assert any("unable to read tree 0123abcd" in n for n in ev.notes), ev.notes
    assert disagreements("present", ev) == []


def test_a_fork_with_no_shared_history_is_scanned_from_its_tip(histories: Histories, tmp_path: Path) -> None:
    """A fork that imported the code as a fresh history: merge-base exits 1, and the latest commits are scanned."""
    ev = _gather(histories, tmp_path, "imported")
    assert ev.ancestor is False and ev.patch_equivalent is True
    assert ev.equivalent_commits == [histories.commits["imported"]] and ev.scanned_commits == 2
    assert "the fork and the fix share no history; scanned the ref's latest commits" in ev.notes
    limited = _gather(histories, tmp_path, "imported", scan_limit=1)
    assert limited.scanned_commits == 1 and limited.equivalent_commits == [histories.commits["imported"]]


def test_a_revert_below_later_fork_work_is_found_within_the_scan_limit(histories: Histories, tmp_path: Path) -> None:
    """Only commits touching the fix's files count toward the limit: later work elsewhere cannot hide a revert."""
    ev = _gather(histories, tmp_path, "revert-then-work", scan_limit=1)
    assert ev.ancestor is True and ev.reverting_commits == [histories.commits["revert-then-work"]]


class _FailingDiffTree(_FailingMergeBase):
    """The mirror's own git, but listing the fix's files fails (a broken object store)."""

    def merge_base(self, *args: str) -> str:
        return self._real.merge_base(*args)

    def diff_tree(self, *args: str) -> str:
        raise git.GitCommandError(["git", "diff-tree", *args], 128, b"fatal: bad object 0123abcd")


def test_a_git_failure_looking_for_a_revert_leaves_it_unknown(
    histories: Histories, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mirror = Mirror(str(histories.fork), cache=tmp_path / "cache")
    tip = mirror.branch("merged-revert")
    real = Mirror.repo_unlocked
    monkeypatch.setattr(Mirror, "repo_unlocked", lambda self: _FailingDiffTree(real(self)))
    ev = _gather(histories, tmp_path, "merged-revert", mirror=mirror, ref_sha=tip)
    assert ev.ancestor is True and ev.reverting_commits is None  # not looked for, not "none found"
    (note,) = [n for n in ev.notes if n.startswith("git could not look for a revert of the fix: ")]
    assert "bad object 0123abcd" in note


@pytest.mark.parametrize(
    ("version", "first", "claims", "note"),
    [
        ("0.5.21", "0.5.21", True, None),  # the release that carries the fix
        ("0.5.22.post1", "0.5.21", True, None),
        ("0.5.20", "0.5.21", False, None),
        ("0.5.21rc1", "0.5.21", False, None),  # a release candidate comes before its release
        ("0.5.22.dev3", "0.5.21", None, "version 0.5.22.dev3 is a development version: it claims nothing"),
        ("0.5.22+fork.1", "0.5.21", None, "version 0.5.22+fork.1 is a development version: it claims nothing"),
        ("fork-main", "0.5.21", None, "version 'fork-main' is not comparable with release 0.5.21"),
        (None, "0.5.21", None, None),  # no version string read: no claim
        ("0.5.22", None, None, None),  # no release carries the fix yet: nothing to claim
    ],
)
def test_what_a_version_string_claims(version: str | None, first: str | None, claims: bool | None, note) -> None:
    ev = Evidence(version=version, first_release_with_fix=first)
    _version_claim(ev)
    assert ev.version_claims_fix is claims
    assert ev.notes == ([note] if note else [])


def test_a_fork_whose_version_claims_the_fix_is_said_beside_its_behaviour(histories: Histories, tmp_path: Path) -> None:
    """The matrix pins no fix commit here: git says nothing, the version string still claims the release."""
    matrix = tmp_path / "m.toml"
    matrix.write_text(MATRIX)
    fix = load_matrix(matrix).fix("38935")
    assert fix.head.release
    mirror = Mirror(str(histories.fork), cache=tmp_path / "cache")
    tip = mirror.branch("reimplemented")
    ev = gather(mirror, tip, fix, upstream=None, matrix_path=matrix, version=fix.head.release)
    assert (ev.version, ev.first_release_with_fix, ev.version_claims_fix) == (fix.head.release, fix.head.release, True)
    assert ev.upstream_repo is None and ev.ancestor is None
    assert [n for n in ev.notes if n.startswith("no upstream fix commit known: ")], ev.notes
    assert disagreements("absent", ev) == [
        f"the version string {fix.head.release} claims release {fix.head.release} (which carries the fix), "
        "but the behaviour is absent"
    ]
    assert disagreements("present", ev) == []


def test_every_commit_found_is_named_and_a_re_implementation_is_said_in_full() -> None:
    """Two cherry-picks (one per release branch merged in) and two reverts: each named by its short SHA."""
    twice = Evidence(
        ancestor=False,
        patch_equivalent=True,
        equivalent_commits=["a" * 40, "b" * 40],
        reverting_commits=["c" * 40, "d" * 40],
    )
    assert disagreements("absent", twice) == [
        f"a patch-equivalent commit ({'a' * 12}, {'b' * 12}) is in the history, but the behaviour is absent: "
        f"reverted by {'c' * 12}, {'d' * 12}"
    ]
    assert disagreements("present", Evidence(ancestor=False, patch_equivalent=False)) == [
        "the behaviour is present without the fix commit or a patch-equivalent commit "
        "(re-implemented, squashed with other changes, or conflict-resolved)"
    ]


# -- evidence from small purpose-built histories: each holds one shape a fork's git can take ----------------


def _repo(path: Path) -> Path:
    _git(path.parent, "init", "-q", "-b", "main", str(path))
    return path


def _gather_pinned(tmp_path: Path, fork: Path, branch: str, head_sha: str, upstream: str | None, **kw) -> Evidence:
    """gather() for a matrix that pins ``head_sha`` as the fix commit."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    matrix = tmp_path / "m.toml"
    pins = f'commits = {{ head = {{ sha = "{head_sha}", confirmed = false }} }}\n'
    matrix.write_text(MATRIX.replace('id = "38935"\n', 'id = "38935"\n' + pins))
    mirror = Mirror(str(fork), cache=tmp_path / "cache")
    tip = mirror.branch(branch)
    for key, value in kw.pop("config", {}).items():
        mirror.repo_unlocked().config(key, value)
    fix = load_matrix(matrix).fix("38935")
    return gather(mirror, tip, fix, upstream=upstream, matrix_path=matrix, version=None, **kw)


def test_the_fix_commit_in_the_fork_needs_no_upstream(histories: Histories, tmp_path: Path) -> None:
    ev = _gather_pinned(tmp_path, histories.fork, "merged-revert", histories.fix, None)
    assert ev.upstream_repo is None and ev.fix_commit == histories.fix and ev.ancestor is True
    assert "the fix commit itself is in the ref's history" in ev.notes


def test_the_upstream_named_is_recorded(histories: Histories, tmp_path: Path) -> None:
    ev = _gather(histories, tmp_path, "cherry")
    assert ev.upstream_repo == str(histories.upstream)


@pytest.mark.parametrize(
    ("sha", "upstream", "note"),
    [
        ("abcdef1", None, "abcdef1 is a short SHA not in the fork's history; `difflab lock` records full SHAs"),
        ("e" * 40, None, f"{'e' * 40} is not in the fork and no upstream repository was given"),
        ("e" * 40, "upstream", f"cannot fetch {'e' * 40} from upstream: "),
    ],
)
def test_a_fix_commit_git_cannot_reach_is_said_why(
    histories: Histories, tmp_path: Path, sha: str, upstream: str | None, note: str
) -> None:
    url = str(histories.upstream) if upstream else None
    ev = _gather_pinned(tmp_path, histories.fork, "cherry", sha, url)
    assert ev.fix_commit is None and ev.ancestor is None and ev.patch_equivalent is None
    (said,) = ev.notes
    assert said.startswith(note) if upstream else said == note


def test_a_users_colour_and_log_format_settings_do_not_change_the_patch_ids(
    histories: Histories, tmp_path: Path
) -> None:
    """``color.ui=always`` and ``format.pretty`` in a git config must not hide the cherry-pick or its revert."""
    config = {"color.ui": "always", "format.pretty": "format:%s"}
    ev = _gather_pinned(
        tmp_path, histories.fork, "cherry-revert", histories.fix, str(histories.upstream), config=config
    )
    assert ev.patch_equivalent is True and ev.equivalent_commits == [histories.commits["cherry"]]
    assert ev.reverting_commits == [histories.commits["cherry-revert"]]


def test_a_root_fix_commit_has_no_base_and_no_revert_is_looked_for(tmp_path: Path) -> None:
    """The fix is upstream's first commit; the fork, of its own history, applied the same patch."""
    up, fork = _repo(tmp_path / "up"), _repo(tmp_path / "fork")
    fix = _commit(up, "Add the scheduler", {DECODE: FIXED_CODE})
    _commit(fork, "Fork: start", {"README": "fork\n"})
    applied = _commit(fork, "Add the scheduler (from upstream)", {DECODE: FIXED_CODE})
    ev = _gather_pinned(tmp_path, fork, "main", fix, str(up))
    assert ev.fix_commit == fix and ev.fix_base is None and ev.ancestor is False
    assert ev.patch_equivalent is True and ev.equivalent_commits == [applied]
    assert ev.reverting_commits is None
    assert ev.notes == ["the fork and the fix share no history; scanned the ref's latest commits"]


def test_an_empty_fix_commit_has_no_patch_to_look_for(tmp_path: Path) -> None:
    up = _repo(tmp_path / "up")
    base = _commit(up, "Release", {DECODE: BASE_CODE})
    _git(up, "commit", "-q", "--allow-empty", "-m", "An empty fix")
    fix = _git(up, "rev-parse", "HEAD")
    _git(up, "checkout", "-q", "-b", "other", base)
    _commit(up, "Other work", {"python/sglang/other.py": "x = 1\n"})
    ev = _gather_pinned(tmp_path, up, "other", fix, str(up))  # the fix lies on main, outside the branch
    assert ev.fix_base == base and ev.ancestor is False and ev.patch_equivalent is None
    assert ev.notes == [f"{fix[:12]} has an empty diff: no patch to look for"]
    merged = _gather_pinned(tmp_path / "merged", up, "main", fix, None)
    assert merged.ancestor is True and merged.reverting_commits == []


def test_a_revert_of_a_fix_touching_two_files_is_found(tmp_path: Path) -> None:
    up = _repo(tmp_path / "up")
    _commit(up, "Release", {DECODE: BASE_CODE, "python/sglang/b.py": "B = 1\n"})
    fix = _commit(up, "Fix in two files", {DECODE: FIXED_CODE, "python/sglang/b.py": "B = 2\n"})
    _git(up, "revert", "--no-edit", fix)
    revert = _git(up, "rev-parse", "HEAD")
    ev = _gather_pinned(tmp_path, up, "main", fix, None)
    assert ev.ancestor is True and ev.reverting_commits == [revert]


def test_the_commit_a_fix_undoes_is_not_its_revert(tmp_path: Path) -> None:
    """The fix undoes an earlier commit (which has the fix's inverted patch): only commits after the fix count."""
    up = _repo(tmp_path / "up")
    _commit(up, "Release", {DECODE: FIXED_CODE})
    _commit(up, "Introduce the bug", {DECODE: BASE_CODE})
    fix = _commit(up, "Fix the bug", {DECODE: FIXED_CODE})
    _commit(up, "Later work elsewhere", {"python/sglang/other.py": "x = 1\n"})
    ev = _gather_pinned(tmp_path, up, "main", fix, None)
    assert ev.ancestor is True and ev.reverting_commits == []


def test_the_revert_scan_stops_at_the_scan_limit(tmp_path: Path) -> None:
    """The revert lies below a later commit to the fix's file: a scan of one commit does not reach it."""
    up = _repo(tmp_path / "up")
    _commit(up, "Release", {DECODE: BASE_CODE})
    fix = _commit(up, "Fix", {DECODE: FIXED_CODE})
    _git(up, "revert", "--no-edit", fix)
    revert = _git(up, "rev-parse", "HEAD")
    _commit(up, "Later work in the same file", {DECODE: BASE_CODE + "\n\nX = 1\n"})
    assert _gather_pinned(tmp_path, up, "main", fix, None, scan_limit=2).reverting_commits == [revert]
    assert _gather_pinned(tmp_path / "one", up, "main", fix, None, scan_limit=1).reverting_commits == []


def test_the_fix_commit_comes_from_the_lock_beside_the_matrix(
    histories: Histories, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The matrix pins no commit; `difflab lock` resolved it into the lock next to that matrix (not $DIFFLAB_LOCK's)."""
    monkeypatch.setenv("DIFFLAB_LOCK", str(tmp_path / "elsewhere.lock.json"))
    matrix = tmp_path / "m.toml"
    matrix.write_text(MATRIX)
    entry = {"fix": "38935", "pr": 38935, "status": "resolved", "base": histories.base, "head": histories.fix}
    lock = {"schema": 1, "repo": str(histories.upstream), "branch": "main", "branch_tip": histories.fix}
    lock |= {"matrix": "m.toml", "matrix_sha256": "0" * 64, "resolved_at": "2026-01-01T00:00:00Z"}
    (tmp_path / "m.lock.json").write_text(json.dumps(lock | {"entries": {"38935": entry}}))
    mirror = Mirror(str(histories.fork), cache=tmp_path / "cache")
    fix = load_matrix(matrix).fix("38935")
    ev = gather(mirror, mirror.branch("merged-revert"), fix, upstream=None, matrix_path=matrix, version=None)
    assert ev.fix_commit == histories.fix and ev.ancestor is True
