"""Reports read back: what ``summary.md`` and ``junit.xml`` say must follow the judgment, case by case.

``difflab merge`` judges the published observations (no probe runs), with two edits shaped like
real outcomes: #38935's base already behaves like its head on the prefill door (a base that does
not show the bug: not-reproduced), and #41404's head probe forced a switch off its build's default.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from junitparser import Failure, JUnitXml

from difflab.backport.evidence import Evidence, disagreements
from difflab.cli import main
from difflab.diff.containment import ABSENT, PRESENT, Cell, ContainmentTable, ReleaseColumn
from difflab.diff.likeness import judge_backport
from difflab.matrix import load_matrix
from difflab.observation import Observation
from difflab.paths import default_matrix, repo_root
from difflab.report.backport import write_files as write_backport
from difflab.report.containment import write_files as write_contains
from difflab.report.grid import write_html
from difflab.report.markdown import cell as markdown_cell

PUBLISHED = repo_root() / "results" / "published" / "upstream"
FORCED = {
    "attribute": "server_args.disaggregation_decode_polling_interval",
    "value": 1,
    "build_default": 10,
    "env": ["SGLANG_DISAGGREGATION_DECODE_POLLING_INTERVAL"],
}


def _edit(path: Path, change: dict) -> None:
    doc = json.loads(path.read_text())
    for key, value in change.items():
        doc[key] = doc[key] | value if isinstance(value, dict) and key == "fields" else value
    path.write_text(json.dumps(doc))


@pytest.fixture(scope="module")
def merged(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, Path]:
    cell = tmp_path_factory.mktemp("cell")
    shutil.copytree(PUBLISHED / "observations", cell / "observations")
    shutil.copyfile(PUBLISHED / "matrix.toml", cell / "matrix.toml")
    spec = next(p for p in load_matrix(cell / "matrix.toml").fix("38935").probes if p.name == "pr38935_prefill_door")
    heads = {f: pair[1] for f, pair in spec.expect.items()}
    _edit(cell / "observations/38935/base/pr38935_prefill_door.json", {"fields": heads})
    _edit(cell / "observations/41404/head/pr41404_deferred_release.json", {"forced": [FORCED]})
    out = tmp_path_factory.mktemp("merged") / "out"
    return main(["merge", str(cell), "--out", str(out), "--no-bundle"]), out


def test_the_run_fails_and_diff_json_names_the_unreproduced_fix(merged: tuple[int, Path]) -> None:
    code, out = merged
    fixes = {f["id"]: f for f in json.loads((out / "diff.json").read_text())["fixes"]}
    assert fixes["38935"]["verdict"] == "not-reproduced" and fixes["38935"]["passed"] is False
    assert all(f["passed"] for fid, f in fixes.items() if fid != "38935")
    assert code == 1


def test_a_not_reproduced_probe_is_a_failed_junit_case(merged: tuple[int, Path]) -> None:
    _, out = merged
    cases = {(c.classname, c.name): c for suite in JUnitXml.fromfile(str(out / "junit.xml")) for c in suite}
    door = cases[("fix.38935", "pr38935_prefill_door")]
    assert not door.is_passed
    (failure,) = door.result
    assert isinstance(failure, Failure) and failure.type == "not-reproduced"
    assert "MISMATCH" in (door.system_out or "")
    verdicts = {
        (f"fix.{f['id']}", p["probe"]): p["verdict"]
        for f in json.loads((out / "diff.json").read_text())["fixes"]
        for p in f["probes"]
    }
    assert set(verdicts) == set(cases)
    for key, case in cases.items():  # read, not counted: a case passes exactly when its probe confirmed the fix
        assert (case.is_passed and not case.result) == (verdicts[key] == "confirmed"), key
    assert list(verdicts.values()).count("confirmed") >= 3


def test_summary_marks_the_unreproduced_fields_and_only_those(merged: tuple[int, Path]) -> None:
    _, out = merged
    text = (out / "summary.md").read_text()
    assert "❓ not-reproduced" in text
    section = text.split("### `pr38935_prefill_door`: not-reproduced", 1)[1].split("###", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    marks = {line.split("|")[1].strip(): line.rstrip("|").rsplit("|", 1)[1].strip() for line in rows}
    expect = {
        f"`{f}`"
        for f in next(
            p for p in load_matrix(out / "matrix.toml").fix("38935").probes if p.name == "pr38935_prefill_door"
        ).expect
    }
    assert expect and all(marks[f] == "✗" for f in expect)  # base shows the head value: not the declared base
    controls = [f for f in marks if f not in expect]
    assert controls and all(marks[f] == "✓" for f in controls)


def test_summary_names_the_switch_the_head_forced(merged: tuple[int, Path]) -> None:
    _, out = merged
    text = (out / "summary.md").read_text()
    section = text.split("### `pr41404_deferred_release`", 1)[1].split("\n## ", 1)[0]
    assert (
        "- head: `server_args.disaggregation_decode_polling_interval` forced to 1; this build's default is 10 "
        "(SGLANG_DISAGGREGATION_DECODE_POLLING_INTERVAL)"
    ) in section


# -- contains.md and the HTML grid -------------------------------------------------------------------
def _table() -> ContainmentTable:
    """#38935 on two releases: present with a switch its probe forced on 0.5.21; absent where its pins say present."""
    fix = load_matrix(default_matrix()).fix("38935")
    releases = [ReleaseColumn("0.5.21", "a.whl", "0" * 64), ReleaseColumn("0.5.22", "b.whl", "1" * 64)]
    note = "the decode offload is off by default in this build (server_args.enable_offload): forced on by the probe"
    cells = [
        Cell(fix.id, "0.5.21", PRESENT, PRESENT, "behaves like the head", notes=[note]),
        Cell(fix.id, "0.5.22", ABSENT, PRESENT, "behaves like the base"),
    ]
    return ContainmentTable([fix], releases, cells)


