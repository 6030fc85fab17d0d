"""``--out`` never costs anyone a file: only new, empty or (with --force) earlier results folders are replaced.

The commands are driven for real: ``difflab merge`` on observations of the published bundle (no
probes run, so it is quick), ``difflab run`` where the refusal must come before any work starts.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from difflab.cli import main
from difflab.errors import ConfigError
from difflab.files.atomic import atomic_folder, check_out, clean_stale_partials
from difflab.paths import repo_root
from difflab.report.record import is_run_folder

PUBLISHED = repo_root() / "results" / "published" / "upstream"


@pytest.fixture
def cell(tmp_path: Path) -> Path:
    """An observe-style folder: the published observations of every fix and the matrix they were made with
    (merge judges every fix of the matrix; one without observations would be an error)."""
    folder = tmp_path / "cell"
    shutil.copytree(PUBLISHED / "observations", folder / "observations")
    shutil.copyfile(PUBLISHED / "matrix.toml", folder / "matrix.toml")
    return folder


def merge_into(cell: Path, out: Path, *extra: str) -> int:
    return main(["merge", str(cell), "--out", str(out), "--no-bundle", *extra])


def test_a_folder_of_the_users_own_files_is_refused_even_with_force(
    cell: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mine = tmp_path / "thesis"
    mine.mkdir()
    (mine / "chapter1.tex").write_text("years of work\n")
    for extra in ((), ("--force",)):
        assert merge_into(cell, mine, *extra) == 2
        err = capsys.readouterr().err
        assert f"--out {mine}" in err and "not difflab results" in err
        assert sorted(p.name for p in mine.iterdir()) == ["chapter1.tex"]
    assert not [p for p in tmp_path.iterdir() if ".partial-" in p.name]


def test_an_earlier_results_folder_is_replaced_only_with_force(
    cell: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "merged"
    assert merge_into(cell, out) == 0
    assert is_run_folder(out)
    (out / "marker").write_text("first run")
    assert merge_into(cell, out) == 2
    assert "pass --force" in capsys.readouterr().err
    assert (out / "marker").exists()
    assert merge_into(cell, out, "--force") == 0
    assert not (out / "marker").exists() and (out / "diff.json").is_file()


def test_an_empty_folder_is_used(cell: Path, tmp_path: Path) -> None:
    out = tmp_path / "empty"
    out.mkdir()
    assert merge_into(cell, out) == 0 and (out / "run.json").is_file()


def test_an_existing_file_is_refused_before_the_run_starts(tmp_path: Path) -> None:
    """No registry is reachable: a run that got as far as its sources would say so; this one must not."""
    target = tmp_path / "results.txt"
    target.write_text("keep me\n")
    env = {
        **os.environ,
        "DIFFLAB_CACHE": str(tmp_path / "cache"),
        "PIP_INDEX_URL": "http://127.0.0.1:9/simple",
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_RETRIES": "0",
    }
    out = subprocess.run(
        [sys.executable, "-m", "difflab", "run", "--fix", "38935", "--out", str(target), "--no-bundle"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert out.returncode == 2, out.stderr
    assert "exists and is not a folder" in out.stderr
    assert "could not download" not in out.stderr and "source " not in out.stderr
    assert target.read_text() == "keep me\n"
    assert not (tmp_path / "cache" / "wheels").exists()


@pytest.mark.parametrize("where", ["cwd", "home", "repo", "cache", "cache-parent"])
def test_protected_folders_are_refused_even_when_they_look_like_results(
    where: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home, cache, work = tmp_path / "home", tmp_path / "var" / "cache", tmp_path / "work"
    for folder in (home, cache, work):
        folder.mkdir(parents=True)
        (folder / "run.json").write_text('{"tool": "sglang-difflab"}')
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("DIFFLAB_CACHE", str(cache))
    monkeypatch.chdir(work)
    target = {"cwd": work, "home": home, "repo": repo_root(), "cache": cache, "cache-parent": cache.parent}[where]
    with pytest.raises(ConfigError, match=r"--out .*: (is|contains) "):
        check_out(target, force=True, ours=lambda _p: True)
    check_out(tmp_path / "elsewhere", force=True, ours=lambda _p: True)  # a folder of its own is fine


def _killed_writer(parent: Path, name: str) -> None:
    """A writer SIGKILLed inside atomic_folder: it leaves its partial folder behind."""
    code = (
        "import os, signal, sys\n"
        "from pathlib import Path\n"
        "from difflab.files.atomic import atomic_folder\n"
        "with atomic_folder(Path(sys.argv[1])) as work:\n"
        "    (work / 'half.json').write_text('{')\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code, str(parent / name)], timeout=60)
    assert proc.returncode == -signal.SIGKILL


def test_partial_folders_of_a_killed_run_are_cleaned_by_the_next_run(cell: Path, tmp_path: Path) -> None:
    results = tmp_path / "results"
    results.mkdir()
    _killed_writer(results, "run1")
    left = [p for p in results.iterdir() if p.is_dir()]
    assert len(left) == 1 and ".run1.partial-" in left[0].name
    foreign = results / ".notes.partial-mine"  # same shape, but not ours: no lock file of ours
    foreign.mkdir()
    (foreign / "keep").write_text("x")
    assert merge_into(cell, results / "run2") == 0
    names = sorted(p.name for p in results.iterdir())
    assert names == [".notes.partial-mine", "run2"], names


def test_a_partial_folder_whose_writer_is_alive_is_left_alone(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    code = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from difflab.files.atomic import atomic_folder\n"
        "with atomic_folder(Path(sys.argv[1])) as work:\n"
        "    Path(sys.argv[2]).write_text(str(work))\n"
        "    time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "slow"), str(ready)])
    try:
        deadline = time.monotonic() + 30
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        work = Path(ready.read_text())
        assert clean_stale_partials(tmp_path) == []
        assert work.is_dir()
    finally:
        proc.kill()
        proc.wait()
    assert clean_stale_partials(tmp_path) == [work]
    assert not work.exists()


def test_read_only_trees_are_removed_with_their_partial_folder(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError), atomic_folder(tmp_path / "tree") as work:
        (work / "sglang").mkdir()
        (work / "sglang" / "a.py").write_text("x = 1\n")
        (work / "sglang" / "a.py").chmod(0o444)
        (work / "sglang").chmod(0o555)
        raise RuntimeError("unpacking failed")
    assert list(tmp_path.iterdir()) == []


@pytest.fixture
def places(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """A home folder, a cache and a working directory of their own (the repository is this checkout)."""
    home, cache, work = tmp_path / "home", tmp_path / "var" / "cache", tmp_path / "work"
    for folder in (home, cache, work):
        folder.mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("DIFFLAB_CACHE", str(cache))
    monkeypatch.chdir(work)
    return {"home": home.resolve(), "cache": cache.resolve(), "work": work.resolve(), "tmp": tmp_path.resolve()}


def refusal(out: Path) -> str:
    """The message ``check_out`` refuses ``out`` with (``--force`` given, ``out`` taken for results)."""
    with pytest.raises(ConfigError) as err:
        check_out(out, force=True, ours=lambda _p: True)
    return str(err.value)


def test_each_protected_folder_is_named_in_the_refusal(places: dict[str, Path]) -> None:
    own = "; choose a folder of its own for the results"
    home, cache, work, repo = places["home"], places["cache"], places["work"], repo_root()
    assert refusal(work) == f"--out {work}: is the working directory{own}"
    assert refusal(home) == f"--out {home}: is your home folder{own}"
    assert refusal(repo) == f"--out {repo}: is the repository root{own}"
    assert refusal(cache) == f"--out {cache}: is the cache{own}"
    assert refusal(cache.parent) == f"--out {cache.parent}: contains the cache ({cache}){own}"


def test_the_working_directory_is_named_first_then_the_home_folder(
    places: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Running from the home folder names the working directory; a checkout in the home folder names home."""
    own = "; choose a folder of its own for the results"
    home = places["home"]
    monkeypatch.chdir(home)
    assert refusal(home) == f"--out {home}: is the working directory{own}"
    checkouts = repo_root().parent
    monkeypatch.chdir("/")  # a working directory outside the checkouts' folder, wherever the clone lies
    monkeypatch.setenv("HOME", str(checkouts))
    assert refusal(checkouts) == f"--out {checkouts}: is your home folder{own}"


