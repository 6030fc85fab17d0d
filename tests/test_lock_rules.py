"""``difflab lock``'s rules one by one, fast: a PR is the one first-parent commit of main ending ``(#N)``.

The history is a real git repository shaped like SGLang's main (squash merges whose subject ends
with ``(#N)``, a merge commit whose second parent brings a PR's own commits, a revert quoting the
PR), read through the lab's own mirror; the lock files are what ``difflab lock`` writes.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from difflab.errors import ConfigError
from difflab.matrix import load_matrix
from difflab.matrix.model import CommitPin, Fix, SidePin
from difflab.paths import default_matrix
from difflab.source.lock import (
    LockEntry,
    LockFile,
    MainCommit,
    ShaCheck,
    default_lock_path,
    lock_path_for,
    main_commits,
    read_lock,
    resolve_fix,
    resolve_lock,
    write_lock,
)
from difflab.source.mirror import Mirror
from matrix_samples import RELEASES

A, B, C, D = ("a" * 40, "b" * 40, "c" * 40, "d" * 40)


def fix(pr: int = 38935, **commits: str) -> Fix:
    pins = {side: CommitPin(sha, False) for side, sha in commits.items()}
    return Fix(str(pr), pr, "t", SidePin(release="0.5.20"), SidePin(release="0.5.21"), (), commits=pins)


def test_the_lock_lives_beside_its_matrix_or_where_the_environment_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert lock_path_for(Path("/m/upstream.toml")) == Path("/m/upstream.lock.json")
    monkeypatch.setenv("DIFFLAB_LOCK", str(tmp_path / "env.lock.json"))
    assert default_lock_path(Path("/m/x.toml")) == Path("/m/x.lock.json")  # the matrix given wins
    assert default_lock_path() == tmp_path / "env.lock.json"
    monkeypatch.setenv("DIFFLAB_LOCK", "")
    assert default_lock_path() == lock_path_for(default_matrix())
    monkeypatch.delenv("DIFFLAB_LOCK")
    assert default_lock_path() == lock_path_for(default_matrix())


def test_a_pr_with_no_commit_or_two_or_a_root_commit_stays_unresolved() -> None:
    assert resolve_fix(fix(), {}, "main") == LockEntry(
        "38935", 38935, "unresolved", reason="no first-parent commit on main has a subject ending with (#38935)"
    )
    two = {38935: [MainCommit(A, (B,), "x (#38935)"), MainCommit(C, (D,), "Revert x (#38935)")]}
    assert resolve_fix(fix(), two, "release") == LockEntry(
        "38935", 38935, "unresolved", reason=f"ambiguous: 2 commits on release end with (#38935): {A[:12]}, {C[:12]}"
    )
    root = {38935: [MainCommit(A, (), "Initial (#38935)")]}
    assert resolve_fix(fix(), root, "main") == LockEntry(
        "38935", 38935, "unresolved", subject="Initial (#38935)", reason=f"{A[:12]} is a root commit: no base"
    )


def test_a_resolved_pr_is_its_commit_and_first_parent_checked_against_the_matrix_shas() -> None:
    by_pr = {38935: [MainCommit(A, (B, C), "Fix the door (#38935)")], 1: [MainCommit(D, (A,), "other (#1)")]}
    entry = resolve_fix(fix(head=A[:8], base=B), by_pr, "main")
    assert entry == LockEntry(
        "38935",
        38935,
        "resolved",
        base=B,
        head=A,
        subject="Fix the door (#38935)",
        checks=[ShaCheck("base", B, B, True), ShaCheck("head", A[:8], A, True)],
    )
    assert entry.sha("base") == B and entry.sha("head") == A
    assert resolve_fix(fix(), by_pr, "main").checks == []


def test_a_matrix_sha_the_resolved_commit_does_not_start_with_is_a_mismatch() -> None:
    by_pr = {38935: [MainCommit(A, (B,), "Fix (#38935)")]}
    entry = resolve_fix(fix(base=C[:10], head=A), by_pr, "main")
    assert entry.status == "mismatch" and (entry.base, entry.head) == (B, A)
    assert entry.checks == [ShaCheck("base", C[:10], B, False), ShaCheck("head", A, A, True)]
    assert entry.reason == f"matrix base {C[:10]} but (#38935) resolves to {B}"
    both = resolve_fix(fix(base=C, head=D), by_pr, "main")
    assert both.reason == f"matrix base {C} but (#38935) resolves to {B}; matrix head {D} but (#38935) resolves to {A}"


def git(cwd: Path, *args: str) -> str:
    env = {"GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z"}
    cmd = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args]
    return subprocess.run(cmd, cwd=cwd, check=True, capture_output=True, text=True, env=env | _path()).stdout.strip()


def _path() -> dict[str, str]:
    return {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/")}


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """main: release, a PR's squash merge, a merge of a side branch (whose own commits end with (#2)), a fix."""
    root = tmp_path_factory.mktemp("upstream") / "sglang"
    root.mkdir()
    git(root, "init", "-q", "-b", "main")
    shas = {}

    def commit(name: str, subject: str) -> str:
        (root / f"{name}.py").write_text(name)
        git(root, "add", "-A")
        git(root, "commit", "-qm", subject)
        return git(root, "rev-parse", "HEAD")

    shas["release"] = commit("release", "Release v0.5.20")
    shas["fix"] = commit("door", "Fix the prefill door (#38935)")
    git(root, "checkout", "-qb", "side")
    shas["side"] = commit("side", "Work in progress (#2)")
    git(root, "checkout", "-q", "main")
    shas["main2"] = commit("main2", "Tidy the scheduler (#3)\n\nquoting (#38935) in the body")
    git(root, "merge", "-q", "--no-ff", "-m", "Merge branch side", "side")
    shas["merge"] = git(root, "rev-parse", "HEAD")
    shas["tip"] = commit("tip", "Bump version (#4)  ")
    return root, shas


