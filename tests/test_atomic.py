"""The run-folder and file writer: a result appears whole or not at all, and a failed writer never replaces
a good result or leaves anything behind."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from difflab.errors import ConfigError
from difflab.files import atomic
from difflab.files.atomic import atomic_folder, write_atomic


def entries(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def good_result(tmp_path: Path) -> Path:
    out = tmp_path / "results" / "run"
    out.mkdir(parents=True)
    (out / "diff.json").write_text("good\n")
    (out / "old-only.txt").write_text("from the previous run\n")
    return out


def test_a_new_folder_appears_only_when_complete(tmp_path: Path) -> None:
    out = tmp_path / "deep" / "results" / "run"
    with atomic_folder(out) as work:
        assert work.parent == out.parent and work.name.startswith(".run.partial-")
        assert not out.exists()
        (work / "diff.json").write_text("new\n")
    assert (out / "diff.json").read_text() == "new\n"
    assert entries(out.parent) == ["run"]


def test_an_existing_result_is_replaced_whole_and_the_old_one_removed(tmp_path: Path) -> None:
    out = good_result(tmp_path)
    with atomic_folder(out) as work:
        (work / "diff.json").write_text("new\n")
        assert (out / "diff.json").read_text() == "good\n"  # untouched until the new one is complete
    assert entries(out) == ["diff.json"] and (out / "diff.json").read_text() == "new\n"
    assert entries(out.parent) == ["run"]  # neither the old folder nor the work folder is left behind


@pytest.mark.parametrize("failure", [RuntimeError("probe crashed"), KeyboardInterrupt()])
def test_a_failed_writer_never_replaces_a_good_result(tmp_path: Path, failure: BaseException) -> None:
    out = good_result(tmp_path)
    with pytest.raises(type(failure)), atomic_folder(out) as work:
        (work / "diff.json").write_text("half\n")
        raise failure
    assert entries(out) == ["diff.json", "old-only.txt"] and (out / "diff.json").read_text() == "good\n"
    assert entries(out.parent) == ["run"]


def test_a_failed_first_run_leaves_nothing(tmp_path: Path) -> None:
    out = tmp_path / "run"
    with pytest.raises(RuntimeError), atomic_folder(out) as work:
        (work / "x").write_text("x")
        raise RuntimeError("boom")
    assert entries(tmp_path) == []


def test_a_file_at_out_is_refused_not_replaced(tmp_path: Path) -> None:
    out = tmp_path / "run"
    out.write_text("someone's notes\n")
    with pytest.raises(ConfigError) as err, atomic_folder(out) as work:
        (work / "diff.json").write_text("new\n")
    assert str(err.value) == f"--out {out} exists and is not a folder"
    assert out.read_text() == "someone's notes\n"
    assert entries(tmp_path) == ["run"]


def test_a_relative_out_is_resolved(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with atomic_folder(Path("out")) as work:
        assert work.is_absolute() and work.parent == tmp_path
        (work / "a").write_text("a")
    assert (tmp_path / "out" / "a").read_text() == "a"


def test_keep_existing_keeps_whichever_got_there_first(tmp_path: Path) -> None:
    out = good_result(tmp_path)
    with atomic_folder(out, keep_existing=True) as work:
        (work / "diff.json").write_text("second\n")
    assert (out / "diff.json").read_text() == "good\n"
    assert entries(out.parent) == ["run"]
    fresh = tmp_path / "cache" / "entry"
    with atomic_folder(fresh, keep_existing=True) as work:
        (work / "a").write_text("a")
    assert entries(fresh) == ["a"] and entries(fresh.parent) == ["entry"]


def test_a_concurrent_writer_that_wins_the_rename(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another process puts the folder there between the check and the rename."""
    real_replace = os.replace

    def racing_replace(src: str | Path, dst: str | Path) -> None:
        if Path(dst).name in ("entry", "other"):  # the results folder, not the writer's own lock file
            Path(dst).mkdir(exist_ok=True)
            (Path(dst) / "theirs").write_text("theirs")
        real_replace(src, dst)  # a non-empty folder cannot be replaced: OSError

    out = tmp_path / "entry"
    monkeypatch.setattr(atomic.os, "replace", racing_replace)
    with atomic_folder(out, keep_existing=True) as work:
        (work / "mine").write_text("mine")
    assert entries(out) == ["theirs"] and entries(tmp_path) == ["entry"]

    other = tmp_path / "other"
    with pytest.raises(OSError), atomic_folder(other) as work:
        (work / "mine").write_text("mine")
    assert entries(other) == ["theirs"] and entries(tmp_path) == ["entry", "other"]


# -- single files -----------------------------------------------------------------------------------------


def test_write_atomic_writes_text_and_bytes_creating_folders(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "run.json"
    assert write_atomic(target, "héllo\n") == target
    assert target.read_bytes() == "héllo\n".encode()
    write_atomic(target, b"\x00\xff")
    assert target.read_bytes() == b"\x00\xff"
    assert entries(target.parent) == ["run.json"]


def test_write_atomic_leaves_the_umask_to_decide_the_mode(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        write_atomic(tmp_path / "f", "x")
        os.umask(0o000)
        write_atomic(tmp_path / "g", "x")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "f").stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "g").stat().st_mode) == 0o666


def test_a_failed_write_keeps_the_old_file_and_removes_its_temporary(tmp_path: Path) -> None:
    target = tmp_path / "summary.md"
    target.write_text("good\n")
    with pytest.raises(TypeError):
        write_atomic(target, 42)  # type: ignore[arg-type]
    assert target.read_text() == "good\n" and entries(tmp_path) == ["summary.md"]
    folder = tmp_path / "a-folder"
    folder.mkdir()
    with pytest.raises(IsADirectoryError):
        write_atomic(folder, "x")
    assert entries(tmp_path) == ["a-folder", "summary.md"]


def test_temporary_names_do_not_collide(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str] = []
    real_open = os.open

    def recording_open(path: str | Path, flags: int, mode: int = 0o777) -> int:
        seen.append(Path(path).name)
        assert flags & os.O_EXCL and flags & os.O_CREAT
        return real_open(path, flags, mode)

    monkeypatch.setattr(atomic.os, "open", recording_open)
    write_atomic(tmp_path / "x.json", "1")
    write_atomic(tmp_path / "x.json", "2")
    assert len(set(seen)) == 2
    assert all(name.startswith(f".x.json.{os.getpid()}-") and name.endswith(".part") for name in seen)
    assert all(len(name) == len(f".x.json.{os.getpid()}-") + 8 + len(".part") for name in seen)