def test_without_a_known_home_folder_the_other_places_are_still_protected(
    places: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A container user with no passwd entry and no $HOME."""
    import pwd

    def no_such_user(uid: int) -> pwd.struct_passwd:
        raise KeyError(f"getpwuid(): uid not found: {uid}")

    monkeypatch.delenv("HOME")
    monkeypatch.setattr(pwd, "getpwuid", no_such_user)
    work = places["work"]
    assert refusal(work) == f"--out {work}: is the working directory; choose a folder of its own for the results"
    check_out(places["tmp"] / "results", force=False, ours=lambda _p: False)


def test_a_removed_working_directory_does_not_stop_the_checks(
    places: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    gone = places["tmp"] / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    home = places["home"]
    assert refusal(home) == f"--out {home}: is your home folder; choose a folder of its own for the results"
    check_out(places["tmp"] / "results", force=False, ours=lambda _p: False)


def test_the_refusals_of_an_existing_out_say_what_was_found(places: dict[str, Path]) -> None:
    notes = places["tmp"] / "notes.txt"
    notes.write_text("keep me\n")
    with pytest.raises(ConfigError) as err:
        check_out(notes, force=True, ours=lambda _p: True)
    assert str(err.value) == f"--out {notes}: exists and is not a folder; nothing was written"
    mine = places["tmp"] / "thesis"
    mine.mkdir()
    (mine / "chapter1.tex").write_text("years of work\n")
    with pytest.raises(ConfigError) as err:
        check_out(mine, force=True, ours=lambda _p: False)
    assert str(err.value) == (
        f"--out {mine}: exists and holds files that are not difflab results (no run.json written by "
        "sglang-difflab); nothing was changed; choose a new folder"
    )
    with pytest.raises(ConfigError) as err:
        check_out(mine, force=False, ours=lambda _p: True)
    assert str(err.value) == f"--out {mine}: holds previous difflab results; pass --force to replace them"
    assert notes.read_text() == "keep me\n" and (mine / "chapter1.tex").read_text() == "years of work\n"
