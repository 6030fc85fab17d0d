"""``difflab fuzz`` on the tiny tree: what it runs, what ``fuzz.json`` and ``run.json`` say, how it exits.

The real search (:mod:`harness.pd_search`) drives SGLang's KV memory; the workflow's own decisions (the
chunks and their seeds, which leaks are distinct, exit 1 on a leak and 3 when a chunk could not run, nothing
written then) depend only on the events the chunks report. So ``$DIFFLAB_PROBES`` here holds a
``harness/pd_search.py`` of the same shape that reports a leak wherever the tiny tree's door admits a
rejected request (its base) and the chunk is one the seed picks, and each chunk runs through the real
runner (``--backend subprocess``) on a commit of the tiny git repository or a wheel of it as a release.
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from difflab import runner as runner_package
from difflab.cli import main
from difflab.errors import ConfigError, DifflabError
from difflab.paths import repo_root
from difflab.progress import Reporter
from difflab.workflows import fuzz as fuzz_workflow
from workflow_tree import BASE_DOOR, HEAD_DOOR, TinyRepo, fix_entry, matrix_text, release_table, tiny_repo, write_probes

FAST = ["--backend", "subprocess"]

SEARCH = '''"""A stand-in for the lab's schedule search: the same events, decided by the tiny tree's door."""

import time
from types import SimpleNamespace


def observe_chunk(kit, *, schedules, seed, chunk, backend):
    from sglang.door import admit

    print(f"chunk {chunk}: {schedules} schedules of seed {seed}", flush=True)
    if backend == "nixl" and chunk >= 1:
        raise RuntimeError("no loopback for nixl in this chunk")
    if backend == "mori" and chunk == 1:
        return {"search.schedules": schedules}  # ran, but reported no search event
    if seed == 7:
        time.sleep(3600)  # a search that never ends
    leaks = admit(SimpleNamespace(rejected=True)) and (seed + chunk) % 2 == 0
    leak = None
    if leaks:
        pages = [seed % 5, 3] if chunk < 4 else [seed % 5, 4]  # a different leak from chunk 4 on
        leak = {"schedule": ["admit r0", "abort r0", "admit r1"], "victim": "r1", "owner": "r0", "pages": pages,
                "canary": True}
    kit.event("search", seed=seed, chunk=chunk, backend=backend, schedules=schedules, runs=schedules + chunk,
              seconds=0.25, cpu_seconds=0.125, leak=leak, servers={"prefill": "TinyScheduler"},
              acks_failed_send=chunk == 0, assumptions=["a loopback wire"])
    return {"search.runs": schedules + chunk}
'''


@pytest.fixture(scope="module")
def repo() -> TinyRepo:
    return tiny_repo()


@pytest.fixture(autouse=True)
def search_probes(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = write_probes(tmp_path_factory.getbasetemp() / "fuzz-probes")
    (folder / "harness").mkdir(exist_ok=True)
    (folder / "harness" / "__init__.py").write_text('"""The stand-in search\'s package."""\n')
    (folder / "harness" / "pd_search.py").write_text(SEARCH)
    monkeypatch.setenv("DIFFLAB_PROBES", str(folder))
    return folder


def matrix(tmp_path: Path, releases: str = "") -> Path:
    path = tmp_path / "matrix" / "upstream.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text((releases or matrix_text()) + fix_entry("1", "", "", pinned=False))  # a matrix has a fix
    return path


def fuzz(repo: TinyRepo, tmp_path: Path, ref: str, *extra: str) -> int:
    argv = ["fuzz", "--repo", str(repo.path), "--ref", ref, "--matrix", str(matrix(tmp_path))]
    return main([*argv, "--out", str(tmp_path / "out"), *FAST, *extra])


def read(out: Path, name: str) -> Any:
    return json.loads((out / name).read_text())