def test_contains_md_and_the_grid_show_the_forced_switch_and_the_contradicted_cell(tmp_path: Path) -> None:
    t = _table()
    assert [c.release for c in t.disagreements] == ["0.5.22"] and t.exit_code == 1
    write_contains(tmp_path, t)
    write_html(tmp_path, t, {"started": "2026-12-01T00:00:00Z", "exit_code": t.exit_code})
    note = t.cell("38935", "0.5.21").notes[0]
    md = (tmp_path / "contains.md").read_text()
    row = next(line for line in md.splitlines() if line.startswith("| #38935") or line.startswith("| 38935"))
    assert "| present |" in row and "absent (expected present)" in row
    assert "38935 @ 0.5.22: absent: behaves like the base" in md
    assert note in md and "0.5.21" in md.split(note)[0].rsplit("\n", 1)[-1]  # said of the release it was forced on
    html = (tmp_path / "contains.html").read_text()
    cell = html.split('id="cell-38935-0.5.22"', 1)[1].split("</td>", 1)[0]
    assert 'data-verdict="absent"' in cell and "expected present" in cell
    assert "expected" not in html.split('id="cell-38935-0.5.21"', 1)[1].split("</td>", 1)[0].replace("class=", "")
    switches = html.split('id="switches"', 1)[1].split("</ul>", 1)[0]
    assert note in switches and "0.5.21" in switches
    cases = {c.name: c for suite in JUnitXml.fromfile(str(tmp_path / "junit.xml")) for c in suite}
    assert cases["0.5.21"].is_passed and isinstance(cases["0.5.22"].result[0], Failure)
    assert cases["0.5.22"].result[0].type == "unexpected"


# -- a backport check's summary.md -------------------------------------------------------------------
def test_backport_summary_and_junit_keep_the_disagreement(tmp_path: Path) -> None:
    """A fork whose version string claims the fix while its door behaves like the base: the warning is read back."""
    fix = load_matrix(default_matrix()).fix("38935")
    observations = {}
    for spec in fix.probes:
        fields = {f: pair[0] for f, pair in spec.expect.items()} | dict(spec.controls)
        observations[spec.name] = Observation(fix.id, spec.name, "fork", {"kind": "git"}, "ok", fields=fields)
    verdict = judge_backport(fix, observations)
    assert verdict.verdict == "absent"
    claims = Evidence(version="0.5.21", first_release_with_fix="0.5.21", version_claims_fix=True, ancestor=False)
    verdict.evidence = claims.to_dict()
    verdict.disagreements = disagreements(verdict.verdict, claims)
    (warning,) = verdict.disagreements
    write_backport(tmp_path, {"repo": "fork", "ref": "main", "commit": "c" * 40, "tree": "t" * 40}, [verdict])
    section = (tmp_path / "summary.md").read_text().split("## #38935: absent", 1)[1]
    assert f"- ⚠️ {markdown_cell(warning)}" in section.split("###", 1)[0]
    assert json.loads((tmp_path / "backport.json").read_text())["passed"] is False
    cases = [c for suite in JUnitXml.fromfile(str(tmp_path / "junit.xml")) for c in suite]
    assert cases and not any(c.is_passed for c in cases)
    assert {r.type for c in cases for r in c.result} == {"behaves like base"}
