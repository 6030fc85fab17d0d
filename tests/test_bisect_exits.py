"""``difflab bisect`` and its ``git bisect run`` step on a short history of the tiny tree's door.

:func:`workflow_tree.door_history` holds the door's bug, notes-only commits, the fix, a branch that
reverts it and one whose middle commit has no ``sglang`` package. The step
(:mod:`difflab.workflows.bisect_step`) is run in a checkout of one commit and answers good (0), bad (1),
skip (125) or abort (128); the bisection drives it through git and must name the fix (or the revert)
as the first changed commit, list the candidates when skips leave it open, and leave no worktree behind.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console

from difflab.cli import main as cli
from difflab.errors import ConfigError, SourceError
from difflab.matrix import load_matrix
from difflab.paths import cache_root
from difflab.progress import Reporter
from difflab.source import repository
from difflab.source.mirror import Mirror
from difflab.workflows import bisect as bisect_workflow
from difflab.workflows.bisect import BisectRequest, run_bisect
from difflab.workflows.bisect_step import ABORT, BAD, GOOD, SKIP, select_probes
from difflab.workflows.bisect_step import main as step
from workflow_tree import DoorHistory, door_history, fix_entry, matrix_text, write_probes

HANG_PROBE = '''"""A probe that never answers: the step's --timeout must end it."""


def observe(kit) -> dict:
    import time

    time.sleep(3600)
    return {}
