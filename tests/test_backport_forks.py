"""``difflab backport`` on three forks built from the real release trees, with #38935's real probes.

- a fork of 0.5.20 with #38935 cherry-picked: ``present`` (no fix commit, but a patch-equivalent one);
- 0.5.21 with the prefill-door guard reverted: ``partial`` (prefill door like base, decode door like head);
- 0.5.20 code whose version string says 0.5.21: ``absent`` (the version claims a fix the code lacks).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from junitparser import JUnitXml

from difflab.cli import main as cli
from test_git_support import ReleaseRepos, matrix_copy, release_repos
from upstream_fixtures import EXPECTED, FILES, write_tests

pytestmark = [pytest.mark.sglang, pytest.mark.xdist_group("git")]

PREFILL, DECODE = "pr38935_prefill_door", "pr38935_decode_door"


@pytest.fixture(scope="module")
def repos() -> ReleaseRepos:
    return release_repos()


@pytest.fixture(scope="module")
def checked(repos: ReleaseRepos, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[int, Path]]:
    """Each fork's ref checked once: exit code and results folder."""
    root = tmp_path_factory.mktemp("backport")
    matrix = matrix_copy(root / "matrix")
    elsewhere = write_tests(root / "sglang-tests")  # other copies of the fork's own test files: the fork's win
    for rel in FILES:
        (elsewhere / rel).write_text("# another copy\n" + FILES[rel])
    assert cli(["lock", "--matrix", str(matrix), "--repo", str(repos.upstream)]) == 1  # 41404 unresolved
    out: dict[str, tuple[int, Path]] = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DIFFLAB_CONFIG", str(root / "config"))  # a throwaway signing key for the bundle
        for name in ("cherry", "revert", "version"):
            folder = root / name
            args = [
                "backport",
                "--repo",
                str(repos.fork),
                "--ref",
                repos.fork_refs[name],
                "--fix",
                "38935",
                "--matrix",
                str(matrix),
                "--upstream",
                str(repos.upstream),
                "--out",
                str(folder),
            ]
            if name != "cherry":
                args.append("--no-bundle")
            else:
                args += ["--upstream-tests", str(elsewhere)]
            out[name] = (cli(args), folder)
    return out


def _fix(folder: Path) -> dict[str, Any]:
    doc = json.loads((folder / "backport.json").read_text())
    assert [f["fix"] for f in doc["fixes"]] == [38935]
    return doc["fixes"][0]


def test_cherry_pick_onto_an_older_release_is_present(
    checked: dict[str, tuple[int, Path]], repos: ReleaseRepos
) -> None:
    rc, folder = checked["cherry"]
    fix = _fix(folder)
    assert rc == 0
    assert fix["verdict"] == "present" and sorted(fix["head_like"]) == [DECODE, PREFILL]
    ev = fix["evidence"]
    assert ev["fix_commit"] == repos.commits["0.5.21"] and ev["fix_base"] == repos.commits["0.5.20"]
    assert ev["ancestor"] is False
    assert ev["patch_equivalent"] is True and ev["equivalent_commits"] == [repos.fork_commits["cherry"]]
    assert ev["reverting_commits"] == [] and ev["scanned_commits"] >= 1
    assert fix["disagreements"] == []  # a cherry-pick is not a re-implementation
    doc = json.loads((folder / "backport.json").read_text())
    assert doc["passed"] is True and doc["fork"]["commit"] == repos.fork_commits["cherry"]
    assert doc["fork"]["ref"] == "acme/cherry" and len(doc["fork"]["tree"]) == 40
    for probe in (PREFILL, DECODE):
        assert (folder / "observations" / "38935" / "fork" / f"{probe}.json").is_file()
    suite = next(iter(JUnitXml.fromfile(str(folder / "junit.xml"))))
    assert suite.tests == 2 and suite.failures == 0 and suite.errors == 0
    assert "✅ present" in (folder / "summary.md").read_text()
    run = json.loads((folder / "run.json").read_text())
    assert run["command"] == "backport" and run["sources"]["fork"]["commit"] == repos.fork_commits["cherry"]
    tests = fix["upstream_tests"]
    assert tests["text"] == "probe: present; SGLang's tests: 8 passed (the fix's own: 3 passed) — they agree"
    (replay,) = json.loads((folder / "upstream-tests.json").read_text())["fixes"]
    fork = repos.fork_commits["cherry"][:12]
    assert {f["from"] for f in replay["files"]} == {f"fork {fork}'s own test/ tree"}
    assert {f["file"]: f["sha256"] for f in replay["files"]} == {
        rel: hashlib.sha256(text.encode()).hexdigest() for rel, text in FILES.items()
    }
    assert {t["id"]: t["outcomes"]["fork"]["outcome"] for t in replay["tests"]} == {
        tid: head for tid, (_, head, _) in EXPECTED.items()
    }
    try:
        import difflab.bundle  # noqa: F401
    except ImportError:
        return
    assert (folder / "SHA256SUMS").is_file(), "bundle-able like a run: sealed unless --no-bundle"