def test_main_commits_are_the_first_parent_history_by_the_pr_their_subject_ends_with(
    upstream: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    root, shas = upstream
    mirror = Mirror(str(root), cache=tmp_path / "cache")
    tip = mirror.branch("main")
    assert tip == shas["tip"]
    by_pr = main_commits(mirror, tip)
    assert by_pr == {
        4: [MainCommit(shas["tip"], (shas["merge"],), "Bump version (#4)")],
        3: [MainCommit(shas["main2"], (shas["fix"],), "Tidy the scheduler (#3)")],
        38935: [MainCommit(shas["fix"], (shas["release"],), "Fix the prefill door (#38935)")],
    }  # the side branch's (#2) is not on main's first-parent line; the subject's trailing spaces are git's


def test_a_lock_resolves_the_matrix_against_the_branch_tip(
    upstream: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    root, shas = upstream
    matrix_path = tmp_path / "upstream.toml"
    matrix_path.write_text(
        RELEASES
        + "".join(
            f'\n[[fixes]]\nid = "{pr}"\npr = {pr}\ntitle = "t"\nbase = {{ release = "0.5.20" }}\n'
            'head = { release = "0.5.21" }\n'
            for pr in (38935, 2)
        )
    )
    matrix = load_matrix(matrix_path)
    lock = resolve_lock(matrix, Mirror(str(root), cache=tmp_path / "cache"))
    assert (lock.repo, lock.branch, lock.branch_tip) == (str(root), "main", shas["tip"])
    assert (lock.matrix, lock.matrix_sha256, lock.schema) == ("upstream.toml", matrix.sha256, 1)
    assert len(lock.resolved_at) == 20 and lock.resolved_at.endswith("Z") and lock.resolved_at[10] == "T"
    assert lock.entries["38935"] == LockEntry(
        "38935", 38935, "resolved", base=shas["release"], head=shas["fix"], subject="Fix the prefill door (#38935)"
    )
    assert lock.entries["2"] == LockEntry(
        "2", 2, "unresolved", reason="no first-parent commit on main has a subject ending with (#2)"
    )
    assert not lock.complete
    lock.entries.pop("2")
    assert lock.complete


def sample() -> LockFile:
    entries = {
        "41404": LockEntry("41404", 41404, "unresolved", reason="no first-parent commit"),
        "38935": LockEntry("38935", 38935, "resolved", B, A, "Fix (#38935)", checks=[ShaCheck("head", A[:8], A, True)]),
    }
    return LockFile(
        "https://github.com/sgl-project/sglang.git",
        "main",
        A,
        "upstream.toml",
        "f" * 64,
        "2026-12-01T00:00:00Z",
        entries,
    )


def test_a_written_lock_reads_back_the_same_and_is_sorted_json(tmp_path: Path) -> None:
    path = tmp_path / "upstream.lock.json"
    write_lock(path, sample())
    text = path.read_text()
    assert text == json.dumps(sample().to_dict(), indent=2, sort_keys=True) + "\n"
    doc = json.loads(text)
    assert sorted(doc) == sorted(["schema", "repo", "branch", "branch_tip", "matrix", "matrix_sha256", "resolved_at",
        "entries"])  # fmt: skip
    assert list(doc["entries"]) == ["38935", "41404"] and doc["entries"]["38935"]["checks"][0]["ok"] is True
    assert read_lock(path) == sample()
    assert read_lock(tmp_path / "missing.json") is None
    assert [p.name for p in tmp_path.iterdir()] == ["upstream.lock.json"]  # nothing left beside it


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.update(schema=2), "expected schema 1, got 2"),
        (lambda d: d.pop("schema"), "expected schema 1, got None"),
        (lambda d: d["entries"]["38935"].update(status="guessed"), "entry '38935': unknown status 'guessed'"),
        (lambda d: d.pop("branch_tip"), "'branch_tip'"),
        (lambda d: d.pop("entries"), "'entries'"),
        (lambda d: d["entries"]["38935"].update(colour="red"), "colour"),
        (lambda d: d["entries"]["38935"]["checks"][0].pop("ok"), "ok"),
        (lambda d: d.update(entries=[]), "'list' object has no attribute 'items'"),
    ],
    ids=["schema", "no-schema", "status", "no-tip", "no-entries", "unknown-key", "check-field", "entries-list"],
)
def test_a_malformed_lock_is_refused_naming_the_file(tmp_path: Path, change, message: str) -> None:
    path = tmp_path / "upstream.lock.json"
    doc = sample().to_dict()
    change(doc)
    path.write_text(json.dumps(doc))
    with pytest.raises(ConfigError) as caught:
        read_lock(path)
    assert str(caught.value).startswith(f"{path}: malformed lock file: ") and message in str(caught.value)
    assert caught.value.__suppress_context__


def test_an_entry_without_checks_reads_with_none(tmp_path: Path) -> None:
    path = tmp_path / "upstream.lock.json"
    doc = sample().to_dict()
    del doc["entries"]["38935"]["checks"]
    path.write_text(json.dumps(doc))
    lock = read_lock(path)
    assert lock is not None and lock.entries["38935"].checks == [] and lock.entries["38935"].head == A


def test_a_lock_that_is_not_json_or_not_an_object_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "upstream.lock.json"
    path.write_text("{not json")
    with pytest.raises(ConfigError) as caught:
        read_lock(path)
    assert str(caught.value).startswith(f"{path}: cannot read lock file: ") and caught.value.__suppress_context__
    path.write_text("[1, 2]")
    with pytest.raises(ConfigError, match="malformed lock file"):
        read_lock(path)
    path.unlink()
    path.mkdir()  # a folder where the file should be: an OSError, named
    with pytest.raises(ConfigError, match="cannot read lock file"):
        read_lock(path)
