"""The package ships everything its commands read, and runs installed, away from any checkout.

- the wheel's file list against what the commands read: every file under ``probes/`` and
  ``matrices/`` (a new probe, harness module, subfolder or matrix included, added here to a copy of
  the project), every probe the default matrix names, every data file of ``difflab``;
- the unpacked wheel, imported from outside the checkout, resolves its own probes and matrix, and
  its probes digest is the checkout's; a zip-imported package stages its probes into the cache;
- ``ci/wheel_check.py`` (``nox -s wheel``): sdist and wheel built, installed into a fresh virtualenv,
  ``run``/``verify``/``backport`` from a temporary folder;
- run.json's probes record and what ``reproduce`` says when the lab differs from the recording.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from difflab import __version__, paths, provenance
from difflab.cli import main as cli
from difflab.errors import ConfigError
from difflab.matrix import load_matrix
from difflab.workflows.reproduce import lab_mismatches

ROOT = Path(__file__).resolve().parents[1]
ADDED = {
    "probes/pr99999_packaging_check.py": "def observe(kit):\n    return {}\n",
    "probes/harness/packaging_check.py": "X = 1\n",
    "probes/throughput/pr99999_packaging_check.py": "def workloads(kit):\n    return {}\n",
    "probes/packaging_data/helper.py": "Y = 2\n",  # a new subfolder without __init__.py
    "matrices/packaging-check.toml": "# a second matrix\n",
}
"""Files someone might add: each must ship without an edit to the build configuration."""

pytestmark = pytest.mark.xdist_group("packaging")


def _project_files() -> list[str]:
    """What a checkout holds: tracked files and new ones git does not ignore."""
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True, check=True
    )
    return [f for f in listed.stdout.decode().split("\0") if f and (ROOT / f).is_file()]


def _shipped_sources(project: Path) -> dict[str, Path]:
    """wheel path -> file: what the commands read from probes/, matrices/ and the package's own data."""
    wanted: dict[str, Path] = {}
    for folder in paths.SHIPPED:
        for path in provenance.probe_files(project / folder):
            wanted[f"difflab/{path.relative_to(project).as_posix()}"] = path
    for path in provenance.probe_files(project / "src" / "difflab"):
        wanted[path.relative_to(project / "src").as_posix()] = path
    return wanted


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(a copy of the project with files added under probes/ and matrices/, the wheel built from it)."""
    top = tmp_path_factory.mktemp("packaging")
    project = top / "project"
    for rel in _project_files():
        (project / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, project / rel)
    for rel, text in ADDED.items():
        (project / rel).parent.mkdir(parents=True, exist_ok=True)
        (project / rel).write_text(text)
    # pip's isolated build: the build-system requirements of pyproject.toml, as python -m build uses them
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(top), "."],
        cwd=project,
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = top.glob("*.whl")
    return project, wheel


def test_the_wheel_ships_every_file_the_commands_read(built: tuple[Path, Path]) -> None:
    project, wheel = built
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
    wanted = _shipped_sources(project)
    missing = sorted(set(wanted) - names)
    assert not missing, f"not in the wheel: {missing}"
    assert {f"difflab/{rel}" for rel in ADDED} <= names
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    assert not [n for n in names if n.split("/")[0] in ("probes", "matrices", "tests", "results")], "top-level data"
    matrix = load_matrix(project / "matrices" / "upstream.toml")
    for fix in matrix.fixes:
        for spec in fix.probes:
            assert f"difflab/probes/{spec.name}.py" in names, (fix.id, spec.name)
        if fix.throughput:
            assert f"difflab/probes/throughput/{fix.throughput}.py" in names, fix.id


RESOLVE = """
import json, sys
from importlib import resources
from difflab import paths, provenance
from difflab.matrix import load_matrix
from difflab.runner.jobs import check_probe_files
matrix = load_matrix(paths.default_matrix())
check_probe_files(matrix.fixes, matrix.path)
throughput = [str(paths.probes_dir() / "throughput" / f"{f.throughput}.py") for f in matrix.fixes if f.throughput]
data = [resources.files("difflab.environment").joinpath(n).read_text()[:0] for n in ("cpu-requirements.txt",)]
print(json.dumps({
    "checkout": str(paths.checkout_root()), "probes": str(paths.probes_dir()), "matrix": str(matrix.path),
    "lock": str(paths.default_release_lock()), "digest": provenance.probes_digest(paths.probes_dir()),
    "record": provenance.probes_record(), "throughput": throughput,
}))
"""


def _outside(tmp_path: Path, pythonpath: Path, code: str = RESOLVE) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DIFFLAB_PROBES")}
    env |= {"PYTHONPATH": str(pythonpath), "DIFFLAB_CACHE": str(tmp_path / "cache")}
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_the_unpacked_wheel_reads_its_own_probes_and_matrix(built: tuple[Path, Path], tmp_path: Path) -> None:
    project, wheel = built
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(site)
    found = _outside(tmp_path, site)
    package = (site / "difflab").resolve()
    assert found["checkout"] == "None"
    assert found["probes"] == str(package / "probes") and found["matrix"] == str(package / "matrices" / "upstream.toml")
    assert found["lock"] == str(package / "matrices" / "releases.lock")
    assert all(Path(p).is_file() and Path(p).is_relative_to(package) for p in found["throughput"])
    assert found["digest"] == provenance.probes_digest(project / "probes")  # the same probes as the checkout's
    assert found["record"]["origin"] == "package"


def test_a_zip_imported_package_stages_its_probes_into_the_cache(built: tuple[Path, Path], tmp_path: Path) -> None:
    project, wheel = built
    found = _outside(tmp_path, wheel)  # a wheel is a zip Python imports from directly
    staged = Path(found["probes"])
    assert staged.is_relative_to((tmp_path / "cache" / "shipped").resolve()), staged
    assert found["digest"] == provenance.probes_digest(project / "probes")
    assert (staged / "harness" / "packaging_check.py").read_text() == ADDED["probes/harness/packaging_check.py"]


def test_the_version_is_written_once() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"] and project["project"]["dynamic"] == ["version"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "difflab.__version__"}


def test_version_option(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        cli(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"difflab {__version__}"


@pytest.mark.sglang
def test_the_installed_wheel_runs_from_a_temporary_folder(tmp_path: Path) -> None:
    """The same script as ``nox -s wheel``: a build, a fresh virtualenv, run/verify/backport outside the checkout."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "ci" / "wheel_check.py"), "--work", str(tmp_path / "check")],
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    print(proc.stdout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "wheel check passed" in proc.stdout and "38935: confirmed" in proc.stdout


# --- what a run records, and what reproduce says --------------------------------------------------------------
def test_probes_record_names_a_folder_of_your_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    own = tmp_path / "my-probes"
    shutil.copytree(ROOT / "probes", own, ignore=shutil.ignore_patterns("__pycache__"))
    assert provenance.probes_record()["origin"] == "checkout"
    monkeypatch.setenv(paths.PROBES_ENV, str(own))
    record = provenance.probes_record()
    assert record == {"origin": paths.PROBES_ENV, "path": str(own.resolve()), "sha256": provenance.probes_digest(own)}
    assert record["sha256"] == provenance.probes_digest(ROOT / "probes")  # same files, same digest
    (own / "pr38935_decode_door.py").write_text("# edited\n")
    assert provenance.probes_record()["sha256"] != provenance.probes_digest(ROOT / "probes")


def _bundle(tmp_path: Path, **run: object) -> Path:
    folder = tmp_path / "bundle"
    folder.mkdir(parents=True)
    (folder / "run.json").write_text(json.dumps(run))
    return folder


def test_reproduce_says_nothing_when_the_lab_is_the_recording_one(tmp_path: Path) -> None:
    folder = _bundle(tmp_path, tool_version=__version__, probes=provenance.probes_record())
    assert lab_mismatches(folder) == []


def test_reproduce_names_another_version_and_what_to_install(tmp_path: Path) -> None:
    folder = _bundle(tmp_path, tool_version="0.0.9", probes=provenance.probes_record())
    (note,) = lab_mismatches(folder)
    assert f"recorded with sglang-difflab 0.0.9, re-run with {__version__}" in note
    assert "pipx install 'sglang-difflab==0.0.9'" in note


def test_reproduce_names_other_probes(tmp_path: Path) -> None:
    recorded = {**provenance.probes_record(), "sha256": "0" * 64, "origin": "package"}
    folder = _bundle(tmp_path, tool_version="0.0.9", probes=recorded)
    version, probes = lab_mismatches(folder)
    assert probes.startswith("probes differ: recorded sha256 0000000000000000 (the probes of 0.0.9), now ")
    assert probes.endswith("pipx install 'sglang-difflab==0.0.9' (or pip install 'sglang-difflab==0.0.9')")
    own = {**recorded, "origin": paths.PROBES_ENV}
    (probes,) = lab_mismatches(_bundle(tmp_path / "own", tool_version=__version__, probes=own))
    assert "(its own probes folder)" in probes and probes.endswith(f"set {paths.PROBES_ENV} to that folder")


# --- installed: shipped data is read, never written -------------------------------------------------------------
@pytest.fixture
def installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This package as if installed into ``tmp_path/site-packages/difflab`` (no checkout around it)."""
    package = tmp_path / "site-packages" / "difflab"
    (package / "matrices").mkdir(parents=True)
    monkeypatch.setattr(paths, "_LAB", package)
    assert paths.checkout_root() is None
    return package


def test_installed_data_is_never_written(installed: Path, tmp_path: Path) -> None:
    lock = installed / "matrices" / "releases.lock"
    with pytest.raises(ConfigError, match="ships inside the installed package and is never written there; pass --lock"):
        paths.refuse_installed(lock, "--lock-file")
    assert paths.refuse_installed(tmp_path / "mine.lock", "--lock-file") == tmp_path / "mine.lock"
    with pytest.raises(ConfigError) as err:
        paths.repo_root()
    assert "an installed package, not a checkout" in str(err.value)


def test_results_go_under_the_working_directory_never_the_package(
    installed: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from difflab.files.atomic import check_out

    monkeypatch.chdir(tmp_path)
    assert paths.default_results() == tmp_path / "results"
    for out in (installed / "results", installed):
        with pytest.raises(ConfigError, match="installed package"):
            check_out(out, force=False, ours=lambda _: False)
    check_out(tmp_path / "results" / "x", force=False, ours=lambda _: False)


def test_an_editable_install_maps_the_shipped_packages_onto_the_checkout() -> None:
    """``pip install -e .`` (as ``nox -s tests`` installs): importlib.resources finds the checkout's own folders."""
    from importlib import metadata, resources

    direct = json.loads(metadata.distribution("sglang-difflab").read_text("direct_url.json") or "{}")
    if Path(direct.get("url", "").removeprefix("file://")) != ROOT or not direct.get("dir_info", {}).get("editable"):
        where = direct.get("url") or "no install record: src/ on PYTHONPATH"
        pytest.skip(f"sglang-difflab is not installed editable from {ROOT} here ({where})")
    assert Path(str(resources.files("difflab.probes"))) == ROOT / "probes"
    assert Path(str(resources.files("difflab.probes.harness"))) == ROOT / "probes" / "harness"
    assert Path(str(resources.files("difflab.matrices"))) == ROOT / "matrices"
    assert paths.probes_dir() == ROOT / "probes" and paths.default_matrix() == ROOT / "matrices" / "upstream.toml"


def test_reproduce_md_names_the_lab_and_its_probes_without_local_paths() -> None:
    from difflab.bundle import instructions

    record = provenance.probes_record()
    text = instructions.render({"tool_version": "0.0.9", "probes": record}, None, "sha256:" + "a" * 64)
    assert "- lab: sglang-difflab 0.0.9 (`pipx install 'sglang-difflab==0.0.9'`)" in text
    assert f"- probes: checkout (sha256 `{record['sha256']}`)" in text and record["path"] not in text
    assert "- probes:" not in instructions.render({"tool_version": "0.0.9"}, None, "sha256:" + "a" * 64)