# -- a search that found a leak, and one that found none --------------------------------------------------------
def test_a_leak_on_the_base_exits_one_and_fuzz_json_keeps_each_distinct_leak_once(
    repo: TinyRepo, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = repo.commits["base"]
    assert fuzz(repo, tmp_path, base, "--schedules", "103", "--seed", "2") == 1
    out = tmp_path / "out"
    doc = read(out, "fuzz.json")
    assert (doc["source"], doc["source_identity"]["commit"], doc["sglang_version"]) == (base, base, "0.0.0")
    assert (doc["transfer_backend"], doc["runner"], doc["seed"], doc["schedules"]) == ("mooncake", "subprocess", 2, 103)
    assert doc["chunks"] == [
        {"chunk": 0, "seed": 2000, "runs": 25, "leaked": True},
        {"chunk": 1, "seed": 2001, "runs": 26, "leaked": False},
        {"chunk": 2, "seed": 2002, "runs": 27, "leaked": True},
        {"chunk": 3, "seed": 2003, "runs": 28, "leaked": False},
        {"chunk": 4, "seed": 2004, "runs": 7, "leaked": True},  # 103 = 4 x 25 + 3
    ]
    assert doc["runs"] == 113 and doc["seconds"] == 1.25 and doc["cpu_seconds"] == 0.625
    # chunk 0's leak (chunk 2 found it again), then chunk 4's other pages
    assert [(leak["chunk"], leak["pages"]) for leak in doc["leaks"]] == [(0, [2, 3]), (4, [2, 4])]
    assert doc["leaks"][0] == {
        "chunk": 0,
        "schedule": ["admit r0", "abort r0", "admit r1"],
        "victim": "r1",
        "owner": "r0",
        "pages": [2, 3],
        "canary": True,
    }
    assert doc["acks_failed_send"] is True and doc["servers"] == {"prefill": "TinyScheduler"}
    record = read(out, "run.json")
    assert (record["command"], record["exit_code"], record["source"], record["runner"]) == (
        "fuzz",
        1,
        base,
        "subprocess",
    )
    assert record["fixes"] == [] and isinstance(record["cpus"], int) and record["cpus"] >= 1
    assert (out / "environment.json").is_file() and (out / "matrix.toml").is_file()
    captured = capsys.readouterr()
    assert "113 schedules run (with shrinking)" in captured.out and captured.out.count("LEAK: r1 read r0's KV") == 2
    assert re.search(rf"\bfuzz {base} chunk-004\s+ok", captured.err)  # each chunk's progress line: fix, source, chunk


def test_each_chunk_runs_its_own_seed_and_share_of_the_schedules_and_keeps_its_probe_and_log(
    repo: TinyRepo, tmp_path: Path
) -> None:
    """Chunk ``i`` of seed 3 is seed 3003's search; the probe each chunk ran is kept beside its log."""
    assert fuzz(repo, tmp_path, repo.commits["base"], "--schedules", "30", "--seed", "3") == 1
    out = tmp_path / "out"
    doc = read(out, "fuzz.json")
    assert [(c["chunk"], c["seed"], c["runs"], c["leaked"]) for c in doc["chunks"]] == [
        (0, 3000, 25, False),
        (1, 3001, 6, True),
    ]
    assert [leak["chunk"] for leak in doc["leaks"]] == [1] and doc["acks_failed_send"] is True
    stubs = sorted(p.name for p in (out / "search").iterdir())
    assert stubs == ["chunk-000.py", "chunk-001.py"]
    second = (out / "search" / "chunk-001.py").read_text()
    # the kept file says what wrote it and where its results are
    assert second.startswith('"""One chunk of `difflab fuzz` (written by the lab; see fuzz.json)."""\n\nimport sys\n')
    assert "observe_chunk(kit, schedules=5, seed=3, chunk=1, backend='mooncake')" in second
    assert "schedules=25, seed=3, chunk=0," in (out / "search" / "chunk-000.py").read_text()
    assert sorted(p.name for p in (out / "logs").iterdir()) == ["chunk-000.log", "chunk-001.log"]
    assert "chunk 1: 5 schedules of seed 3" in (out / "logs" / "chunk-001.log").read_text()
    # a search is never sealed: nothing beside the search's own files and the run's record
    assert sorted(p.name for p in out.iterdir()) == [
        "environment.json",
        "fuzz.json",
        "logs",
        "matrix.toml",
        "run.json",
        "search",
    ]


def test_no_leak_on_the_head_exits_zero_and_says_what_ran(repo: TinyRepo, tmp_path: Path) -> None:
    req = fuzz_workflow.FuzzRequest(
        out=tmp_path / "out",
        repo=str(repo.path),
        ref=repo.commits["head"],
        matrix=matrix(tmp_path),
        runner="subprocess",
        transfer_backend="nixl",  # one chunk: the stand-in's chunk 1 never runs
        schedules=25,
        seed=4,
        argv=["difflab", "fuzz", "--seed", "4"],
    )
    outcome = fuzz_workflow.execute(req, Reporter())
    assert (outcome.exit_code, outcome.leaks, outcome.out_dir) == (0, [], (tmp_path / "out").resolve())
    assert (outcome.runs, outcome.seconds, outcome.cpu_seconds) == (25, 0.25, 0.125)
    doc = read(outcome.out_dir, "fuzz.json")
    assert doc["transfer_backend"] == "nixl" and doc["chunks"] == [
        {"chunk": 0, "seed": 4000, "runs": 25, "leaked": False}
    ]
    record = read(outcome.out_dir, "run.json")
    assert doc["leaks"] == [] and record["exit_code"] == 0 and record["argv"] == ["difflab", "fuzz", "--seed", "4"]


def test_a_search_is_run_again_never_answered_from_the_result_cache(
    repo: TinyRepo, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same chunk probe on the same source twice: the second search runs it again."""
    for out in ("first", "second"):
        argv = ["fuzz", "--repo", str(repo.path), "--ref", repo.commits["head"], "--matrix", str(matrix(tmp_path))]
        assert main([*argv, "--out", str(tmp_path / out), "--schedules", "3", *FAST]) == 0
        assert "chunk 0: 3 schedules of seed 0" in (tmp_path / out / "logs" / "chunk-000.log").read_text()
        said = capsys.readouterr().err
        assert re.search(r"chunk-000\s+ok", said) and "(cached)" not in said


# -- a search that could not run: exit 3, nothing written ---------------------------------------------------------
@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--transfer-backend", "nixl"], "error: the search could not run: chunk-001: Traceback"),
        (["--transfer-backend", "mori"], "error: chunk chunk-001: the search reported nothing"),
        (["--seed", "7", "--timeout", "1"], "error: the search could not run: chunk-000: probe hung: killed after 1 s"),
    ],
)
def test_a_chunk_that_cannot_run_is_exit_three_and_nothing_is_written(
    repo: TinyRepo, tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    assert fuzz(repo, tmp_path, repo.commits["base"], "--schedules", "26", *extra) == 3
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_the_failed_chunks_are_named_and_only_they(repo: TinyRepo, tmp_path: Path) -> None:
    req = fuzz_workflow.FuzzRequest(
        out=tmp_path / "out",
        repo=str(repo.path),
        ref=repo.commits["base"],
        matrix=matrix(tmp_path),
        runner="subprocess",
        transfer_backend="nixl",
        schedules=60,
    )
    with pytest.raises(fuzz_workflow.SearchFailed) as info:
        fuzz_workflow.execute(req, Reporter())
    text = str(info.value)
    assert text.startswith("the search could not run: chunk-001: Traceback (most recent call last):")
    assert text.endswith("RuntimeError: no loopback for nixl in this chunk")
    assert "in this chunk; chunk-002: Traceback (most recent call last):" in text  # both failed chunks, in order
    assert "chunk-000" not in text and info.value.exit_code == 3
    assert not (tmp_path / "out").exists()


# -- a release the matrix pins -----------------------------------------------------------------------------------
def test_a_pinned_release_is_searched_from_its_wheel(tmp_path: Path) -> None:
    m = matrix(tmp_path, release_table({"0.5.20": BASE_DOOR, "0.5.21": HEAD_DOOR}))
    for version, code in (("0.5.21", 0), ("0.5.20", 1)):
        out = tmp_path / version
        argv = ["fuzz", "--release", version, "--matrix", str(m), "--out", str(out), "--schedules", "2", *FAST]
        assert main(argv) == code
        doc = read(out, "fuzz.json")
        assert doc["source"] == version and doc["sglang_version"] == version
        assert doc["source_identity"]["file"].startswith(f"sglang-{version}-py3-none-tinydoor")
        assert read(out, "run.json")["source"] == version


def test_a_release_the_matrix_does_not_pin_is_refused_naming_the_matrix(tmp_path: Path) -> None:
    m = matrix(tmp_path, release_table({"0.5.20": BASE_DOOR, "0.5.21": HEAD_DOOR}))
    req = fuzz_workflow.FuzzRequest(out=tmp_path / "out", release="0.5.22", matrix=m, runner="subprocess")
    with pytest.raises(ConfigError, match=f"^--release 0.5.22: not pinned in {re.escape(str(m))} \\[releases\\]$"):
        fuzz_workflow.execute(req, Reporter())
    assert not (tmp_path / "out").exists()


# -- bad input, refused before anything runs ---------------------------------------------------------------------
@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({}, "give either --release V or --repo R --ref REF (one source to search)"),
        ({"release": "0.5.20", "ref": "main"}, "give either --release V or --repo R --ref REF (one source to search)"),
        ({"release": "0.5.20", "repo": "r"}, "--repo needs --ref: which commit of the repository to search"),
        ({"release": "0.5.20", "schedules": 0}, "--schedules must be at least 1, got 0"),
        ({"release": "0.5.20", "seed": -1}, "--seed must be a non-negative integer, got -1"),
        (
            {"release": "0.5.20", "transfer_backend": "rdma"},
            "--transfer-backend 'rdma': choose one of mooncake, nixl, mori",
        ),
    ],
)
def test_bad_input_is_refused_naming_the_flag(changes: dict, message: str, tmp_path: Path) -> None:
    req = fuzz_workflow.FuzzRequest(out=tmp_path / "out", **changes)
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
        fuzz_workflow.execute(req, Reporter())
    assert not (tmp_path / "out").exists()


def test_the_least_search_is_accepted() -> None:
    fuzz_workflow.check(fuzz_workflow.FuzzRequest(release="0.5.20", schedules=1, seed=0))
    fuzz_workflow.check(fuzz_workflow.FuzzRequest(repo="r", ref="main"))
    assert fuzz_workflow._chunks(1) == [1] and fuzz_workflow._chunks(51) == [25, 25, 1]


def test_a_search_without_out_goes_to_a_stamped_folder_under_the_results() -> None:
    out = fuzz_workflow.default_out()
    assert out.parent == repo_root() / "results" and re.fullmatch(r"fuzz-\d{8}T\d{6}Z", out.name)


def test_a_ref_the_repository_lacks_is_refused_naming_the_flag(repo: TinyRepo, tmp_path: Path) -> None:
    req = fuzz_workflow.FuzzRequest(
        out=tmp_path / "out", repo=str(repo.path), ref="no-such-branch", matrix=matrix(tmp_path), runner="subprocess"
    )
    with pytest.raises(DifflabError, match="--ref no-such-branch"):
        fuzz_workflow.execute(req, Reporter())
    assert not (tmp_path / "out").exists()


def test_a_search_replaces_an_earlier_one_only_with_force(repo: TinyRepo, tmp_path: Path) -> None:
    def request(**changes: Any) -> fuzz_workflow.FuzzRequest:
        settings = {"out": tmp_path / "out", "repo": str(repo.path), "matrix": matrix(tmp_path), "schedules": 2}
        return fuzz_workflow.FuzzRequest(runner="subprocess", **(settings | changes))

    assert fuzz_workflow.execute(request(ref=repo.commits["head"]), Reporter()).exit_code == 0
    with pytest.raises(ConfigError, match="--force"):
        fuzz_workflow.execute(request(ref=repo.commits["base"]), Reporter())
    assert read(tmp_path / "out", "fuzz.json")["source"] == repo.commits["head"]  # the earlier search, untouched
    assert fuzz_workflow.execute(request(ref=repo.commits["base"], force=True), Reporter()).exit_code == 1
    assert read(tmp_path / "out", "fuzz.json")["source"] == repo.commits["base"]


def test_the_back_ends_warnings_reach_the_callers_reporter(
    repo: TinyRepo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without Landlock the runner warns that the probes can read the lab's keys: on the reporter the caller gave."""
    monkeypatch.setattr(runner_package.sandbox, "available", lambda: False)
    text = io.StringIO()
    where = {"repo": str(repo.path), "ref": repo.commits["head"], "matrix": matrix(tmp_path)}
    req = fuzz_workflow.FuzzRequest(out=tmp_path / "out", runner="subprocess", schedules=2, **where)
    assert fuzz_workflow.execute(req, Reporter(Console(file=text, width=400))).exit_code == 0
    assert "this kernel has no Landlock" in text.getvalue()
