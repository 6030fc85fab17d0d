"""``difflab merge`` (the CI merge job) on the real published observations, laid out as CI cells.

Each fix x side becomes one cell folder, as ``nox -s side`` leaves them. A fix of the matrix whose cells
left no observation must be an ``error`` verdict (exit 1), never silently dropped.
"""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest
from rich.console import Console

from difflab.cli import main
from difflab.errors import ConfigError
from difflab.progress import Reporter
from difflab.workflows.merge import collect, label, merge
from test_bundle_support import isolated_config, make_key  # noqa: F401 - isolated_config is an autouse fixture

ROOT = Path(__file__).resolve().parents[1]
PUBLISHED = ROOT / "results" / "published" / "upstream"
PUBLISHED_VERDICTS = {
    "36988": "confirmed",
    "38935": "confirmed",
    "41404": "confirmed",
    "43719a": "confirmed",
    "43719b": "unavailable",
}


def cells(tmp_path: Path, skip: set[tuple[str, str]] = frozenset()) -> Path:
    """``ci/<fix>-<side>/`` folders, each with its observations and the matrix it ran (as ``observe`` writes)."""
    root = tmp_path / "ci"
    for side_dir in sorted(PUBLISHED.glob("observations/*/*")):
        fix, side = side_dir.parent.name, side_dir.name
        if (fix, side) in skip:
            continue
        cell = root / f"{fix}-{side}"
        shutil.copytree(side_dir, cell / "observations" / fix / side)
        shutil.copyfile(PUBLISHED / "matrix.toml", cell / "matrix.toml")
    return root


def verdicts_in(out: Path) -> dict[str, tuple[str, str]]:
    diff = json.loads((out / "diff.json").read_text())
    return {f["id"]: (f["verdict"], f["reason"]) for f in diff["fixes"]}


def test_merging_every_cell_gives_the_published_verdicts(tmp_path: Path) -> None:
    out = tmp_path / "merged"
    root = cells(tmp_path)
    assert main(["merge", str(root), "--out", str(out), "--no-bundle"]) == 0
    assert {k: v for k, (v, _) in verdicts_in(out).items()} == PUBLISHED_VERDICTS
    published = {f["id"]: f for f in json.loads((PUBLISHED / "diff.json").read_text())["fixes"]}
    merged = {f["id"]: f for f in json.loads((out / "diff.json").read_text())["fixes"]}
    # each side labelled by the release its cell observed; 43719b's head none (its observation says why)
    assert {k: (f["base"], f["head"]) for k, f in merged.items() if k != "43719b"} == {
        k: (f["base"], f["head"]) for k, f in published.items() if k != "43719b"
    }
    assert merged["43719b"]["base"] == published["43719b"]["base"]
    assert merged["43719b"]["head"] == {"label": "unavailable"}
    run = json.loads((out / "run.json").read_text())
    assert run["command"] == "merge" and run["exit_code"] == 0 and run["inputs"] == [str(root)]
    assert run["fixes"] == ["36988", "38935", "41404", "43719a", "43719b"]
    assert sorted(run["sources"]) == ["0.5.19", "0.5.20", "0.5.21", "0.5.22"]
    assert (out / "matrix.toml").read_bytes() == (PUBLISHED / "matrix.toml").read_bytes()
    merged = sorted(p.relative_to(out).as_posix() for p in out.glob("observations/*/*/*.json"))
    assert merged == sorted(p.relative_to(PUBLISHED).as_posix() for p in PUBLISHED.glob("observations/*/*/*.json"))


def test_a_fix_whose_cells_are_missing_is_an_error_not_dropped(tmp_path: Path) -> None:
    out = tmp_path / "merged"
    root = cells(tmp_path, skip={("41404", "base"), ("41404", "head")})
    assert main(["merge", str(root), "--out", str(out), "--no-bundle"]) == 1
    got = verdicts_in(out)
    assert got["41404"] == ("error", "no observation of this fix on either side (base and head missing)")
    assert {k: v for k, (v, _) in got.items() if k != "41404"} == {
        k: v for k, v in PUBLISHED_VERDICTS.items() if k != "41404"
    }
    assert json.loads((out / "run.json").read_text())["exit_code"] == 1
    assert "41404" in (out / "summary.md").read_text()


