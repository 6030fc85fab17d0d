"""The run-folder and file writer: a result appears whole or not at all, and a failed writer never replaces
a good result or leaves anything behind."""

from __future__ import annotations

import contextlib
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


# -- removing trees ---------------------------------------------------------------------------------------


def _rmtree_as_a_user(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``shutil.rmtree`` refuse, as the kernel does for anyone but root, to empty a read-only folder."""
    real_rmtree = atomic.shutil.rmtree

    def rmtree(path: str | Path, ignore_errors: bool = False) -> None:
        for folder, dirs, files in os.walk(path):
            if (dirs or files) and not os.stat(folder).st_mode & stat.S_IWUSR:
                if ignore_errors:
                    return
                raise PermissionError(13, "Permission denied", folder)
        real_rmtree(path)

    monkeypatch.setattr(atomic.shutil, "rmtree", rmtree)


def _read_only_tree(root: Path) -> Path:
    """A materialised source tree: read-only files in read-only folders."""
    (root / "sglang" / "srt").mkdir(parents=True)
    (root / "sglang" / "srt" / "a.py").write_text("x = 1\n")
    (root / "sglang" / "srt" / "a.py").chmod(0o444)
    (root / "sglang" / "srt").chmod(0o555)
    (root / "sglang").chmod(0o555)
    return root


def test_a_read_only_tree_is_removed_even_where_the_kernel_enforces_the_modes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not running as root, a read-only folder cannot be emptied until it is made writable again."""
    _rmtree_as_a_user(monkeypatch)
    tree = _read_only_tree(tmp_path / "tree")
    assert atomic.remove_tree(tree) is None
    assert entries(tmp_path) == []


def test_removing_a_tree_never_raises_even_when_part_of_it_cannot_be_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A folder owned by someone else can neither be emptied nor made writable: it stays, silently."""
    _rmtree_as_a_user(monkeypatch)
    tree = _read_only_tree(tmp_path / "tree")

    def chmod(path: str | Path, mode: int) -> None:
        raise PermissionError(1, "Operation not permitted", str(path))

    monkeypatch.setattr(atomic.os, "chmod", chmod)
    atomic.remove_tree(tree)
    assert (tree / "sglang" / "srt" / "a.py").read_text() == "x = 1\n"


def test_a_file_or_a_link_is_removed_and_a_link_target_kept(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.mkdir()
    target.chmod(0o755)
    (target / "keep").write_text("keep\n")
    link = tmp_path / "link"
    link.symlink_to(target, target_is_directory=True)
    atomic.remove_tree(link)
    plain = tmp_path / "plain.json"
    plain.write_text("{}")
    atomic.remove_tree(plain)
    atomic.remove_tree(tmp_path / "never-there")
    assert entries(tmp_path) == ["elsewhere"] and (target / "keep").read_text() == "keep\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o755


def test_a_file_that_cannot_be_removed_is_left_without_raising(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file in a folder the user may not write to cannot be unlinked: it stays, silently."""
    plain = tmp_path / "plain.json"
    plain.write_text("{}")

    def unlink(self: Path, missing_ok: bool = False) -> None:
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "unlink", unlink)
    atomic.remove_tree(plain)
    assert plain.read_text() == "{}"


# -- the partial folder's lock ----------------------------------------------------------------------------


def test_the_lock_file_says_whose_it_is_and_is_made_under_a_temporary_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened: list[str] = []
    real_open = os.open

    def recording_open(path: str | Path, flags: int, mode: int = 0o777) -> int:
        opened.append(Path(path).name)
        return real_open(path, flags, mode)

    monkeypatch.setattr(atomic.os, "open", recording_open)
    old = os.umask(0o022)
    try:
        with atomic_folder(tmp_path / "run") as work:
            lock = work.with_name(work.name + ".lock")
            assert lock.read_bytes() == b"sglang-difflab partial folder\n"
            assert stat.S_IMODE(lock.stat().st_mode) == 0o644
            assert entries(tmp_path) == sorted([work.name, lock.name])
    finally:
        os.umask(old)
    assert entries(tmp_path) == ["run"]
    assert len(opened) == 1 and opened[0].startswith(f"{lock.name}.") and opened[0].endswith(".tmp")
    assert len(opened[0]) == len(f"{lock.name}.") + 8 + len(".tmp")


def test_a_failure_while_taking_the_lock_leaves_nothing_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_replace = os.replace

    def failing_replace(src: str | Path, dst: str | Path) -> None:
        if str(dst).endswith(".lock"):
            raise OSError(28, "No space left on device")
        real_replace(src, dst)

    monkeypatch.setattr(atomic.os, "replace", failing_replace)
    with pytest.raises(OSError, match="No space left on device"), atomic_folder(tmp_path / "run"):
        pass
    assert entries(tmp_path) == []


