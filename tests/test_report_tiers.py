"""The fuzz search's and the GPU tier's own files, as their workflows write them; run.json's stamps.

``fuzz.json`` adds up the chunks a search ran (one leaked, one ran clean and reported no CPU time of its
own); the GPU tier writes the usual verdict files marked as the tier's, plus each target's deployment,
preflight and A/B evidence.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import time
from pathlib import Path

import pytest
from junitparser import JUnitXml

from difflab import __version__
from difflab.paths import checkout_root
from difflab.report import record as record_module
from difflab.report.fuzz import NAME, SearchAsked, document, write_fuzz
from difflab.report.gpu import write_ab, write_deployment, write_preflight, write_tier
from difflab.report.record import RunRecord, folder_stamp, is_run_folder, matrix_reference, stamp
from test_report_documents import _run_verdicts

ASKED = SearchAsked(
    source="0.5.21",
    source_identity={"kind": "release", "sha256": "9" * 64},
    sglang_version="0.5.21",
    transfer_backend="mooncake",
    runner="warm",
    seed=7,
    schedules=300,
)
LEAK = {"schedule": [3, 1, 2], "rooms": [5], "pages_held": 2}
EVENTS = [
    {
        "chunk": 0,
        "runs": 120,
        "seconds": 2.5,
        "cpu_seconds": 2.0,
        "leak": None,
        "acks_failed_send": False,
        "assumptions": ["this build's Mooncake transfer_worker's answer (acks_failed_send)"],
    },
    {"chunk": 1, "runs": 80, "seconds": 1.2504, "leak": LEAK},
]


def test_fuzz_json_adds_up_the_chunks_and_names_the_leaking_one(tmp_path: Path) -> None:
    doc = document(ASKED, EVENTS, [LEAK])
    assert doc["schema"] == 1 and doc["seed"] == 7 and doc["transfer_backend"] == "mooncake"
    assert doc["chunks"] == [
        {"chunk": 0, "seed": 7000, "runs": 120, "leaked": False},
        {"chunk": 1, "seed": 7001, "runs": 80, "leaked": True},
    ]
    assert (doc["runs"], doc["seconds"], doc["cpu_seconds"]) == (200, 3.75, 3.25)  # chunk 1: its wall time
    assert doc["schedules_per_second_per_core"] == round(200 / 3.25, 1) == 61.5
    assert doc["schedules_per_wall_second"] == round(200 / 3.75, 1) == 53.3
    assert doc["acks_failed_send"] is False and doc["assumptions"] == EVENTS[0]["assumptions"]
    assert doc["leaks"] == [LEAK]
    path = write_fuzz(tmp_path, doc)
    assert path == tmp_path / NAME == tmp_path / "fuzz.json"
    assert path.read_text() == json.dumps(doc, indent=2, sort_keys=True) + "\n"  # as every run-folder file


def test_a_search_that_ran_no_time_has_no_rate() -> None:
    doc = document(ASKED, [{"chunk": 0, "runs": 0, "seconds": 0.0, "leak": None}], [])
    assert doc["schedules_per_second_per_core"] is None and doc["schedules_per_wall_second"] is None
    assert doc["acks_failed_send"] is None and doc["assumptions"] == [] and doc["chunks"][0]["leaked"] is False


@pytest.mark.parametrize("testserver", [False, True])
def test_the_gpu_tier_files_are_the_run_files_marked_as_the_tier(tmp_path: Path, testserver: bool) -> None:
    verdicts = _run_verdicts()
    write_tier(tmp_path, verdicts, testserver=testserver, sections=["", "## Throughput", "", "no A/B ran"])
    doc = json.loads((tmp_path / "diff.json").read_text())
    assert (doc["tier"], doc["mode"]) == ("gpu", "testserver" if testserver else "docker")
    assert [f["verdict"] for f in doc["fixes"]] == [v.verdict for v in verdicts]
    (suite,) = list(JUnitXml.fromfile(str(tmp_path / "junit.xml")))
    assert suite.name == "difflab-gpu"
    text = (tmp_path / "summary.md").read_text()
    title = "SGLang GPU/RDMA tier" + (" (test server: pre-fix switches on base, off on head)" if testserver else "")
    assert text.splitlines()[0] == f"# {title}"
    assert text.endswith("\n## Throughput\n\nno A/B ran\n")
    (tmp_path / "bare").mkdir()
    write_tier(tmp_path / "bare", verdicts, testserver=testserver)
    assert (tmp_path / "bare" / "summary.md").read_text() == text.removesuffix("\n## Throughput\n\nno A/B ran\n")


def test_each_target_keeps_its_deployment_preflight_and_ab_evidence(tmp_path: Path) -> None:
    described = {"image": "lmsysorg/sglang:v0.5.21", "gpus": [0, 1], "model": Path("/models/tiny")}
    path = write_deployment(tmp_path, "0.5.21-mooncake", described)
    assert path == tmp_path / "deployment" / "0.5.21-mooncake.json"
    assert json.loads(path.read_text()) == {"image": "lmsysorg/sglang:v0.5.21", "gpus": [0, 1], "model": "/models/tiny"}
    assert path.read_text().endswith("}\n") and '\n  "gpus"' in path.read_text()
    write_deployment(tmp_path, "0.5.22-mooncake", {"image": "x"})  # a second target: the folder exists
    gates = {"passed": False, "gates": [{"name": "rdma", "ok": False}]}
    assert json.loads(write_preflight(tmp_path, "0.5.21-mooncake", gates).read_text()) == gates
    assert (tmp_path / "preflight" / "0.5.21-mooncake.json").is_file()
    write_preflight(tmp_path, "0.5.22-mooncake", {"passed": True})
    ab = {"rounds": [{"base": 10.5, "head": 10.1}], "verdict": "no slower"}
    path = write_ab(tmp_path, "41404", ab)
    assert path == tmp_path / "throughput" / "41404" / "ab.json"
    assert json.loads(path.read_text()) == ab and path.read_text().endswith("}\n")
    assert '\n  "rounds"' in path.read_text()
    assert write_ab(tmp_path, "41404", {"rounds": []}).read_text() == '{\n  "rounds": []\n}\n'  # rewritten


# -- run.json's timestamps and whose folder it is --------------------------------------------------------------
def test_stamps_are_utc_whatever_the_machine_s_zone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        when = dt.datetime(2026, 5, 1, 14, 0, 7, tzinfo=dt.timezone(dt.timedelta(hours=2)))
        assert folder_stamp(when) == "20260501T120007Z" and stamp(when) == "2026-05-01T12:00:07Z"
        local = dt.datetime(2026, 5, 1, 8, 0, 7)  # naive: the machine's own zone (New York, UTC-4 in May)
        assert folder_stamp(local) == "20260501T120007Z"
    finally:
        monkeypatch.undo()
        time.tzset()


def test_only_a_folder_this_tool_wrote_is_a_run_folder(tmp_path: Path) -> None:
    assert not is_run_folder(tmp_path)  # no run.json
    (tmp_path / "run.json").write_text(json.dumps({"tool": "sglang-difflab", "schema": 1}))
    assert is_run_folder(tmp_path)
    (tmp_path / "run.json").write_text(json.dumps({"tool": "another-tool"}))
    assert not is_run_folder(tmp_path)
    (tmp_path / "run.json").write_text(json.dumps(["sglang-difflab"]))
    assert not is_run_folder(tmp_path)
    (tmp_path / "run.json").write_text("{not json")
    assert not is_run_folder(tmp_path)


def test_run_json_records_the_command_its_outcome_and_the_matrix_as_used(tmp_path: Path) -> None:
    started = dt.datetime(2026, 12, 1, 9, 30, 0, tzinfo=dt.UTC)
    record = RunRecord("backport", ["38935", "41404"], ["difflab", "backport"], started, {"runner": "warm"})
    matrix = tmp_path / "upstream.toml"
    matrix.write_text("# the matrix\n")
    folder = tmp_path / "out"
    folder.mkdir()
    path = record.write(folder, 1, matrix=(matrix, "a" * 64), environment={"python": "3.11"}, finished=started)
    assert path == folder / "run.json" and is_run_folder(folder)
    doc = json.loads(path.read_text())
    assert path.read_text() == json.dumps(doc, indent=2, sort_keys=True) + "\n"
    assert doc == {
        "runner": "warm",
        "matrix": {"path": os.path.relpath(matrix, checkout_root()), "sha256": "a" * 64},  # from the checkout
        "schema": 1,
        "tool": "sglang-difflab",
        "tool_version": __version__,
        "command": "backport",
        "argv": ["difflab", "backport"],
        "started_at": "2026-12-01T09:30:00Z",
        "finished_at": "2026-12-01T09:30:00Z",
        "fixes": ["38935", "41404"],
        "exit_code": 1,
    }
    assert (folder / "matrix.toml").read_text() == "# the matrix\n"
    assert json.loads((folder / "environment.json").read_text()) == {"python": "3.11"}
    bare = tmp_path / "bare"
    bare.mkdir()
    RunRecord("merge", started=started).write(bare, 0)
    assert sorted(p.name for p in bare.iterdir()) == ["run.json"]  # no matrix, no environment given
    assert json.loads((bare / "run.json").read_text())["finished_at"] >= "2026-12-01T09:30:00Z"


def test_the_matrix_is_named_relative_to_the_checkout_or_the_installed_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checkout = checkout_root()
    assert checkout is not None  # the suite runs from a checkout (or a copy of its layout)
    inside = checkout / "matrices" / "upstream.toml"
    assert matrix_reference(inside, "b" * 64) == {"path": "matrices/upstream.toml", "sha256": "b" * 64}
    assert matrix_reference(Path("m.toml"), "c" * 64) == {"path": "m.toml", "sha256": "c" * 64}
    site = tmp_path / "site-packages" / "difflab"
    (site / "matrices").mkdir(parents=True)
    (site / "matrices" / "upstream.toml").write_text("")
    monkeypatch.setattr(record_module, "checkout_root", lambda: None)
    monkeypatch.setattr(record_module, "installed_package", lambda: site)
    installed = matrix_reference(site / "matrices" / "upstream.toml", "d" * 64)
    assert installed == {"path": "difflab/matrices/upstream.toml", "sha256": "d" * 64}
    elsewhere = tmp_path / "mine.toml"
    assert matrix_reference(elsewhere, "e" * 64) == {"path": str(elsewhere), "sha256": "e" * 64}