def test_a_missing_side_is_an_error_naming_the_probe(tmp_path: Path) -> None:
    out = tmp_path / "merged"
    verdicts = merge([cells(tmp_path, skip={("38935", "head")})], out, None, bundle=False)
    door = next(v for v in verdicts if v.id == "38935")
    assert (door.verdict, door.reason) == (
        "error",
        "pr38935_prefill_door: head: no observation; pr38935_decode_door: head: no observation",
    )


def test_cells_in_several_folders_merge(tmp_path: Path) -> None:
    root = cells(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    shutil.move(root / "43719b-head", elsewhere)
    verdicts = merge([root, elsewhere], tmp_path / "merged", root / "36988-base" / "matrix.toml", bundle=False)
    assert {v.id: v.verdict for v in verdicts} == PUBLISHED_VERDICTS


def test_an_observation_of_a_fix_the_matrix_lacks_is_bad_input(tmp_path: Path, capsys) -> None:
    root = cells(tmp_path)
    stray = root / "99999-base" / "observations" / "99999" / "base"
    stray.mkdir(parents=True)
    obs = json.loads((PUBLISHED / "observations/36988/base/pr36988_retire_aborted.json").read_text())
    (stray / "pr36988_retire_aborted.json").write_text(json.dumps(dict(obs, fix="99999")))
    assert main(["merge", str(root), "--out", str(tmp_path / "merged"), "--no-bundle"]) == 2
    assert "unknown fix '99999'" in capsys.readouterr().err
    assert not (tmp_path / "merged").exists()


def test_a_second_observation_of_one_cell_is_refused(tmp_path: Path) -> None:
    root = cells(tmp_path)
    shutil.copytree(root / "41404-base", root / "41404-base-again")
    with pytest.raises(ConfigError, match=r"a second observation of 41404/base/pr41404_deferred_release"):
        collect([root])


def test_a_second_observation_names_the_file_of_the_later_folder(tmp_path: Path) -> None:
    root = cells(tmp_path)
    again = tmp_path / "again"
    shutil.copytree(root / "41404-base", again / "41404-base")
    with pytest.raises(ConfigError) as err:
        collect([root, again])
    second = again / "41404-base" / "observations" / "41404" / "base" / "pr41404_deferred_release.json"
    assert str(err.value) == f"{second}: a second observation of 41404/base/pr41404_deferred_release"


def test_no_observations_or_no_folder(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError) as err:
        collect([tmp_path / "empty"])
    assert str(err.value) == f"no observations under {tmp_path / 'empty'}"
    with pytest.raises(ConfigError) as err:
        collect([tmp_path / "absent"])
    assert str(err.value) == f"{tmp_path / 'absent'}: not a folder"
    (tmp_path / "also-empty").mkdir()
    with pytest.raises(ConfigError) as err:
        collect([tmp_path / "empty", tmp_path / "also-empty"])
    assert str(err.value) == f"no observations under {tmp_path / 'empty'}, {tmp_path / 'also-empty'}"


def test_no_matrix_in_the_cells(tmp_path: Path) -> None:
    root = cells(tmp_path)
    for copy in root.glob("*/matrix.toml"):
        copy.unlink()
    with pytest.raises(ConfigError) as err:
        merge([root], tmp_path / "merged", None, bundle=False)
    assert str(err.value) == "no matrix.toml in the observed folders: pass --matrix"


def test_the_given_matrix_is_judged_and_copied_over_the_recorded_ones(tmp_path: Path) -> None:
    """``--matrix`` wins: the cells' copies may be missing, or differ from it (a comment here)."""
    root = cells(tmp_path)
    for copy in root.glob("*/matrix.toml"):
        copy.write_bytes(b"# the copy a cell recorded\n" + copy.read_bytes())
    given = tmp_path / "given.toml"
    shutil.copyfile(PUBLISHED / "matrix.toml", given)
    out = tmp_path / "merged"
    assert {v.id: v.verdict for v in merge([root], out, given, bundle=False)} == PUBLISHED_VERDICTS
    assert (out / "matrix.toml").read_bytes() == given.read_bytes()
    assert not (out / "SHA256SUMS").exists()  # bundle=False reaches the session: nothing sealed
    for copy in root.glob("*/matrix.toml"):
        copy.unlink()
    assert {v.id: v.verdict for v in merge([root], tmp_path / "again", given, bundle=False)} == PUBLISHED_VERDICTS


def test_without_a_matrix_the_first_recorded_copy_in_path_order_is_judged(tmp_path: Path) -> None:
    root = cells(tmp_path)
    copies = sorted(root.glob("*/matrix.toml"))
    for n, copy in enumerate(copies):
        copy.write_bytes(f"# cell {n}\n".encode() + copy.read_bytes())
    out = tmp_path / "merged"
    merge([root], out, None, bundle=False)
    assert (out / "matrix.toml").read_bytes() == copies[0].read_bytes()


def test_merge_seals_and_replaces_an_earlier_result_when_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The positional :func:`merge` passes ``bundle`` and ``force`` on: sealed, and the old folder replaced."""
    private, public = make_key(tmp_path / "keys")
    monkeypatch.setenv("DIFFLAB_SIGNING_KEY", str(private))
    out = tmp_path / "merged"
    root = cells(tmp_path, skip={("41404", "base"), ("41404", "head")})
    assert main(["merge", str(root), "--out", str(out), "--no-bundle"]) == 1
    every = cells(tmp_path / "all")
    with pytest.raises(ConfigError, match="--force"):
        merge([every], out, None, bundle=True)
    said = io.StringIO()
    verdicts = merge([every], out, None, bundle=True, reporter=Reporter(Console(file=said, width=400)), force=True)
    assert "sealed: " in said.getvalue()  # the seal speaks through the reporter given
    assert {v.id: v.verdict for v in verdicts} == PUBLISHED_VERDICTS
    assert json.loads((out / "run.json").read_text())["exit_code"] == 0
    assert main(["verify", str(out), "--key", str(public)]) == 0


def test_a_failed_merge_keeps_the_previous_result(tmp_path: Path) -> None:
    out = tmp_path / "merged"
    assert main(["merge", str(cells(tmp_path)), "--out", str(out), "--no-bundle"]) == 0
    before = (out / "diff.json").read_bytes()
    empty = tmp_path / "nothing"
    empty.mkdir()
    assert main(["merge", str(empty), "--out", str(out), "--no-bundle"]) == 2
    assert (out / "diff.json").read_bytes() == before


def test_a_merged_bundle_verifies(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    private, public = make_key(tmp_path / "keys")
    monkeypatch.setenv("DIFFLAB_SIGNING_KEY", str(private))
    out = tmp_path / "merged"
    assert main(["merge", str(cells(tmp_path)), "--out", str(out)]) == 0
    assert main(["verify", str(out), "--key", str(public)]) == 0


def test_labels_name_the_source() -> None:
    from difflab.observation import Observation

    def obs(source: dict) -> Observation:
        return Observation(fix="1", probe="p", side="base", source=source, status="ok")

    assert label(obs({"kind": "release", "version": "0.5.21"})) == {
        "label": "0.5.21",
        "kind": "release",
        "version": "0.5.21",
    }
    assert label(obs({"kind": "git", "commit": "8f3d6944b76c428d884582cb6c82a39db1465360"}))["label"] == "8f3d6944b76c"
    assert label(obs({})) == {"label": "unavailable"}
