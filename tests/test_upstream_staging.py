"""The lab's pytest staged for the test child: which distributions, keyed how, and what lands where.

The closure is read from small distributions written here (a ``.dist-info`` folder each, found on
``sys.path`` the way installed ones are), so requirements spelt two ways, markers, extras, a cycle
and a missing one are all there; the staging itself copies the lab's real pytest.
"""

from __future__ import annotations

import importlib.metadata as metadata
import shutil
from pathlib import Path

import pytest

from difflab.errors import EnvironmentSetupError
from difflab.upstream_tests import staging
from difflab.upstream_tests.staging import MARKER, closure, digest, stage_pytest, versions


def _dist(root: Path, name: str, version: str, *requires: str) -> metadata.Distribution:
    """A distribution as an installer leaves it: ``<name>-<version>.dist-info/METADATA``."""
    info = root / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    lines = [
        "Metadata-Version: 2.1",
        f"Name: {name}",
        f"Version: {version}",
        *(f"Requires-Dist: {r}" for r in requires),
    ]
    (info / "METADATA").write_text("\n".join(lines) + "\n")
    return metadata.PathDistribution(info)


@pytest.fixture
def installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "site"
    _dist(
        root,
        "lab-root",
        "1.0",
        "dep-one",
        "Dep_One>=1",  # the same distribution, spelt as another project spells it
        'dep-two; python_version >= "3"',
        'never-installed; python_version < "3"',
        'extra-only; extra == "test"',
    )
    _dist(root, "dep-one", "1.2")
    _dist(root, "dep-two", "2.0", "lab-root", "dep_three")  # back to the root: a cycle
    _dist(root, "dep-three", "3.0")
    _dist(root, "lab-broken", "1.0", "dep-one", "not-here>=2")
    monkeypatch.syspath_prepend(str(root))
    return root


def _names(dists: list[metadata.Distribution]) -> list[str]:
    return [str(d.metadata["Name"]) for d in dists]


def test_the_closure_holds_each_required_distribution_once_leaving_out_extras_and_other_pythons(
    installed: Path,
) -> None:
    assert _names(closure("lab-root")) == ["dep-one", "dep-three", "dep-two", "lab-root"]
    assert _names(closure("Lab_Root")) == _names(closure("lab-root")), "a name however it is spelt"
    assert _names(closure("dep-three")) == ["dep-three"]


def test_a_required_distribution_that_is_not_installed_stops_the_staging_with_what_to_install(
    installed: Path,
) -> None:
    with pytest.raises(EnvironmentSetupError) as raised:
        closure("lab-broken")
    assert str(raised.value) == (
        "not-here is not installed in the lab's environment; it is needed to run SGLang's "
        "pytest-style test files (pip install pytest)"
    )
    assert raised.value.__cause__ is None and raised.value.__suppress_context__


def test_the_digest_changes_with_any_name_or_version_and_versions_lists_each(tmp_path: Path) -> None:
    a1, a2 = _dist(tmp_path / "1", "alpha", "1.0"), _dist(tmp_path / "2", "alpha", "2.0")
    b1 = _dist(tmp_path / "3", "beta", "1.0")
    assert digest([a1, b1]) == digest([_dist(tmp_path / "4", "alpha", "1.0"), b1]), "names and versions only"
    keys = {digest([a1]), digest([a2]), digest([b1]), digest([a1, b1]), digest([a2, b1]), digest([])}
    assert len(keys) == 6 and all(len(k) == 64 for k in keys)
    assert versions([a2, b1]) == {"alpha": "2.0", "beta": "1.0"}


def test_the_staged_pytest_is_a_copy_of_each_distribution_s_files_keyed_by_their_versions(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    dists = closure()
    staged = stage_pytest(cache)
    assert staged == cache / "childlib-pytest" / digest(dists)[:16]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache"], "nothing outside the cache (console scripts)"
    assert sorted(p.name for p in staged.parent.iterdir()) == [staged.name], "no work folder left"
    expected = {f"{d.metadata['Name']}=={d.version}" for d in dists}
    assert set((staged / MARKER).read_text().splitlines()) == expected
    assert (staged / MARKER).read_text().endswith("\n")
    copied = 0
    for dist in dists:
        for rel in dist.files or []:
            source = Path(str(dist.locate_file(rel)))
            if ".." in Path(rel).parts or "__pycache__" in Path(rel).parts or not source.is_file():
                assert not (staged / rel).exists() or ".." in Path(rel).parts, rel
                continue
            assert (staged / rel).read_bytes() == source.read_bytes(), rel
            copied += 1
    assert copied > 100 and not list(staged.rglob("__pycache__"))
    assert len(list(p for p in staged.rglob("*") if p.is_file())) == copied + 1, "those files and the marker"


def test_a_staged_pytest_is_staged_once_and_again_once_it_is_gone(tmp_path: Path) -> None:
    staged = stage_pytest(tmp_path)
    marked = (staged / MARKER).stat().st_mtime_ns
    assert stage_pytest(tmp_path) == staged and (staged / MARKER).stat().st_mtime_ns == marked
    shutil.rmtree(staged)
    assert stage_pytest(tmp_path) == staged and (staged / MARKER).is_file()
    assert (staged / "pytest" / "__init__.py").is_file()


def test_a_copy_another_process_staged_first_is_kept_for_whoever_is_reading_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process finishes staging while this one is still copying: the first copy stays."""
    target = tmp_path / "childlib-pytest" / digest(closure())[:16]
    copy = shutil.copyfile

    def racing(source: Path, dest: Path) -> object:
        if not target.exists():
            target.mkdir(parents=True)
            (target / MARKER).write_text("staged by another process\n")
        return copy(source, dest)

    monkeypatch.setattr(staging.shutil, "copyfile", racing)
    assert stage_pytest(tmp_path) == target
    assert (target / MARKER).read_text() == "staged by another process\n"
    assert sorted(p.name for p in target.parent.iterdir()) == [target.name], "this one's copy discarded"


def test_a_distribution_whose_folders_hold_only_folders_is_staged_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A namespace package: ``lab_ns/`` and ``lab_ns/inner/`` hold no file of their own."""
    site = tmp_path / "site"
    dist = _dist(site, "lab-ns", "1.0")
    files = {"lab_ns/inner/deep/mod.py": "VALUE = 1\n", "lab_ns/inner/other/data.txt": "kept\n"}
    for rel, text in files.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text(text)
    records = [*files, "lab_ns-1.0.dist-info/METADATA", "lab_ns-1.0.dist-info/RECORD"]
    (site / "lab_ns-1.0.dist-info" / "RECORD").write_text("".join(f"{r},,\n" for r in records))
    monkeypatch.setattr(staging, "closure", lambda: [dist])
    staged = stage_pytest(tmp_path / "cache")
    assert staged == tmp_path / "cache" / "childlib-pytest" / digest([dist])[:16]
    assert {p.relative_to(staged).as_posix() for p in staged.rglob("*") if p.is_file()} == {*records, MARKER}
    assert (staged / "lab_ns/inner/deep/mod.py").read_text() == "VALUE = 1\n"
    assert (staged / MARKER).read_text() == "lab-ns==1.0\n"