'''


@pytest.fixture(scope="module")
def history() -> DoorHistory:
    return door_history()


@pytest.fixture(autouse=True)
def tiny_probes(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = write_probes(tmp_path_factory.getbasetemp() / "bisect-probes")
    (folder / "tiny_hang.py").write_text(HANG_PROBE)
    monkeypatch.setenv("DIFFLAB_PROBES", str(folder))


def two_probes(entry: str, second: str) -> str:
    """``entry`` with a second probe after its first (same expectations)."""
    probe = entry[entry.index("[[fixes.probes]]") :]
    return entry + probe.replace('name = "tiny_door"', f'name = "{second}"', 1)


def matrix(tmp_path: Path, history: DoorHistory) -> Path:
    """Fix 1: the door (base..fix); fix 2: the door and a probe that cannot run; fix 3: the door and one that hangs."""
    base, fix = history.commits["base"], history.commits["fix"]
    entries = (
        fix_entry("1", base, fix),
        two_probes(fix_entry("2", base, fix), "tiny_broken"),
        two_probes(fix_entry("3", base, fix), "tiny_hang"),
    )
    path = tmp_path / "matrix" / "upstream.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(matrix_text(*entries))
    return path


# -- the step: one commit, one answer ---------------------------------------------------------------------
@pytest.fixture
def checkout(history: DoorHistory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A clone of the history whose working tree the step reads; ``at(name)`` checks one commit out."""
    folder = tmp_path / "checkout"
    subprocess.run(["git", "clone", "--quiet", "--shared", str(history.path), str(folder)], check=True)
    monkeypatch.chdir(folder)

    def at(name: str) -> str:
        sha = history.commits[name]
        subprocess.run(["git", "checkout", "--quiet", "--detach", sha], cwd=folder, check=True)
        return sha

    return at


def test_a_step_answers_by_the_good_side_and_logs_each_answer(
    history: DoorHistory, tmp_path: Path, checkout, capsys: pytest.CaptureFixture[str]
) -> None:
    path, log = matrix(tmp_path, history), tmp_path / "steps.jsonl"
    args = ["--matrix", str(path), "--fix", "1", "--log", str(log)]
    base = checkout("notes-1")
    started = time.perf_counter()
    assert step([*args, "--good-like", "base"]) == GOOD
    elapsed = time.perf_counter() - started
    fix = checkout("fix")
    assert step([*args, "--good-like", "base"]) == BAD
    assert step([*args, "--good-like", "head"]) == GOOD  # looking for the commit that lost the fix
    said = capsys.readouterr().out.splitlines()
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(s["commit"], s["like"], s["answer"]) for s in lines] == [
        (base, "base", "good"),
        (fix, "head", "bad"),
        (fix, "head", "good"),
    ]
    assert [s["subject"] for s in lines] == [
        "notes: the handoff queue",
        *["door: retire an intake-rejected request (#1)"] * 2,
    ]
    assert all(isinstance(s["duration_s"], float) and s["duration_s"] >= 0 for s in lines)
    assert all(round(s["duration_s"], 3) == s["duration_s"] for s in lines)  # in milliseconds
    assert lines[0]["duration_s"] <= elapsed + 0.001  # the step's own probing, within the call (rounded to ms)
    assert said == [
        f"difflab bisect: {s['commit'][:12]} behaves like {s['like']}: {s['answer']} ({s['reason']})" for s in lines
    ]
    assert lines[0]["reason"] and lines[0]["reason"] != lines[1]["reason"]


def test_a_commit_without_the_package_or_a_probe_that_cannot_run_is_skipped(
    history: DoorHistory, tmp_path: Path, checkout
) -> None:
    path, log = matrix(tmp_path, history), tmp_path / "steps.jsonl"
    checkout("unpackaged")
    assert step(["--matrix", str(path), "--fix", "1", "--good-like", "base", "--log", str(log)]) == SKIP
    checkout("fix")
    assert step(["--matrix", str(path), "--fix", "2", "--good-like", "base", "--log", str(log)]) == SKIP
    # the same commit placed by the probe that runs alone
    assert step(["--matrix", str(path), "--fix", "2", "--probe", "tiny_door", "--good-like", "base"]) == BAD
    skipped = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(s["like"], s["answer"]) for s in skipped] == [("undetermined", "skip")] * 2
    assert skipped[0]["reason"] == "no python/sglang package at this commit"


def test_a_hanging_probe_ends_at_the_steps_timeout_and_the_commit_is_skipped(
    history: DoorHistory, tmp_path: Path, checkout
) -> None:
    path, log = matrix(tmp_path, history), tmp_path / "steps.jsonl"
    checkout("fix")
    assert (
        step(["--matrix", str(path), "--fix", "3", "--good-like", "base", "--timeout", "1", "--log", str(log)]) == SKIP
    )
    assert "probe hung: killed after 1 s" in json.loads(log.read_text())["reason"]


def test_a_step_that_cannot_ask_aborts_the_bisection_and_logs_nothing(
    history: DoorHistory, tmp_path: Path, checkout, capsys: pytest.CaptureFixture[str]
) -> None:
    path, log = matrix(tmp_path, history), tmp_path / "steps.jsonl"
    checkout("fix")
    assert step(["--matrix", str(path), "--fix", "9", "--good-like", "base", "--log", str(log)]) == ABORT
    assert capsys.readouterr().err.startswith("bisect step failed: ") and not log.exists()
    assert step(["--matrix", str(path), "--fix", "1", "--probe", "nope", "--good-like", "base"]) == ABORT
    assert "fix '1' has no probe(s) ['nope'] (known: ['tiny_door'])" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("drop", "change", "said"),
    [
        ("--matrix", None, "the following arguments are required: --matrix"),
        ("--fix", None, "the following arguments are required: --fix"),
        ("--good-like", None, "the following arguments are required: --good-like"),
        (None, ("--good-like", "fork"), "argument --good-like: invalid choice: 'fork' (choose from 'base', 'head')"),
    ],
)
def test_bad_arguments_abort_the_bisection_never_answer_bad(
    history: DoorHistory,
    tmp_path: Path,
    checkout,
    capsys: pytest.CaptureFixture[str],
    drop: str | None,
    change: tuple[str, str] | None,
    said: str,
) -> None:
    """argparse's own exit status (2) would read as "bad commit" to git bisect: a bad argument is 128."""
    given = {"--matrix": str(matrix(tmp_path, history)), "--fix": "1", "--good-like": "base"}
    given.pop(drop, None)
    if change:
        given[change[0]] = change[1]
    checkout("fix")
    assert step([part for item in given.items() for part in item]) == ABORT
    err = capsys.readouterr().err
    assert err == f"bisect step failed: python -m difflab.workflows.bisect_step: {said}\n"


def test_a_step_reads_the_matrix_and_log_paths_the_way_the_shell_would_have(
    history: DoorHistory, tmp_path: Path, checkout, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--matrix=~/...`` reaches the step unexpanded by the shell: the step expands it."""
    monkeypatch.setenv("DIFFLAB_CACHE", str(cache_root()))  # the lab's cache (its environment) stays where it is
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    path = matrix(tmp_path / "home", history)
    checkout("fix")
    log = "~/steps.jsonl"
    assert step(["--matrix=~/matrix/upstream.toml", "--fix", "1", "--good-like", "base", f"--log={log}"]) == BAD
    assert path.is_file() and json.loads((tmp_path / "home" / "steps.jsonl").read_text())["answer"] == "bad"


def test_a_step_outside_a_git_checkout_aborts(
    history: DoorHistory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """No commit to place: the lab's failure (128), never a skip that git would step past."""
    path = matrix(tmp_path, history)
    bare = tmp_path / "not-a-checkout"
    (bare / "python" / "sglang").mkdir(parents=True)
    monkeypatch.chdir(bare)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    assert step(["--matrix", str(path), "--fix", "1", "--good-like", "base"]) == ABORT
    assert "bisect step failed: " in capsys.readouterr().err


def test_the_probes_named_are_chosen_in_the_order_named(history: DoorHistory, tmp_path: Path) -> None:
    matrix_ = load_matrix(matrix(tmp_path, history))
    fix = matrix_.fix("2")
    assert [p.name for p in select_probes(fix, None)] == ["tiny_door", "tiny_broken"]
    assert [p.name for p in select_probes(fix, ["tiny_broken", "tiny_door"])] == ["tiny_broken", "tiny_door"]
    with pytest.raises(ConfigError) as err:
        select_probes(fix, ["tiny_door", "x", "y"])
    assert str(err.value) == "fix '2' has no probe(s) ['x', 'y'] (known: ['tiny_broken', 'tiny_door'])"
    bare = type(fix)(id="7", pr=7, title="t", base=fix.base, head=fix.head, probes=())
    with pytest.raises(ConfigError) as err:
        select_probes(bare, None)
    assert str(err.value) == "fix '7' declares no probes in the matrix"


# -- the bisection ------------------------------------------------------------------------------------------
def scratch_of(history: DoorHistory) -> Path:
    return cache_root() / "git" / "scratch" / Mirror(str(history.path)).key


def left_behind(history: DoorHistory) -> list[Path]:
    """This process's bisect worktree and step log, if any is left (other workers bisect beside it)."""
    return sorted(scratch_of(history).glob(f"bisect-{os.getpid()}*"))


def bisect(history: DoorHistory, tmp_path: Path, good: str, bad: str, fix: str = "1", *extra: str) -> list[str]:
    path = matrix(tmp_path, history)
    argv = ["bisect", "--repo", str(history.path), "--good", good, "--bad", bad, "--fix", fix, "--matrix", str(path)]
    return [*argv, *extra]


def test_bisect_names_the_fix_as_the_first_commit_behaving_like_its_head(
    history: DoorHistory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    c = history.commits
    assert cli(bisect(history, tmp_path, c["base"], c["notes-4"], "1", "--json")) == 0
    result = json.loads(capsys.readouterr().out)
    assert (result["first"], result["subject"]) == (c["fix"], "door: retire an intake-rejected request (#1)")
    assert (result["good"], result["bad"], result["good_like"], result["bad_like"]) == (
        c["base"],
        c["notes-4"],
        "base",
        "head",
    )
    answers = {s["commit"]: s["answer"] for s in result["steps"]}
    assert answers and set(answers) <= {c["notes-1"], c["notes-2"], c["fix"], c["notes-3"]}
    assert all(answers[sha] == ("bad" if sha in (c["fix"], c["notes-3"]) else "good") for sha in answers)
    assert result["candidates"] == [] and result["output"] is None
    assert left_behind(history) == []


def test_bisect_from_a_head_like_good_finds_the_commit_that_lost_the_fix(
    history: DoorHistory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    c = history.commits
    assert cli(bisect(history, tmp_path, c["fix"], "lost")) == 0
    captured = capsys.readouterr()
    said = captured.out + captured.err
    lost = c["lost"]
    assert f"{lost} is the first commit behaving like base for fix 1: door: admit every request again" in said
    assert f"step {c['notes-3'][:12]} like head: good  notes: the retired requests" in said
    assert f"--good {c['fix'][:12]} behaves like head (" in said and f"--bad {lost[:12]} behaves like base (" in said
    assert "git bisect run: good = behaves like head, bad = behaves like base" in said


def test_bisect_lists_the_candidates_when_a_skipped_commit_leaves_it_open(
    history: DoorHistory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    c = history.commits
    req = BisectRequest(load_matrix(matrix(tmp_path, history)).fix("1"), matrix(tmp_path, history), c["base"], "moved")
    result = run_bisect(req, repository(str(history.path)), say=lambda _m: None)
    assert result.first is None and result.subject is None
    assert sorted(result.candidates) == sorted([c["unpackaged"], c["repackaged"]])
    assert [(s["commit"], s["answer"]) for s in result.steps] == [(c["unpackaged"], "skip")]
    assert "only 'skip'ped commits left" in result.output
    assert cli(bisect(history, tmp_path / "cli", c["base"], "moved")) == 1
    captured = capsys.readouterr()
    said = captured.out + captured.err
    assert "bisect could not settle: commits the probes cannot place were skipped; candidates:" in said
    assert f"  {c['unpackaged']}" in said and f"  {c['repackaged']}" in said


def test_bisect_asks_only_the_probes_named(
    history: DoorHistory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Fix 2's second probe cannot run: with ``--probe tiny_door`` alone the endpoints are placed, and the fix found."""
    c = history.commits
    assert cli(bisect(history, tmp_path, c["notes-1"], c["notes-4"], "2", "--probe", "tiny_door", "--json")) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["first"] == c["fix"] and all(s["answer"] in ("good", "bad") for s in result["steps"])


def test_an_endpoint_whose_probe_hangs_ends_at_the_timeout_and_is_refused(
    history: DoorHistory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    c = history.commits
    assert cli(bisect(history, tmp_path, c["base"], c["fix"], "3", "--timeout", "1")) == 2
    err = capsys.readouterr().err
    assert f"--good {c['base']}: behaviour is " in err and "it must behave like the fix's base or head" in err
    assert "(tiny_hang: probe error: probe hung: killed after 1 s)" in err


def test_endpoints_that_behave_alike_or_cannot_be_placed_are_refused_before_bisecting(
    history: DoorHistory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    c = history.commits
    assert cli(bisect(history, tmp_path, c["base"], c["notes-2"])) == 2
    err = capsys.readouterr().err
    assert "--good and --bad both behave like the fix's base: nothing changed between them" in err
    assert cli(bisect(history, tmp_path / "2", c["base"], c["fix"], "2")) == 2  # fix 2's second probe cannot run
    err = capsys.readouterr().err
    assert f"--good {c['base']}: behaviour is " in err and "for fix '2' (" in err
    assert "it must behave like the fix's base or head" in err
    assert left_behind(history) == []


def test_a_step_that_aborts_fails_the_bisection_and_removes_the_worktree(
    history: DoorHistory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # computed, so that git's echo of the command line never holds the words the step says
    says = "import sys; print('bisect step failed: ' + 'the environment is broken'.upper(), file=sys.stderr)"
    aborts = [sys.executable, "-c", f"{says}; raise SystemExit({ABORT})"]
    monkeypatch.setattr(bisect_workflow, "_step_command", lambda *a: aborts)
    c = history.commits
    path = matrix(tmp_path, history)
    req = BisectRequest(load_matrix(path).fix("1"), path, c["base"], c["notes-4"])
    with pytest.raises(SourceError, match=r"^git bisect run failed \(exit [1-9]\d*\): ") as err:
        run_bisect(req, repository(str(history.path)), say=lambda _m: None)
    said = str(err.value)  # what the step said on its stderr, and git's own word there
    assert "bisect step failed: THE ENVIRONMENT IS BROKEN" in said and f"exit code {ABORT} from " in said
    assert left_behind(history) == []


def test_a_failed_bisection_says_the_tail_of_gits_output(
    history: DoorHistory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step that prints a lot before it aborts: the error keeps the last 2000 characters, where git says why."""
    noisy = [sys.executable, "-c", f"print('x' * 3000 + 'END'); raise SystemExit({ABORT})"]
    monkeypatch.setattr(bisect_workflow, "_step_command", lambda *a: noisy)
    c = history.commits
    path = matrix(tmp_path, history)
    req = BisectRequest(load_matrix(path).fix("1"), path, c["base"], c["notes-4"])
    with pytest.raises(SourceError) as err:
        run_bisect(req, repository(str(history.path)), say=lambda _m: None)
    prefix, _, tail = str(err.value).partition("): ")
    assert prefix.startswith("git bisect run failed (exit ") and len(tail) == 2000 and "END" in tail


def test_a_word_a_step_prints_is_never_taken_for_a_candidate(
    history: DoorHistory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every commit skipped: the candidates are git's list of commits, not the steps' own one-word lines."""
    skips = [sys.executable, "-c", f"print('undetermined'); raise SystemExit({SKIP})"]
    monkeypatch.setattr(bisect_workflow, "_step_command", lambda *a: skips)
    c = history.commits
    path = matrix(tmp_path, history)
    req = BisectRequest(load_matrix(path).fix("1"), path, c["base"], c["notes-4"])
    result = run_bisect(req, repository(str(history.path)), say=lambda _m: None)
    assert result.first is None and "undetermined" in result.output.splitlines()
    assert sorted(result.candidates) == sorted(c[n] for n in ("notes-1", "notes-2", "fix", "notes-3", "notes-4"))


def test_git_never_prompts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A mirror that asked for credentials would hang the bisection: git runs with its prompt off."""
    monkeypatch.delenv("GIT_TERMINAL_PROMPT", raising=False)
    git = bisect_workflow._git_in(tmp_path)
    assert git("-c", 'alias.prompt=!printf %s "${GIT_TERMINAL_PROMPT-unset}"', "prompt").stdout == "0"


def test_git_in_a_folder_names_the_failed_command_and_what_git_said(tmp_path: Path) -> None:
    git = bisect_workflow._git_in(tmp_path)
    with pytest.raises(SourceError) as err:
        git("rev-parse", "--verify", "HEAD")
    assert str(err.value).startswith("git rev-parse --verify HEAD: fatal: not a git repository")
    proc = git("rev-parse", "--verify", "HEAD", check=False)
    assert proc.returncode != 0 and "not a git repository" in proc.stderr
    assert git("--version").stdout.startswith("git version ")


def test_an_endpoint_git_cannot_find_is_named_by_its_flag(
    history: DoorHistory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli(bisect(history, tmp_path, "no-such-ref", history.commits["fix"])) == 2
    assert "--good no-such-ref" in capsys.readouterr().err


def test_a_log_left_by_an_earlier_bisection_is_not_read_as_this_ones_steps(
    history: DoorHistory, tmp_path: Path
) -> None:
    c = history.commits
    path = matrix(tmp_path, history)
    stale = scratch_of(history) / f"bisect-{os.getpid()}.steps.jsonl"
    stale.parent.mkdir(parents=True, exist_ok=True)
    stale.write_text(json.dumps({"commit": "0" * 40, "answer": "bad"}) + "\n")
    text = io.StringIO()
    req = BisectRequest(load_matrix(path).fix("1"), path, c["notes-2"], c["notes-3"], timeout_s=60)
    result = run_bisect(req, repository(str(history.path)), say=Reporter(Console(file=text, width=400)).say)
    assert result.first == c["fix"] and [s["commit"] for s in result.steps] == [c["fix"]]
    assert not stale.exists() and left_behind(history) == []


def test_the_step_command_carries_the_request(history: DoorHistory, tmp_path: Path) -> None:
    path = matrix(tmp_path, history)
    fix = load_matrix(path).fix("2")
    req = BisectRequest(fix, path, "a", "b", timeout_s=7.5)
    command = bisect_workflow._step_command(req, list(fix.probes), "head", tmp_path / "log")
    assert command == [
        sys.executable,
        "-m",
        "difflab.workflows.bisect_step",
        "--matrix",
        str(path),
        "--fix",
        "2",
        "--good-like",
        "head",
        "--timeout",
        "7.5",
        "--log",
        str(tmp_path / "log"),
        "--probe",
        "tiny_door",
        "--probe",
        "tiny_broken",
    ]
