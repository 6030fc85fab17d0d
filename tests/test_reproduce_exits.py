"""``difflab reproduce`` of sealed runs of the tiny tree: what it re-runs, how it exits, what it keeps.

A ``run`` of :mod:`workflow_tree`'s git repository (``--backend subprocess``, signed with a key of the test's
own) is a real bundle; reproducing it re-runs its recorded pins through the lab's run workflow, so the
request it rebuilds from run.json (the fixes, the source, the back end) decides what runs again. A
difference is made honestly, the way it happens: the lab's probes changed since the bundle was sealed.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest

from difflab.bundle import trust
from difflab.cli import main
from difflab.errors import ConfigError
from difflab.workflows.reproduce import reproduce
from test_bundle_support import isolated_config, make_key  # noqa: F401 - isolated_config is an autouse fixture
from workflow_tree import DOOR_PROBE, TinyRepo, fix_entry, matrix_text, tiny_repo, write_probes

FAST = ["--backend", "subprocess", "--no-cache"]


@pytest.fixture(scope="module")
def repo() -> TinyRepo:
    return tiny_repo()


@pytest.fixture(autouse=True)
def tiny_probes(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DIFFLAB_PROBES", str(write_probes(tmp_path_factory.getbasetemp() / "tiny-probes")))


def sealed_run(repo: TinyRepo, tmp_path: Path, *extra: str) -> tuple[Path, Path]:
    """A signed run folder of fix 1 (confirmed) and fix 2 (not fixed), and the public key that vouches for it."""
    private, public = make_key(tmp_path / "keys")
    path = tmp_path / "matrix" / "upstream.toml"
    path.parent.mkdir(parents=True)
    base, head = repo.commits["base"], repo.commits["head"]
    path.write_text(matrix_text(fix_entry("1", base, head), fix_entry("2", base, base)))
    out = tmp_path / "recorded"
    argv = ["run", "--source", "git", "--repo", str(repo.path), "--matrix", str(path), "--out", str(out)]
    main([*argv, *FAST, "--key", str(private), *extra])
    assert (out / "SHA256SUMS").is_file()
    return out, public


def read(out: Path, name: str) -> dict:
    return json.loads((out / name).read_text())


def test_a_sealed_run_reproduces_its_recorded_fixes_and_keeps_the_rerun_where_asked(
    repo: TinyRepo, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Only ``--fix 1`` was recorded: the re-run judges fix 1 alone, from the recorded repository and back end."""
    recorded, public = sealed_run(repo, tmp_path, "--fix", "1")
    rerun = tmp_path / "rerun"
    assert main(["reproduce", str(recorded), "--key", str(public), "-o", str(rerun)]) == 0
    said = capsys.readouterr().out
    assert f"reproduced {recorded}: every verdict and observed field matches" in said
    assert f"re-run written to {rerun}" in said and "note:" not in said
    assert [(f["id"], f["verdict"]) for f in read(rerun, "diff.json")["fixes"]] == [("1", "confirmed")]
    record = read(rerun, "run.json")
    assert (record["fixes"], record["source_kind"], record["repo"]) == (["1"], "git", str(repo.path))
    assert record["runner"]["name"] == "subprocess" and record["sides"] == ["base", "head"]
    assert not (rerun / "SHA256SUMS").exists()  # a re-run is compared, never sealed


def test_a_reproduction_without_out_leaves_no_rerun_behind(
    repo: TinyRepo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both fixes recorded (one not fixed: the recording exits 1, and still reproduces)."""
    recorded, public = sealed_run(repo, tmp_path)
    assert read(recorded, "run.json")["exit_code"] == 1
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    report = reproduce(recorded, trust.build(key_files=[public]))
    assert report.matches and report.differences == [] and report.notes == []
    assert report.rerun_dir is None and list(scratch.iterdir()) == []


def test_probes_changed_since_the_seal_are_a_difference_and_a_note(
    repo: TinyRepo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The door probe now reads a valid request the other way: each side's field differs, and fix 1's verdict."""
    recorded, public = sealed_run(repo, tmp_path, "--fix", "1")
    changed = write_probes(tmp_path / "changed-probes")
    (changed / "tiny_door.py").write_text(
        DOOR_PROBE.replace('"valid.admitted": admit(', '"valid.admitted": not admit(')
    )
    monkeypatch.setenv("DIFFLAB_PROBES", str(changed))
    capsys.readouterr()
    assert main(["reproduce", str(recorded), "--key", str(public)]) == 1
    said = capsys.readouterr().out
    assert f"difference(s) from {recorded}:" in said
    assert "fix 1 base tiny_door field valid.admitted: recorded true, now false" in said
    assert "fix 1 head tiny_door field valid.admitted: recorded true, now false" in said
    assert "note: probes differ: recorded sha256 " in said and "re-run written to" not in said


def test_an_existing_out_is_refused_before_anything_runs(repo: TinyRepo, tmp_path: Path) -> None:
    recorded, public = sealed_run(repo, tmp_path, "--fix", "1")
    taken = tmp_path / "taken"
    taken.mkdir()
    with pytest.raises(ConfigError) as err:
        reproduce(recorded, trust.build(key_files=[public]), out=taken)
    assert str(err.value) == f"{taken}: already exists; choose a new folder for the re-run"
    assert list(taken.iterdir()) == []
