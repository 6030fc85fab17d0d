"""Whole workflows (``run``, ``observe``, ``merge``, ``selfcheck``, ``run --selfcheck``, ``run --throughput``,
``backport``) on fixes that do NOT agree.

Each command runs through :func:`difflab.cli.main` with the lab's real runner (``--backend subprocess``) on
the tiny git repository of :mod:`workflow_tree`, so a run takes well under a second and these tests can
sit in the mutation pass. The matrices mix a confirmed fix with a not-fixed one, a causal mutation with
a stale one and a fix that declares none: an exit code or a ``passed`` flag that asked "any" where it
must ask "all", or that let one step's result replace another's, would pass on uniform runs and fails
here. What a run decides is read back from its files (diff.json, selfcheck.json, run.json).

The last sections read what each step of ``run`` is handed: the ``--timeout``, the gate's factor, the
reporter, the lock beside the matrix, the environment (made only once the sources are there), and a release
run's upstream tests, which come only from ``--upstream-tests``.
"""

from __future__ import annotations

import io
import json
import os
import re
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from rich.console import Console

from difflab import stats
from difflab.cli import main
from difflab.diff.throughput import Scaling, ThroughputResult
from difflab.environment.shared import SharedEnvironment
from difflab.errors import ConfigError
from difflab.paths import default_results
from difflab.progress import Reporter
from difflab.runner import sandbox
from difflab.stats.paired import PairedGate, compare_paired
from difflab.workflows import backport as backport_workflow
from difflab.workflows import merge as merge_workflow
from difflab.workflows import run as run_workflow
from difflab.workflows import selfcheck as selfcheck_workflow
from difflab.workflows.throughput import ThroughputOptions
from workflow_tree import (
    BASE_DOOR,
    DOOR_TESTS_FILE,
    DROP_GUARD,
    HANGS,
    HEAD_DOOR,
    MOVES_CONTROL,
    REWORDS_BASE,
    STALE,
    TinyRepo,
    fix_entry,
    matrix_text,
    release_table,
    tiny_repo,
    with_throughput,
    with_upstream_tests,
    write_door_tests,
    write_probes,
)

FAST = ["--backend", "subprocess", "--no-cache"]


@pytest.fixture(scope="module")
def repo() -> TinyRepo:
    return tiny_repo()