def test_an_interrupt_just_after_the_lock_is_in_place_is_not_masked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C landing right after the lock file's rename still reads as an interrupt; the next writer tidies."""
    real_replace = os.replace

    def interrupted_replace(src: str | Path, dst: str | Path) -> None:
        real_replace(src, dst)
        if str(dst).endswith(".lock"):
            raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(atomic.os, "replace", interrupted_replace)
        with pytest.raises(KeyboardInterrupt), atomic_folder(tmp_path / "run"):
            pass
    with atomic_folder(tmp_path / "run") as work:
        (work / "a").write_text("a")
    assert entries(tmp_path) == ["run"]


def test_a_lock_file_tidied_away_by_someone_else_does_not_fail_the_write(tmp_path: Path) -> None:
    with atomic_folder(tmp_path / "run") as work:
        (work / "diff.json").write_text("new\n")
        work.with_name(work.name + ".lock").unlink()
    assert (tmp_path / "run" / "diff.json").read_text() == "new\n"
    assert entries(tmp_path) == ["run"]


# -- cleaning up after killed writers ---------------------------------------------------------------------


def _left_by_a_killed_writer(parent: Path, name: str) -> Path:
    """What a writer killed inside ``atomic_folder`` leaves: its partial folder and its (unheld) lock file."""
    work = parent / f".{name}.partial-{name[-4:]}"
    work.mkdir(parents=True)
    (work / "half.json").write_text("{")
    (parent / f"{work.name}.lock").write_bytes(b"sglang-difflab partial folder\n")
    return work


def test_every_stale_partial_folder_is_removed_among_other_entries(tmp_path: Path) -> None:
    for name in ("notes.txt", ".hidden", "run-old", "z.lock"):
        (tmp_path / name).write_text("mine\n")
    for n in range(3):  # lock-shaped entries that cannot be opened: a dangling link, a folder
        (tmp_path / f".broken{n}.partial-000{n}.lock").symlink_to(tmp_path / "gone")
        (tmp_path / f".odd{n}.partial-000{n}.lock").mkdir()
    (tmp_path / ".foreign.partial-1111.lock").write_text("someone else's lock\n")
    (tmp_path / ".foreign.partial-1111").mkdir()
    stale = [_left_by_a_killed_writer(tmp_path, f"run{n}a{n}b{n}c") for n in range(1, 4)]
    assert sorted(atomic.clean_stale_partials(tmp_path)) == sorted(stale)
    assert entries(tmp_path) == [
        ".broken0.partial-0000.lock",
        ".broken1.partial-0001.lock",
        ".broken2.partial-0002.lock",
        ".foreign.partial-1111",
        ".foreign.partial-1111.lock",
        ".hidden",
        ".odd0.partial-0000.lock",
        ".odd1.partial-0001.lock",
        ".odd2.partial-0002.lock",
        "notes.txt",
        "run-old",
        "z.lock",
    ]


def test_visible_folders_that_only_look_like_partial_ones_are_left_alone(tmp_path: Path) -> None:
    """A copy taken out for inspection, without the leading dot, is the user's."""
    copy = tmp_path / "run.partial-kept"
    copy.mkdir()
    (copy / "half.json").write_text("{")
    (tmp_path / "run.partial-kept.lock").write_bytes(b"sglang-difflab partial folder\n")
    (tmp_path / "run.lock").write_bytes(b"sglang-difflab partial folder\n")
    (tmp_path / "run").mkdir()
    assert atomic.clean_stale_partials(tmp_path) == []
    assert entries(tmp_path) == ["run", "run.lock", "run.partial-kept", "run.partial-kept.lock"]
    assert (copy / "half.json").read_text() == "{"


def test_two_writers_cleaning_the_same_folder_at_once_both_carry_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The other writer removes the stale folder and its lock between this one's open and its lock."""
    stale = _left_by_a_killed_writer(tmp_path, "run1abcd")
    real_open = os.open
    raced: list[Path] = []

    def open_then_lose_the_race(path: str | Path, flags: int, mode: int = 0o777, **kw: int) -> int:
        fd = real_open(path, flags, mode, **kw)
        if not raced and str(path).endswith(".lock"):
            raced.append(Path(path))
            assert atomic.clean_stale_partials(tmp_path) == [stale]
        return fd

    monkeypatch.setattr(atomic.os, "open", open_then_lose_the_race)
    atomic.clean_stale_partials(tmp_path)
    assert raced == [tmp_path / f"{stale.name}.lock"]
    assert entries(tmp_path) == []


def test_a_missing_parent_has_nothing_to_clean(tmp_path: Path) -> None:
    assert atomic.clean_stale_partials(tmp_path / "absent") == []


def test_live_writers_are_passed_over_and_the_stale_folders_beside_them_removed(tmp_path: Path) -> None:
    with contextlib.ExitStack() as writers:
        live = [writers.enter_context(atomic_folder(tmp_path / f"live{n}")) for n in range(3)]
        stale = [_left_by_a_killed_writer(tmp_path, f"run{n}a{n}b{n}c") for n in range(1, 4)]
        assert sorted(atomic.clean_stale_partials(tmp_path)) == sorted(stale)
        assert all(work.is_dir() for work in live)
    assert entries(tmp_path) == ["live0", "live1", "live2"]