def test_fork_that_reverts_the_prefill_door_is_partial(
    checked: dict[str, tuple[int, Path]], repos: ReleaseRepos
) -> None:
    rc, folder = checked["revert"]
    fix = _fix(folder)
    assert rc == 1
    assert fix["verdict"] == "partial"
    assert fix["base_like"] == [PREFILL] and fix["head_like"] == [DECODE]
    # the reason names the paths: the door the fork reverted, and the one it kept
    assert "like base: prefill-door" in fix["reason"] and "decode-door" in fix["reason"].split("like base")[0]
    # each path on every back end the doors run on (`<hunk>@<backend>`): what it behaved like
    paths: dict[str, set[str]] = {}
    for p in fix["paths"]:
        paths.setdefault(p["hunk"].split("@")[0], set()).add(p["like"])
    assert paths["prefill-door"] == {"base"} and paths["decode-door"] == {"head"}
    # the retirement behind the doors is still there: judged by the door that reaches it
    assert paths["retire-cache-finish"] == {"head"} and paths["unadmitted-predicate"] == {"head"}
    assert all("@" in p["hunk"] for p in fix["paths"])  # named per back end
    assert fix["evidence"]["ancestor"] is True, "the fix commit is in its history; the behaviour is not"
    assert fix["evidence"]["reverting_commits"] == []  # one door reverted by hand: no commit inverts the whole fix
    assert (
        f"the fix commit {repos.commits['0.5.21']} is in the history, but the behaviour is partial: "
        "reverted or changed later?"
    ) in fix["disagreements"]
    prefill = next(p for p in fix["probes"] if p["probe"] == PREFILL)
    expects = {c["field"]: c["like"] for c in prefill["fields"] if c["kind"] == "expect"}
    assert {expects[f"{b}:rejected.enqueued"] for b in ("mooncake", "nixl", "mori")} == {"base"}
    assert all(c["like"] == "ok" for c in prefill["fields"] if c["kind"] == "control")
    suite = next(iter(JUnitXml.fromfile(str(folder / "junit.xml"))))
    assert suite.tests == 2 and suite.failures == 1
    assert not (folder / "SHA256SUMS").exists()


def test_version_string_claiming_the_fix_is_absent(checked: dict[str, tuple[int, Path]], repos: ReleaseRepos) -> None:
    rc, folder = checked["version"]
    fix = _fix(folder)
    assert rc == 1
    assert fix["verdict"] == "absent" and sorted(fix["base_like"]) == [DECODE, PREFILL]
    ev = fix["evidence"]
    assert ev["version"] == "0.5.21" and ev["first_release_with_fix"] == "0.5.21"
    assert ev["version_claims_fix"] is True
    assert ev["ancestor"] is False and ev["patch_equivalent"] is False and ev["equivalent_commits"] == []
    assert [d for d in fix["disagreements"] if "version string" in d] == [
        "the version string 0.5.21 claims release 0.5.21 (which carries the fix), but the behaviour is absent"
    ]
    assert not any("re-implemented" in d for d in fix["disagreements"])


def test_the_family_answer_and_the_forks_switch_defaults_sit_beside_the_verdict(
    checked: dict[str, tuple[int, Path]], repos: ReleaseRepos
) -> None:
    """Only #38935 was checked on the fork: its family is not declared safe (the rest unknown).

    Beside it, the switches the fork's own tree declares.
    """
    _, folder = checked["cherry"]
    doc = json.loads((folder / "family.json").read_text())
    (family,) = doc["families"]
    (build,) = family["builds"]
    assert build["build"] == f"fork {repos.fork_commits['cherry'][:12]}"
    standing = {m["fix"]: m["standing"] for m in build["members"]}
    assert standing.pop("38935") == "covered" and set(standing.values()) == {"unknown"}
    assert not build["safe"] and build["line"].startswith("NOT safe: unknown: ")
    defaults = {d["key"]: d for d in doc["defaults"][build["build"]]}
    # the cherry-picked commit is 0.5.20 -> 0.5.21 whole: the fork's tree declares 0.5.21's switches
    assert defaults["deferred-release"]["value"] is True and defaults["deferred-release"]["protects"]
    assert defaults["deferred-release"]["where"].startswith("sglang/srt/environ.py:")
    assert defaults["transfer-batch"]["value"] == 0 and not defaults["transfer-batch"]["protects"]
    assert defaults["kv-checksum"]["value"] is False and defaults["kv-checksum"]["found"]
    summary = (folder / "summary.md").read_text()
    assert "## Family `kv-safety`" in summary and "defaults to True (sglang/srt/environ.py:" in summary
    _, version = checked["version"]  # the plain 0.5.20 tree with a version string that claims the fix
    older = json.loads((version / "family.json").read_text())["defaults"]
    (found,) = older.values()
    assert {d["key"]: d["value"] for d in found}["deferred-release"] is False  # 0.5.20's default: off
    assert "family.json" in (folder / "SHA256SUMS").read_text()  # sealed with the run