@pytest.fixture(autouse=True)
def tiny_probes(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DIFFLAB_PROBES", str(write_probes(tmp_path_factory.getbasetemp() / "tiny-probes")))


def matrix(tmp_path: Path, *entries: str) -> Path:
    path = tmp_path / "matrix" / "upstream.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(matrix_text(*entries))
    return path


def read(out: Path, name: str) -> dict:
    return json.loads((out / name).read_text())


def git_run(repo: TinyRepo, matrix_path: Path, out: Path, *extra: str, command: str = "run") -> int:
    argv = [command, "--source", "git", "--repo", str(repo.path), "--matrix", str(matrix_path), "--out", str(out)]
    sealed = [] if command == "observe" else ["--no-bundle"]  # a cell's folder is merged, never sealed
    return main([*argv, *FAST, *sealed, *extra])


def run_request(repo: TinyRepo, matrix_path: Path, out: Path, **kw: Any) -> run_workflow.RunRequest:
    fields = {"runner": "subprocess", "use_cache": False, "bundle": False, "source_kind": "git", "repo": str(repo.path)}
    return run_workflow.RunRequest(matrix=matrix_path, out=out, **(fields | kw))


def said_to(text: io.StringIO) -> Reporter:
    return Reporter(Console(file=text, width=400))


def backport_request(
    repo: TinyRepo, matrix_path: Path, out: Path, ref: str = "fork", **kw: Any
) -> backport_workflow.BackportRequest:
    fields = {"runner": "subprocess", "use_cache": False, "bundle": False, "upstream": str(repo.path)}
    return backport_workflow.BackportRequest(matrix=matrix_path, out=out, repo=str(repo.path), ref=ref, **(fields | kw))


def confirmed(repo: TinyRepo, fix_id: str = "1", mutations: str = DROP_GUARD) -> str:
    return fix_entry(fix_id, repo.commits["base"], repo.commits["head"], mutations=mutations)


def not_fixed(repo: TinyRepo, fix_id: str = "2", mutations: str = "") -> str:
    """Head pinned to the base commit: a real head that still shows the bug."""
    return fix_entry(fix_id, repo.commits["base"], repo.commits["base"], mutations=mutations)


def headless(repo: TinyRepo) -> str:
    """Fix 3: its head unavailable (no release carries it yet), so nothing to judge it by or revert."""
    return confirmed(repo, "3").replace(
        'head = { release = "0.5.21" }', 'head = { unavailable = "no release carries it" }'
    )


# -- run: the verdicts' exit code and passed flags ---------------------------------------------------------
def test_a_run_whose_every_fix_is_confirmed_exits_zero_with_its_details(repo: TinyRepo, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert git_run(repo, matrix(tmp_path, confirmed(repo)), out) == 0
    diff = read(out, "diff.json")
    assert [(f["id"], f["verdict"], f["passed"]) for f in diff["fixes"]] == [("1", "confirmed", True)]
    assert diff["passed"] is True
    record = read(out, "run.json")
    assert record["exit_code"] == 0 and record["command"] == "run"
    assert record["sides"] == ["base", "head"] and record["source_kind"] == "git"
    assert record["repo"] == str(repo.path) and record["runner"]["name"] == "subprocess"
    labels = {repo.commits["base"][:12], repo.commits["head"][:12]}
    assert set(record["sources"]) == labels
    assert {s["commit"] for s in record["sources"].values()} == {repo.commits["base"], repo.commits["head"]}
    assert record["environment_digest"] and record["probes"]
    assert record["undeclared_fields"] == {"1/tiny_door": ["door.note"]}
    # a git run replays the fixes' own upstream tests; this tree has none
    assert record["upstream_tests"] == {"dir": None, "files": {}}


def test_a_not_fixed_fix_fails_the_run_beside_a_confirmed_one(repo: TinyRepo, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert git_run(repo, matrix(tmp_path, confirmed(repo), not_fixed(repo)), out) == 1
    diff = read(out, "diff.json")
    verdicts = {f["id"]: (f["verdict"], f["passed"]) for f in diff["fixes"]}
    assert verdicts == {"1": ("confirmed", True), "2": ("not-fixed", False)}
    assert diff["passed"] is False  # every fix must pass, not any
    assert read(out, "run.json")["exit_code"] == 1


def test_observe_exits_zero_when_every_probe_ran_and_writes_no_verdicts(repo: TinyRepo, tmp_path: Path) -> None:
    out = tmp_path / "cell"
    assert git_run(repo, matrix(tmp_path, confirmed(repo)), out, "--side", "head", command="observe") == 0
    assert (out / "observations" / "1" / "head" / "tiny_door.log").is_file()
    seen = read(out, "observations/1/head/tiny_door.json")
    assert seen["status"] == "ok" and seen["fields"]["rejected.admitted"] is False
    assert not (out / "observations" / "1" / "base").exists()
    assert not (out / "diff.json").exists()
    record = read(out, "run.json")
    assert (record["command"], record["sides"], record["exit_code"]) == ("observe", ["head"], 0)
    assert "upstream_tests" not in record  # one side: nothing to replay against


def test_observe_exits_non_zero_when_one_probe_errored_and_the_other_ran(repo: TinyRepo, tmp_path: Path) -> None:
    broken = fix_entry("2", repo.commits["base"], repo.commits["head"], probe="tiny_broken")
    out = tmp_path / "cell"
    code = git_run(repo, matrix(tmp_path, confirmed(repo), broken), out, "--side", "head", command="observe")
    status = {p.parent.parent.name: read(p.parent, p.name)["status"] for p in (out / "observations").rglob("*.json")}
    assert status == {"1": "ok", "2": "error"}
    assert code == 1 and read(out, "run.json")["exit_code"] == 1


def test_an_unavailable_side_is_judged_and_left_out_of_the_sources(repo: TinyRepo, tmp_path: Path) -> None:
    head = repo.commits["head"]
    gone = (
        fix_entry("2", repo.commits["base"], repo.commits["head"], pinned=False)
        .replace('base = { release = "0.5.20" }', 'base = { unavailable = "no release before it was pinned" }')
        .replace(
            'head = { release = "0.5.21" }',
            f'head = {{ release = "0.5.21" }}\ncommits = {{ head = {{ sha = "{head}", confirmed = true }} }}',
        )
    )
    text = io.StringIO()
    req = run_request(repo, matrix(tmp_path, confirmed(repo), gone), tmp_path / "out")
    outcome = run_workflow.execute(req, said_to(text))
    assert "2 base tiny_door" not in text.getvalue()  # unavailable is a verdict's input, not a probe error
    verdicts = {v.id: (v.verdict, v.passed) for v in outcome.verdicts}
    assert verdicts == {"1": ("confirmed", True), "2": (verdicts["2"][0], True)} and outcome.exit_code == 0
    assert verdicts["2"][0] != "confirmed"  # a head alone is judged against the matrix's declared base
    assert set(read(outcome.out_dir, "run.json")["sources"]) == {repo.commits["base"][:12], repo.commits["head"][:12]}


def test_a_run_replays_the_fixes_own_tests_and_says_whether_they_agree(repo: TinyRepo, tmp_path: Path) -> None:
    entry = with_upstream_tests(confirmed(repo), "test_a_rejected_request_is_refused")
    folder = write_door_tests(tmp_path / "sglang-tests")
    text = io.StringIO()
    req = run_request(repo, matrix(tmp_path, entry, not_fixed(repo)), tmp_path / "out", upstream_tests=folder)
    outcome = run_workflow.execute(req, said_to(text))
    assert outcome.exit_code == 1  # fix 2 is not fixed; its tests (none declared) change nothing
    fixes = {f["id"]: f for f in read(outcome.out_dir, "diff.json")["fixes"]}
    agreement = fixes["1"]["upstream_tests"]
    assert agreement["agrees"] is True and "the fix's own: 1 fixed" in agreement["text"]
    assert fixes["1"]["verdict"] == "confirmed" and "disagree" not in fixes["1"]["reason"]
    assert fixes["2"]["verdict"] == "not-fixed"
    record = read(outcome.out_dir, "run.json")
    assert record["upstream_tests"]["dir"] == str(folder) and list(record["upstream_tests"]["files"]) == [
        DOOR_TESTS_FILE
    ]
    assert read(outcome.out_dir, "upstream-tests.json")["tests_dir"] == str(folder)
    assert "## SGLang's own tests" in (outcome.out_dir / "summary.md").read_text()
    said = text.getvalue()
    assert f"upstream tests #1: {agreement['text']}" in said and "upstream tests #2" not in said  # it declares none


def test_a_run_flags_a_verdict_the_fixes_own_tests_contradict(repo: TinyRepo, tmp_path: Path) -> None:
    """The valid request's test passes on the base too: it cannot tell the bug from the fix, so they disagree."""
    entry = with_upstream_tests(confirmed(repo), "test_a_valid_request_is_admitted")
    folder = write_door_tests(tmp_path / "sglang-tests")
    out = tmp_path / "out"
    code = git_run(repo, matrix(tmp_path, entry), out, "--upstream-tests", str(folder))
    (fix,) = read(out, "diff.json")["fixes"]
    assert fix["upstream_tests"]["agrees"] is False and "disagree" in fix["reason"]
    assert code == read(out, "run.json")["exit_code"]


def test_observe_ignores_the_upstream_tests_of_a_single_side(repo: TinyRepo, tmp_path: Path) -> None:
    """One side has nothing to replay against: a missing folder is not even looked at."""
    req = run_workflow.RunRequest(
        matrix=matrix(tmp_path, confirmed(repo)),
        out=tmp_path / "cell",
        sides=("head",),
        runner="subprocess",
        use_cache=False,
        source_kind="git",
        repo=str(repo.path),
        upstream_tests=tmp_path / "no-such-tests",
    )
    outcome = run_workflow.execute(req)
    assert outcome.exit_code == 0 and outcome.verdicts == []
    assert "upstream_tests" not in read(outcome.out_dir, "run.json")
    assert not (outcome.out_dir / "upstream-tests.json").exists()


# -- merge: the observe cells judged together, on a machine without the probes ---------------------------------
def observe_cells(repo: TinyRepo, tmp_path: Path, *entries: str) -> Path:
    """One ``observe`` folder per side under ``cells/``, each with the matrix it ran (as CI's cells leave them)."""
    path = matrix(tmp_path, *entries)
    for side in ("base", "head"):
        assert git_run(repo, path, tmp_path / "cells" / side, "--side", side, command="observe") == 0
    return tmp_path / "cells"


def test_merge_judges_the_cells_without_the_probe_files_and_fails_on_one_unfixed_fix(
    repo: TinyRepo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The merge job reads observations only: the cells' probes (``$DIFFLAB_PROBES``) are not where it runs."""
    cells = observe_cells(repo, tmp_path, confirmed(repo), not_fixed(repo))
    monkeypatch.delenv("DIFFLAB_PROBES")
    out = tmp_path / "merged"
    assert main(["merge", str(cells), "--out", str(out), "--no-bundle"]) == 1
    diff = read(out, "diff.json")
    fixes = {f["id"]: f for f in diff["fixes"]}
    assert {k: (f["verdict"], f["passed"]) for k, f in fixes.items()} == {
        "1": ("confirmed", True),
        "2": ("not-fixed", False),
    }
    assert diff["passed"] is False
    base, head = repo.commits["base"], repo.commits["head"]
    assert (fixes["1"]["base"]["label"], fixes["1"]["head"]["label"]) == (base[:12], head[:12])
    assert (fixes["1"]["base"]["commit"], fixes["1"]["head"]["commit"]) == (base, head)
    assert (fixes["2"]["base"]["label"], fixes["2"]["head"]["label"]) == (base[:12], base[:12])
    record = read(out, "run.json")
    assert (record["command"], record["exit_code"], record["fixes"]) == ("merge", 1, ["1", "2"])
    assert record["inputs"] == [str(cells)]
    assert {label: s["commit"] for label, s in record["sources"].items()} == {base[:12]: base, head[:12]: head}
    for fix in ("1", "2"):
        for side in ("base", "head"):
            merged = read(out, f"observations/{fix}/{side}/tiny_door.json")
            assert merged == read(cells / side, f"observations/{fix}/{side}/tiny_door.json")
    assert (out / "matrix.toml").read_bytes() == (cells / "base" / "matrix.toml").read_bytes()


def test_merge_of_confirmed_cells_exits_zero_and_returns_where_it_wrote(repo: TinyRepo, tmp_path: Path) -> None:
    cells = observe_cells(repo, tmp_path, confirmed(repo))
    req = merge_workflow.MergeRequest(folders=[cells / "base", cells / "head"], out=tmp_path / "merged", bundle=False)
    outcome = merge_workflow.execute(req)
    assert outcome.exit_code == 0 and outcome.out_dir == tmp_path / "merged"
    assert [(v.id, v.verdict, v.passed) for v in outcome.verdicts] == [("1", "confirmed", True)]
    record = read(outcome.out_dir, "run.json")
    assert record["exit_code"] == 0 and record["inputs"] == [str(cells / "base"), str(cells / "head")]
    assert read(outcome.out_dir, "diff.json")["passed"] is True


# -- run --selfcheck: the self-check's exit code joins the verdicts' --------------------------------------------
def test_run_selfcheck_passes_when_the_verdicts_and_every_mutation_pass(repo: TinyRepo, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert git_run(repo, matrix(tmp_path, confirmed(repo)), out, "--selfcheck") == 0
    check = read(out, "selfcheck.json")
    assert [(m["mutation"], m["outcome"]) for m in check["mutations"]] == [("drop-guard", "causal")]
    assert check["hunk_coverage"]["covered"] == check["hunk_coverage"]["hunks"] == 1 and check["passed"] is True
    assert read(out, "run.json")["exit_code"] == 0


def test_run_selfcheck_fails_on_a_fix_without_mutations_though_every_verdict_passed(
    repo: TinyRepo, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    assert git_run(repo, matrix(tmp_path, confirmed(repo, mutations="")), out, "--selfcheck") == 1
    assert read(out, "diff.json")["passed"] is True
    (row,) = read(out, "selfcheck.json")["mutations"]
    assert (row["fix"], row["outcome"], row["passed"]) == ("1", "error", False)
    assert read(out, "run.json")["exit_code"] == 1


def test_run_selfcheck_passing_does_not_hide_a_failed_verdict(repo: TinyRepo, tmp_path: Path) -> None:
    """Fix 2's head still has the bug: not-fixed. Its one mutation edits a docstring, so the mutated head shows
    the base behaviour the self-check asks for and the self-check passes; the run must still fail."""
    out = tmp_path / "out"
    entries = (confirmed(repo), not_fixed(repo, mutations=REWORDS_BASE))
    assert git_run(repo, matrix(tmp_path, *entries), out, "--selfcheck") == 1
    verdicts = {f["id"]: (f["verdict"], f["passed"]) for f in read(out, "diff.json")["fixes"]}
    assert verdicts == {"1": ("confirmed", True), "2": ("not-fixed", False)}
    check = read(out, "selfcheck.json")
    assert [(m["fix"], m["outcome"]) for m in check["mutations"]] == [("1", "causal"), ("2", "causal")]
    assert check["passed"] is True and read(out, "run.json")["exit_code"] == 1


def test_run_selfcheck_reverts_heads_only_and_ends_a_hanging_one_at_the_timeout(repo: TinyRepo, tmp_path: Path) -> None:
    """Fix 3 has no head: nothing of it is mutated (never its base). Fix 1's hanging mutation ends at ``--timeout``."""
    out = tmp_path / "out"
    entries = (confirmed(repo, mutations=DROP_GUARD + HANGS), headless(repo))
    assert git_run(repo, matrix(tmp_path, *entries), out, "--selfcheck", "--timeout", "1") == 1
    rows = {(m["fix"], m["mutation"]): m for m in read(out, "selfcheck.json")["mutations"]}
    assert rows[("1", "drop-guard")]["outcome"] == "causal"
    hung = rows[("1", "hang-at-door")]
    assert hung["outcome"] == "error" and "hung" in hung["reason"]
    assert not (out / "selfcheck" / "3").exists()
    assert all(m["head"] != repo.commits["base"][:12] for key, m in rows.items() if key[0] == "3")


# -- selfcheck: every mutation judged, in the matrix's order, and all of them must pass ---------------------------
def test_selfcheck_passes_on_one_causal_mutation_and_records_what_it_ran(repo: TinyRepo, tmp_path: Path) -> None:
    out = tmp_path / "check"
    assert git_run(repo, matrix(tmp_path, confirmed(repo)), out, command="selfcheck") == 0
    check = read(out, "selfcheck.json")
    assert check["passed"] is True and [m["outcome"] for m in check["mutations"]] == ["causal"]
    assert (out / "selfcheck" / "1" / "drop-guard" / "tiny_door.log").is_file()  # the mutated head's probe log
    record = read(out, "run.json")
    assert (record["command"], record["exit_code"]) == ("selfcheck", 0)
    assert record["source_kind"] == "git" and record["repo"] == str(repo.path)
    assert record["runner"]["name"] == "subprocess" and record["environment_digest"] and record["probes"]
    assert record["sources"] == {
        repo.commits["head"][:12]: {
            "kind": "git",
            "repo": str(repo.path),
            "commit": repo.commits["head"],
            "tree": record["sources"][repo.commits["head"][:12]]["tree"],
        }
    }


def test_selfcheck_orders_rows_by_fix_and_mutation_and_fails_on_any_bad_one(repo: TinyRepo, tmp_path: Path) -> None:
    """Stale and missing mutations are judged before anything runs; the files still list them in matrix order."""
    entries = (confirmed(repo, mutations=STALE + DROP_GUARD + MOVES_CONTROL), not_fixed(repo, "2"))
    out = tmp_path / "check"
    assert git_run(repo, matrix(tmp_path, *entries), out, command="selfcheck") == 1
    rows = [(m["fix"], m["mutation"], m["outcome"], m["passed"]) for m in read(out, "selfcheck.json")["mutations"]]
    assert rows == [
        ("1", "drop-guard", "causal", True),
        ("1", "refuse-everyone", "error", False),
        ("1", "unguard-stale", "mutation-stale", False),
        ("2", "(none)", "error", False),
    ]
    check = read(out, "selfcheck.json")
    assert check["passed"] is False and read(out, "run.json")["exit_code"] == 1
    by_name = {(m["fix"], m["mutation"]): m for m in check["mutations"]}
    head, stale_head = repo.commits["head"][:12], repo.commits["base"][:12]
    assert {m["head"] for key, m in by_name.items() if key[0] == "1"} == {head}
    assert by_name[("2", "(none)")]["head"] == stale_head
    assert by_name[("1", "unguard-stale")]["reason"] == f"fix 1, expected text not found in sglang/door.py of {head}"
    assert by_name[("2", "(none)")]["reason"] == "no reverting mutation declared for this fix in the matrix"


def test_selfcheck_leaves_out_a_fix_whose_head_is_unavailable_and_says_so(repo: TinyRepo, tmp_path: Path) -> None:
    gone = headless(repo)
    older = OLDER_THAN_EVERY_PIN
    text = io.StringIO()
    reporter = said_to(text)
    req = selfcheck_workflow.SelfcheckRequest(
        matrix=matrix(tmp_path, confirmed(repo), gone, older),
        out=tmp_path / "check",
        runner="subprocess",
        use_cache=False,
        bundle=False,
        source_kind="git",
        repo=str(repo.path),
    )
    outcome = selfcheck_workflow.execute(req, reporter)
    assert outcome.exit_code == 0 and outcome.passed
    assert [(r.fix, r.outcome) for r in outcome.results] == [("1", "causal")]
    said = text.getvalue()
    assert "3: head unavailable (no release carries it); nothing to revert" in said
    assert "4: base unavailable (older than every pinned release) and no probe; nothing to revert" in said
    assert said.count("nothing to revert") == 2  # fix 1 has a head to revert


OLDER_THAN_EVERY_PIN = """
[[fixes]]
id = "4"
pr = 4
title = "older than every pin"
base = { unavailable = "older than every pinned release" }
head = { release = "0.5.21" }
"""


def test_selfcheck_pins_the_head_from_the_lock_beside_its_matrix_and_writes_under_the_results(
    repo: TinyRepo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No ``--out``: ``results/selfcheck-<stamp>`` in the working folder; no commits in the matrix: the lock's."""
    path = matrix(tmp_path, fix_entry("1", "", "", mutations=DROP_GUARD, pinned=False))
    assert main(["lock", "--matrix", str(path), "--repo", str(repo.path)]) == 0
    monkeypatch.chdir(tmp_path)
    req = selfcheck_workflow.SelfcheckRequest(
        matrix=path, runner="subprocess", use_cache=False, bundle=False, source_kind="git", repo=str(repo.path)
    )
    outcome = selfcheck_workflow.execute(req)
    (folder,) = (tmp_path / "results").iterdir()
    assert re.fullmatch(r"selfcheck-\d{8}T\d{6}Z", folder.name) and outcome.out_dir == folder
    assert outcome.exit_code == 0 and [(c.fix, c.hunks, c.covered) for c in outcome.coverage] == [
        ("1", ["door-guard"], ["door-guard"])
    ]
    check = read(folder, "selfcheck.json")
    assert check["hunk_coverage"]["fixes"] == [c.to_dict() for c in outcome.coverage]
    assert (folder / "environment.json").is_file()
    assert {m["head"] for m in check["mutations"]} == {repo.commits["head"][:12]}


def test_selfcheck_ends_a_mutated_head_that_hangs_at_its_timeout(repo: TinyRepo, tmp_path: Path) -> None:
    """``--timeout`` reaches the mutated heads' probes: a mutation that hangs is an error, never a wait."""
    out = tmp_path / "check"
    entry = confirmed(repo, mutations=DROP_GUARD + HANGS)
    assert git_run(repo, matrix(tmp_path, entry), out, "--timeout", "1", command="selfcheck") == 1
    rows = {m["mutation"]: m for m in read(out, "selfcheck.json")["mutations"]}
    assert rows["drop-guard"]["outcome"] == "causal"
    assert rows["hang-at-door"]["outcome"] == "error" and "hung" in rows["hang-at-door"]["reason"]


# -- run --throughput: the A/B's result joins the verdicts' exit code ---------------------------------------------
QUICK_AB = {"rounds": 3, "sizes": (10, 40), "min_items": 5, "min_runs": 2, "max_items": 50}
"""Three pairs of rounds: too few for any difference to be significant, so no ratio can fail the gate."""
BARE_HUB = {"hub_preload": (), "server_preload": (), "learn": False}
"""The warm back end without SGLang's imports (the tiny tree has none): a hub starts in well under a second."""


def throughput_run(repo: TinyRepo, tmp_path: Path, *entries: str, fail_above: float | None = None):
    options = ThroughputOptions(**QUICK_AB, fail_above=fail_above)
    path = matrix(tmp_path, *entries)
    req = run_request(repo, path, tmp_path / "out", runner="warm", runner_options=BARE_HUB, throughput=options)
    return run_workflow.execute(req), options


def test_run_throughput_error_fails_the_run_though_every_verdict_passed(repo: TinyRepo, tmp_path: Path) -> None:
    """Fix 2's benchmark raises on every run: an error, so exit 1 beside confirmed verdicts and fix 1's ratio."""
    entries = (with_throughput(confirmed(repo)), with_throughput(confirmed(repo, "2"), "tiny_broken_bench"))
    started = time.monotonic()
    outcome, options = throughput_run(repo, tmp_path, *entries, fail_above=1.5)
    elapsed = time.monotonic() - started
    assert [(r.fix, r.status) for r in outcome.throughput] == [("1", "ok"), ("2", "error")]
    assert "the door is gone" in outcome.throughput[1].reason
    assert outcome.exit_code == 1 and [(v.id, v.passed) for v in outcome.verdicts] == [("1", True), ("2", True)]
    out = outcome.out_dir
    diff = read(out, "diff.json")
    assert diff["passed"] is True and [t["status"] for t in (f["throughput"] for f in diff["fixes"])] == ["ok", "error"]
    record = read(out, "run.json")
    assert record["exit_code"] == 1 and record["throughput"] == options.record()
    assert record["throughput"]["fail_above"] == 1.5
    wall = record["throughput_wall_s"]
    assert isinstance(wall, float) and 0 <= wall <= elapsed  # the A/B's own time, within the run's
    # the run's own details beside the A/B's
    assert record["sides"] == ["base", "head"] and record["runner"]["name"] == "warm" and record["probes"]
    summary = (out / "summary.md").read_text()
    assert "## Throughput (CPU hot paths)" in summary and "fails beyond ×1.5" in summary


def test_run_throughput_that_measured_every_fix_keeps_the_verdicts_exit_code(repo: TinyRepo, tmp_path: Path) -> None:
    """Informational A/B (no factor): exit 0 when the verdicts pass, and still 1 when one does not."""
    outcome, options = throughput_run(repo, tmp_path / "one", with_throughput(confirmed(repo)))
    assert outcome.exit_code == 0 and [(r.fix, r.status) for r in outcome.throughput] == [("1", "ok")]
    record = read(outcome.out_dir, "run.json")
    assert record["exit_code"] == 0 and record["throughput"] == options.record()
    assert record["throughput"]["fail_above"] is None
    assert "informational" in (outcome.out_dir / "summary.md").read_text()
    entries = (with_throughput(confirmed(repo)), with_throughput(not_fixed(repo)))
    outcome, _ = throughput_run(repo, tmp_path / "two", *entries)
    assert [(r.fix, r.status) for r in outcome.throughput] == [("1", "ok"), ("2", "ok")]
    assert outcome.exit_code == 1 and read(outcome.out_dir, "run.json")["exit_code"] == 1


# -- requests refused before anything runs ---------------------------------------------------------------------
@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"sides": ()}, "--side must be base or head, got ()"),
        ({"sides": ("base", "fork")}, "--side must be base or head, got ('base', 'fork')"),
        (
            {"sides": ("head",), "throughput": ThroughputOptions()},
            "--throughput compares base with head: it needs both sides",
        ),
        (
            {"runner": "subprocess", "throughput": ThroughputOptions()},
            "--throughput runs on the warm back end (two forked processes driven round by round); "
            "--backend subprocess cannot interleave rounds",
        ),
        (
            {"runner": "docker", "upstream_tests": None},
            "--upstream-tests runs in the local shared environment; not with --backend docker",
        ),
    ],
)
def test_a_run_that_cannot_run_is_refused_before_it_starts(
    repo: TinyRepo, tmp_path: Path, changes: dict, message: str
) -> None:
    if "upstream_tests" in changes:  # a folder laid out like SGLang's repository
        (tmp_path / "sglang-tests" / "test").mkdir(parents=True)
        changes = {**changes, "upstream_tests": tmp_path / "sglang-tests"}
    req = run_workflow.RunRequest(matrix=matrix(tmp_path, confirmed(repo)), out=tmp_path / "out", **changes)
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
        run_workflow.execute(req)
    assert not (tmp_path / "out").exists()


def test_a_throughput_run_without_the_stats_extra_is_refused_naming_the_flag(
    repo: TinyRepo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(stats, "missing", lambda: ["scipy"])
    req = run_workflow.RunRequest(
        matrix=matrix(tmp_path, confirmed(repo)), out=tmp_path / "out", runner="warm", throughput=ThroughputOptions()
    )
    with pytest.raises(ConfigError, match=r"^--throughput needs scipy \(the \[stats\] extra\): "):
        run_workflow.execute(req)
    assert not (tmp_path / "out").exists()


def test_a_run_without_out_goes_to_a_stamped_folder_under_the_results() -> None:
    out = run_workflow.default_out()
    assert out.parent == default_results() and re.fullmatch(r"\d{8}T\d{6}Z", out.name)


# -- backport: every fix on the fork must be present ---------------------------------------------------------------
def backport(repo: TinyRepo, matrix_path: Path, out: Path, ref: str, *extra: str) -> int:
    argv = ["backport", "--repo", str(repo.path), "--ref", ref, "--upstream", str(repo.path)]
    return main([*argv, "--matrix", str(matrix_path), "--out", str(out), *FAST, "--no-bundle", *extra])


def test_backport_of_the_forks_own_port_is_present_and_exits_zero(repo: TinyRepo, tmp_path: Path) -> None:
    out = tmp_path / "fork"
    assert backport(repo, matrix(tmp_path, confirmed(repo)), out, "fork") == 0
    document = read(out, "backport.json")
    (verdict,) = document["fixes"]
    assert (verdict["id"], verdict["verdict"], verdict["passed"]) == ("1", "present", True)
    evidence = verdict["evidence"]
    assert evidence["fix_commit"] == repo.commits["head"] and evidence["ancestor"] is False
    assert (evidence["upstream_repo"], evidence["version"]) == (str(repo.path), "0.0.0")  # what sglang imported as
    assert verdict["disagreements"] == [
        "the behaviour is present without the fix commit or a patch-equivalent commit "
        "(re-implemented, squashed with other changes, or conflict-resolved)"
    ]
    record = read(out, "run.json")
    assert (record["command"], record["exit_code"], record["sides"]) == ("backport", 0, ["fork"])
    assert record["ref"] == "fork" and record["source_kind"] == "git" and record["repo"] == str(repo.path)
    assert record["sources"]["fork"]["commit"] == repo.commits["fork"]
    assert record["runner"]["name"] == "subprocess" and record["environment_digest"] and record["probes"]


def test_backport_fails_when_one_fix_is_absent_beside_a_present_one(repo: TinyRepo, tmp_path: Path) -> None:
    """On the fork, fix 1 is present; fix 2's probe cannot run there: one failed fix fails the check."""
    broken = fix_entry("2", repo.commits["base"], repo.commits["head"], probe="tiny_broken")
    out = tmp_path / "fork"
    assert backport(repo, matrix(tmp_path, confirmed(repo), broken), out, "fork") == 1
    verdicts = {v["id"]: (v["verdict"], v["passed"]) for v in read(out, "backport.json")["fixes"]}
    assert verdicts["1"] == ("present", True) and verdicts["2"][1] is False
    assert read(out, "run.json")["exit_code"] == 1


def test_backport_of_the_unfixed_base_is_absent_and_exits_one(repo: TinyRepo, tmp_path: Path) -> None:
    out = tmp_path / "base"
    assert backport(repo, matrix(tmp_path, confirmed(repo)), out, repo.commits["base"]) == 1
    (verdict,) = read(out, "backport.json")["fixes"]
    assert (verdict["verdict"], verdict["passed"]) == ("absent", False)


def test_backport_replays_the_fixes_own_tests_beside_an_agreeing_verdict(repo: TinyRepo, tmp_path: Path) -> None:
    entry = with_upstream_tests(confirmed(repo), "test_a_rejected_request_is_refused")
    folder = write_door_tests(tmp_path / "sglang-tests")
    out = tmp_path / "fork"
    assert backport(repo, matrix(tmp_path, entry), out, "fork", "--upstream-tests", str(folder)) == 0
    (verdict,) = read(out, "backport.json")["fixes"]
    agreement = verdict["upstream_tests"]
    assert agreement["agrees"] is True and agreement["probe"] == "present"
    assert agreement["text"].endswith("they agree") and "the fix's own: 1 passed" in agreement["text"]
    assert "disagree" not in verdict["reason"] and not verdict["disagreements"][1:]  # only git's note
    (replay,) = read(out, "upstream-tests.json")["fixes"]
    assert [f["file"] for f in replay["files"]] == [DOOR_TESTS_FILE] and replay["agreement"] == agreement
    assert "they agree" in (out / "summary.md").read_text()


def test_backport_flags_a_verdict_the_fixes_own_tests_contradict(repo: TinyRepo, tmp_path: Path) -> None:
    """On the base the probe says absent; the declared own test (the valid request's) passes: they disagree."""
    entry = with_upstream_tests(confirmed(repo), "test_a_valid_request_is_admitted")
    folder = write_door_tests(tmp_path / "sglang-tests")
    out = tmp_path / "base"
    assert backport(repo, matrix(tmp_path, entry), out, repo.commits["base"], "--upstream-tests", str(folder)) == 1
    (verdict,) = read(out, "backport.json")["fixes"]
    assert verdict["verdict"] == "absent" and verdict["upstream_tests"]["agrees"] is False
    flag = "SGLang's tests disagree: test_a_valid_request_is_admitted passes here"
    assert verdict["disagreements"][-1] == flag and verdict["reason"].endswith(f"; {flag}")


def test_backport_says_what_it_checked_and_records_the_fork_under_the_results(
    repo: TinyRepo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No ``--out``: ``results/backport-<stamp>``; the local back end's warning, the fork and each verdict are said."""
    monkeypatch.chdir(tmp_path)
    text = io.StringIO()
    req = backport_workflow.BackportRequest(
        matrix=matrix(tmp_path, confirmed(repo)),
        repo=str(repo.path),
        ref="fork",
        upstream=str(repo.path),
        runner="subprocess",
        use_cache=False,
        bundle=False,
    )
    outcome = backport_workflow.execute(req, said_to(text))
    (folder,) = (tmp_path / "results").iterdir()
    assert re.fullmatch(r"backport-\d{8}T\d{6}Z", folder.name) and outcome.out_dir == folder
    assert outcome.exit_code == 0 and [(v.id, v.verdict) for v in outcome.verdicts] == [("1", "present")]
    said = text.getvalue()
    assert backport_workflow.LOCAL_NOTE.format(backend="subprocess") in said
    fork = repo.commits["fork"]
    assert f"fork {repo.path} at fork" in said and f"fork commit {fork} (tree " in said
    assert f"#1: present - {outcome.verdicts[0].reason}" in said
    document = read(folder, "backport.json")["fork"]
    assert (document["ref"], document["commit"], document["upstream"]) == ("fork", fork, str(repo.path))
    assert document["subject"] == "door: refuse rejected requests" and document["kind"] == "git"
    assert list(read(folder, "family.json")["defaults"]) == [f"fork {fork[:12]}"]
    assert (folder / "environment.json").is_file()


# -- run: what each step gets from the run (its timeout, the gate's factor, the reporter, the lock, the environment)
# A run that dropped one of these (the probes waited for the default timeout, the gate got no factor, the
# environment was built before a bad commit was refused, the back end spoke to stderr) would still judge the
# tiny tree right; these read whether each step got the run's own setting.
def children() -> set[int]:
    """The live child processes of this test process."""
    pids: set[int] = set()
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        pids |= {int(p) for p in (task / "children").read_text().split()}
    return pids


def test_a_run_ends_a_probe_that_hangs_at_its_own_timeout(repo: TinyRepo, tmp_path: Path) -> None:
    """``--timeout 2`` reaches the probes of a plain run: a 20 s probe is an error on each side, not a result."""
    out = tmp_path / "out"
    entry = fix_entry("1", repo.commits["base"], repo.commits["head"], probe="tiny_hang")
    assert git_run(repo, matrix(tmp_path, entry), out, "--timeout", "2") == 1
    (fix,) = read(out, "diff.json")["fixes"]
    assert fix["verdict"] == "error" and fix["passed"] is False
    for side in ("base", "head"):
        seen = read(out, f"observations/1/{side}/tiny_hang.json")
        assert seen["status"] == "error" and seen["fields"] == {}
        assert seen["error"].strip() == "probe hung: killed after 2 s"


def slower_head(fixes, sources, runner, work, reporter, options) -> list[ThroughputResult]:
    """What ``measure`` returns for a head three times slower on twelve pairs of rounds (significant)."""
    base = [1.0 + 0.01 * i for i in range(12)]
    head = [3.0 * b + 0.02 * (i % 3) for i, b in enumerate(base)]
    comparison = compare_paired(
        "cpu_s_per_item", base, head, gate=PairedGate(alpha=0.05, min_effect=0.05, max_spread=0.5)
    )
    assert comparison.regression  # the stand-in is what the gate judges: a significant slowdown
    scaling = Scaling(base=1.0, head=1.0, p_value=1.0)
    return [
        ThroughputResult(fix=f.id, label=f.label, status="ok", comparison=comparison, exponent=scaling) for f in fixes
    ]


@pytest.mark.parametrize(("fail_above", "exit_code"), [(1.5, 1), (5.0, 0), (None, 0)])
def test_the_throughput_gate_gets_the_runs_factor(
    repo: TinyRepo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fail_above: float | None, exit_code: int
) -> None:
    """×3 slower fails ``--fail-above 1.5`` beside a confirmed verdict; ×5 or no factor (informational) passes."""
    monkeypatch.setattr(run_workflow, "measure", slower_head)
    clock = iter([100.0, 101.23456])
    monkeypatch.setattr(run_workflow, "time", SimpleNamespace(monotonic=lambda: next(clock)))
    options = ThroughputOptions(fail_above=fail_above)
    path = matrix(tmp_path, with_throughput(confirmed(repo)))
    req = run_request(repo, path, tmp_path / "out", runner="warm", runner_options=BARE_HUB, throughput=options)
    outcome = run_workflow.execute(req)
    assert [(v.id, v.verdict) for v in outcome.verdicts] == [("1", "confirmed")]
    record = read(outcome.out_dir, "run.json")
    assert outcome.exit_code == exit_code and record["exit_code"] == exit_code
    assert record["throughput"]["fail_above"] == fail_above
    assert record["throughput_wall_s"] == 1.23  # to the hundredth of a second, from the run's own clock


def test_the_runner_gets_the_runs_options_and_speaks_through_its_reporter(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without Landlock the result cache is off, and the run's reporter says so; with no reporter, stderr does."""
    monkeypatch.setattr(sandbox, "available", lambda: False)
    env = SharedEnvironment()
    text = io.StringIO()
    run_workflow.make_runner(run_workflow.RunRequest(runner="subprocess"), env, said_to(text))
    assert "this kernel has no Landlock" in text.getvalue()
    assert "Landlock" not in capsys.readouterr().err
    run_workflow.make_runner(run_workflow.RunRequest(runner="subprocess"), env)
    assert "this kernel has no Landlock" in capsys.readouterr().err
    warm = run_workflow.make_runner(run_workflow.RunRequest(runner="warm", runner_options=BARE_HUB), env)
    assert (warm.hub_preload, warm.server_preload, warm.learn) == ((), (), False)


def test_a_run_without_landlock_says_so_through_its_reporter(
    repo: TinyRepo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sandbox, "available", lambda: False)
    text = io.StringIO()
    req = run_request(repo, matrix(tmp_path, confirmed(repo)), tmp_path / "out", use_cache=True)
    outcome = run_workflow.execute(req, said_to(text))
    assert outcome.exit_code == 0 and [v.verdict for v in outcome.verdicts] == ["confirmed"]
    assert "this kernel has no Landlock" in text.getvalue() and "Landlock" not in capsys.readouterr().err


def test_a_warm_run_stops_its_hub_when_it_ends(repo: TinyRepo, tmp_path: Path) -> None:
    """The warm hub is started early and stopped with the run: no process of it outlives the run."""
    before = children()
    req = run_request(repo, matrix(tmp_path, confirmed(repo)), tmp_path / "out", runner="warm", runner_options=BARE_HUB)
    outcome = run_workflow.execute(req)
    assert outcome.exit_code == 0 and [v.verdict for v in outcome.verdicts] == ["confirmed"]
    assert children() - before == set()


def spy_on_ensure(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every ``SharedEnvironment.ensure`` call's ``progress``, the real method still run."""
    calls: list[Any] = []
    ensure = SharedEnvironment.ensure

    def spy(self: SharedEnvironment, *args: Any, **kw: Any) -> Any:
        calls.append(kw.get("progress", args[0] if args else None))
        return ensure(self, *args, **kw)

    monkeypatch.setattr(SharedEnvironment, "ensure", spy)
    return calls


def test_a_bad_commit_stops_the_run_before_the_environment_is_made(
    repo: TinyRepo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls = spy_on_ensure(monkeypatch)
    missing = "0" * 40
    out = tmp_path / "out"
    assert git_run(repo, matrix(tmp_path, fix_entry("1", repo.commits["base"], missing)), out) == 2
    assert missing[:12] in capsys.readouterr().err
    assert calls == [] and not out.exists()


def test_a_run_makes_its_environment_through_its_reporter_and_records_it(
    repo: TinyRepo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = spy_on_ensure(monkeypatch)
    req = run_request(repo, matrix(tmp_path, confirmed(repo)), tmp_path / "out")
    outcome = run_workflow.execute(req, said_to(io.StringIO()))
    assert outcome.exit_code == 0 and calls and all(callable(progress) for progress in calls)
    environment = read(outcome.out_dir, "environment.json")
    assert environment and environment == SharedEnvironment().document()
    assert read(outcome.out_dir, "run.json")["environment_digest"] == SharedEnvironment().digest


def test_a_run_takes_its_commits_from_the_lock_beside_its_matrix(repo: TinyRepo, tmp_path: Path) -> None:
    path = matrix(tmp_path, fix_entry("1", "", "", pinned=False))
    assert main(["lock", "--matrix", str(path), "--repo", str(repo.path)]) == 0
    outcome = run_workflow.execute(run_request(repo, path, tmp_path / "out"))
    assert outcome.exit_code == 0 and [v.verdict for v in outcome.verdicts] == ["confirmed"]
    record = read(outcome.out_dir, "run.json")
    assert {s["commit"] for s in record["sources"].values()} == {repo.commits["base"], repo.commits["head"]}


# -- a release run: SGLang's own tests only from --upstream-tests ---------------------------------------------------
def release_request(tmp_path: Path, entry: str, **kw: Any) -> run_workflow.RunRequest:
    path = tmp_path / "matrix" / "upstream.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(release_table({"0.5.20": BASE_DOOR, "0.5.21": HEAD_DOOR}) + entry)
    fields = {"runner": "subprocess", "use_cache": False, "bundle": False, "source_kind": "release"}
    return run_workflow.RunRequest(matrix=path, out=tmp_path / "out", **(fields | kw))


def test_a_release_run_replays_the_fixes_own_tests_from_the_folder_it_is_given(tmp_path: Path) -> None:
    entry = with_upstream_tests(fix_entry("1", "", "", pinned=False), "test_a_rejected_request_is_refused")
    folder = write_door_tests(tmp_path / "sglang-tests")
    text = io.StringIO()
    outcome = run_workflow.execute(release_request(tmp_path, entry, upstream_tests=folder), said_to(text))
    assert outcome.exit_code == 0 and [v.verdict for v in outcome.verdicts] == ["confirmed"]
    (fix,) = read(outcome.out_dir, "diff.json")["fixes"]
    assert fix["upstream_tests"]["agrees"] is True
    record = read(outcome.out_dir, "run.json")
    assert record["upstream_tests"]["dir"] == str(folder) and list(record["upstream_tests"]["files"]) == [
        DOOR_TESTS_FILE
    ]
    said = text.getvalue()
    assert "upstream tests on 0.5.20: 2 test(s)" in said and "upstream tests on 0.5.21: 2 test(s)" in said
    assert f"upstream tests #1: {fix['upstream_tests']['text']}" in said


def test_a_release_run_without_a_tests_folder_replays_nothing_and_says_nothing_of_them(tmp_path: Path) -> None:
    entry = with_upstream_tests(fix_entry("1", "", "", pinned=False), "test_a_rejected_request_is_refused")
    outcome = run_workflow.execute(release_request(tmp_path, entry))
    assert outcome.exit_code == 0 and [v.verdict for v in outcome.verdicts] == ["confirmed"]
    (fix,) = read(outcome.out_dir, "diff.json")["fixes"]
    assert "upstream_tests" not in read(outcome.out_dir, "run.json") and fix.get("upstream_tests") is None
    assert not (outcome.out_dir / "upstream-tests.json").exists()
    assert "SGLang's own tests" not in (outcome.out_dir / "summary.md").read_text()


# -- backport: what each step gets from the check (its timeout, the reporter, the cache, the environment) ----------
def test_backport_ends_a_probe_that_hangs_at_its_own_timeout(repo: TinyRepo, tmp_path: Path) -> None:
    entry = fix_entry("1", repo.commits["base"], repo.commits["head"], probe="tiny_hang")
    out = tmp_path / "fork"
    assert backport(repo, matrix(tmp_path, entry), out, "fork", "--timeout", "2") == 1
    seen = read(out, "observations/1/fork/tiny_hang.json")
    assert seen["status"] == "error" and seen["error"].strip() == "probe hung: killed after 2 s"


def test_backport_of_a_ref_the_fork_lacks_names_it_before_the_environment_is_made(
    repo: TinyRepo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls = spy_on_ensure(monkeypatch)
    out = tmp_path / "fork"
    assert backport(repo, matrix(tmp_path, confirmed(repo)), out, "no-such-ref") == 2
    assert "'no-such-ref'" in capsys.readouterr().err  # the ref as given, quoted
    assert calls == [] and not out.exists()


def test_backport_makes_its_environment_through_its_reporter_and_fetches_into_its_cache(
    repo: TinyRepo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = spy_on_ensure(monkeypatch)
    cache = tmp_path / "cache"
    text = io.StringIO()
    req = backport_request(repo, matrix(tmp_path, confirmed(repo)), tmp_path / "fork", cache=cache)
    outcome = backport_workflow.execute(req, said_to(text))
    assert outcome.exit_code == 0 and [v.verdict for v in outcome.verdicts] == ["present"]
    assert calls and all(callable(progress) for progress in calls)
    assert any(cache.rglob("HEAD")), "the fork's mirror is under --cache"
    tree = re.search(r"fork commit [0-9a-f]{40} \(tree ([0-9a-f]+)\)", text.getvalue())
    assert tree is not None and len(tree.group(1)) == 12


def test_a_warm_backport_stops_its_hub_when_it_ends(repo: TinyRepo, tmp_path: Path) -> None:
    before = children()
    req = backport_request(repo, matrix(tmp_path, confirmed(repo)), tmp_path / "fork", runner="warm")
    outcome = backport_workflow.execute(req)
    assert outcome.exit_code == 0 and [v.verdict for v in outcome.verdicts] == ["present"]
    assert children() - before == set()


def test_backport_says_how_its_upstream_tests_ran_on_the_fork(
    repo: TinyRepo, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    entry = with_upstream_tests(confirmed(repo), "test_a_rejected_request_is_refused")
    folder = write_door_tests(tmp_path / "sglang-tests")
    text = io.StringIO()
    req = backport_request(repo, matrix(tmp_path, entry), tmp_path / "fork", upstream_tests=folder)
    outcome = backport_workflow.execute(req, said_to(text))
    assert outcome.exit_code == 0
    said = text.getvalue()
    assert re.search(r"upstream tests on \S+: 2 test\(s\) in \d+\.\d s", said), said
    assert "upstream tests #1: " in said
