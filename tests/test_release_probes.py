"""The real probes on the real releases: the lab's central claims, end to end.

- the default matrix gives the declared verdicts: ``confirmed``, or ``unavailable`` for a fix the matrix declares
  a side of unavailable (in no release yet: the base shows the bug; older than every pin: the head shows the fix);
- head against head is ``not-reproduced`` for every fix (each probe discriminates);
- ``contains --all`` reproduces the release map (``matrices/release-map.toml``) over the committed release
  lock, every fix on every release: a probe that errors on a release it should judge fails here;
- every shipped mutation is ``causal``; a useless probe is ``insensitive``; a stale mutation is reported.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from junitparser import JUnitXml
from packaging.version import Version

from difflab.environment.shared import SharedEnvironment
from difflab.matrix import load_matrix
from difflab.paths import default_release_lock
from difflab.progress import Reporter
from difflab.source.release_lock import load_lock
from difflab.workflows.contains import ContainsRequest
from difflab.workflows.contains import execute as contains
from difflab.workflows.run import RunRequest, execute, make_runner
from release_map import load_release_map

pytestmark = [pytest.mark.sglang, pytest.mark.xdist_group("release")]


def expected_verdicts(matrix) -> dict[str, str]:
    """Every fix ``confirmed`` on its pins, or ``unavailable`` where the matrix declares a side without a source."""
    return {f.id: "unavailable" if f.head.unavailable or f.base.unavailable else "confirmed" for f in matrix.fixes}


def what_the_other_side_shows(fix) -> list[str]:
    """What an ``unavailable`` verdict must say about the side that is there (an unavailable verdict is never
    a silent pass): the base's bug for a fix in no release yet, the head's fix for one older than every pin,
    or, for such a fix with no probe, that nothing judges it."""
    if fix.head.unavailable:
        return ["head unavailable", "base shows the bug"]
    if not fix.probes:
        return ["base unavailable", "no probe judges it by behaviour"]
    return ["base unavailable", "head shows the fix"]


@pytest.fixture(scope="module")
def default_run(tmp_path_factory: pytest.TempPathFactory, matrix_path: Path):
    out = tmp_path_factory.mktemp("run") / "out"
    outcome = execute(RunRequest(matrix=matrix_path, out=out, bundle=False, use_cache=False))
    return outcome, json.loads((out / "diff.json").read_text())


def test_default_matrix_verdicts(default_run, matrix) -> None:
    outcome, diff = default_run
    got = {f["id"]: f["verdict"] for f in diff["fixes"]}
    assert got == expected_verdicts(matrix), {f["id"]: f["reason"] for f in diff["fixes"]}
    assert outcome.exit_code == 0
    for b in (f for f in diff["fixes"] if f["verdict"] == "unavailable"):
        said = what_the_other_side_shows(matrix.fix(b["id"]))
        assert all(words in b["reason"] for words in said), (b["id"], b["reason"])
        assert b["passed"], b["id"]


def test_observations_come_from_the_pinned_releases(default_run, matrix) -> None:
    outcome, diff = default_run
    for fix in diff["fixes"]:
        spec = matrix.fix(fix["id"])
        for probe in fix["probes"]:
            for side in ("base", "head"):
                pin, seen = getattr(spec, side), probe[side]
                if pin.unavailable:  # declared without a source: nothing ran on that side
                    assert seen["status"] == "unavailable" and seen["error"] == pin.unavailable, (fix["id"], side)
                    continue
                assert seen["status"] == "ok", (fix["id"], side, seen["error"])
                assert seen["sglang_version"] == pin.release
                assert seen["source"]["sha256"] == matrix.releases[pin.release].sha256


def test_results_folder_is_complete(default_run) -> None:
    outcome, diff = default_run
    out = outcome.out_dir
    for name in ("diff.json", "junit.xml", "summary.md", "run.json", "environment.json", "matrix.toml"):
        assert (out / name).is_file(), name
    run = json.loads((out / "run.json").read_text())  # what the probes return and the matrix ignores, listed
    listed = {f"{f['id']}/{p['probe']}": p["undeclared"] for f in diff["fixes"] for p in f["probes"] if p["undeclared"]}
    assert run["undeclared_fields"] == listed
    env = json.loads((out / "environment.json").read_text())
    assert env["python_version"].startswith("3.") and any(p.startswith("torch==") for p in env["packages"])
    cases = [c for suite in JUnitXml.fromfile(str(out / "junit.xml")) for c in suite]
    probes = sum(len(f["probes"]) for f in diff["fixes"])
    unprobed = [f["id"] for f in diff["fixes"] if not f["probes"]]  # one "(no probes)" case each
    assert len(cases) == probes + len(unprobed)
    for case in (c for c in cases if c.name == "(no probes)"):  # declared older than every pin: skipped, not passed
        assert case.is_skipped and case.classname.removeprefix("fix.") in unprobed, case.classname
    for f in diff["fixes"]:
        for p in f["probes"]:
            for side in ("base", "head"):
                if p[side]["status"] != "unavailable":
                    assert (out / "observations" / f["id"] / side / f"{p['probe']}.json").is_file()


def _base_line(fix) -> str:
    if fix.base.unavailable:
        return f'base = {{ unavailable = "{fix.base.unavailable}" }}'
    return f'base = {{ release = "{fix.base.release}" }}'


def test_head_against_head_is_not_reproduced(tmp_path: Path, matrix_path: Path, matrix) -> None:
    """Each probe run on its head release as both sides: its base reading must not show the bug.

    A fix older than every pin gets its head as base too: no release shows its bug, so nothing may.
    """
    text = matrix_path.read_text()
    ids = [f.id for f in matrix.fixes if f.head.release and f.probes]
    for fix in (matrix.fix(i) for i in ids):
        pins = f'{_base_line(fix)}\nhead = {{ release = "{fix.head.release}" }}'
        text = text.replace(
            pins, f'base = {{ release = "{fix.head.release}" }}\nhead = {{ release = "{fix.head.release}" }}'
        )
    same = tmp_path / "head-vs-head.toml"
    same.write_text(text)
    rewritten = load_matrix(same).select(ids)  # every fix's pins found and rewritten (fixes may share them)
    assert {f.id: f.base.release for f in rewritten} == {f.id: f.head.release for f in rewritten}
    outcome = execute(RunRequest(matrix=same, fixes=ids, out=tmp_path / "out", bundle=False))
    diff = json.loads((outcome.out_dir / "diff.json").read_text())
    assert {f["id"]: f["verdict"] for f in diff["fixes"]} == dict.fromkeys(ids, "not-reproduced")
    assert outcome.exit_code == 1


def test_contains_all_reproduces_the_release_map(tmp_path: Path, matrix_path: Path, matrix) -> None:
    """Every fix on every release of the lock, against matrices/release-map.toml: no cell may be an error."""
    outcome = contains(ContainsRequest(matrix=matrix_path, all_releases=True, out=tmp_path / "c", bundle=False))
    releases = [r.version for r in outcome.table.releases]
    assert releases == load_lock(default_release_lock()).versions  # the committed lock
    cells = {(c.fix, c.release): c for c in outcome.table.cells}
    carried = load_release_map()
    for fix in matrix.fixes:
        for release in releases:
            c = cells[(fix.id, release)]
            assert c.verdict != "error", (fix.id, release, c.reason)
            if not fix.probes:  # older than every pin, no probe: named, not judged
                assert fix.base.unavailable and c.verdict == "not-judged", (fix.id, release, c.verdict)
                continue
            want = "present" if carried[fix.id].carried_on(release) else "absent"
            before_base = fix.base.release and Version(release) < Version(fix.base.release)
            assert c.verdict == want or (before_base and c.verdict == "not-applicable"), (fix.id, release, c.reason)
            on = carried[fix.id].backends_on(release)
            judged = sorted(b for b, v in c.backends.items() if not v.startswith("not-applicable"))
            assert judged == sorted(on), (fix.id, release, c.backends)
    out = outcome.out_dir
    assert outcome.exit_code == 0 and not outcome.table.regressions and not outcome.table.new_releases
    assert json.loads((out / "contains.json").read_text())["agrees"] is True
    rows = (out / "contains.md").read_text()
    for fix in matrix.fixes:
        if fix.probes and not any(p.backends for p in fix.probes):
            words = ["present" if carried[fix.id].carried_on(r) else "absent" for r in releases]
            assert f"| {fix.label} | {' | '.join(words)} |" in rows, fix.id
    family = json.loads((out / "family.json").read_text())["families"]
    for report in family:  # a release is safe from the family exactly when it carries every member
        judged = {f.id for f in matrix.fixes if f.probes}
        members = [m for m in report["members"] if m in carried and m in judged]
        for build in report["builds"]:
            assert build["safe"] == all(carried[m].carried_on(build["build"]) for m in members), build["line"]


def _run_selfcheck(matrix_file: Path, fix_ids: list[str], work: Path):
    from difflab.source import backend_for
    from difflab.workflows.selfcheck import run_selfcheck

    m = load_matrix(matrix_file)
    fixes = m.select(fix_ids)
    backend = backend_for("release", releases=m.releases)
    heads = {f.id: backend.materialise(f, "head", f.head) for f in fixes if f.head.release}
    env = SharedEnvironment().ensure()
    work.mkdir(parents=True, exist_ok=True)
    return run_selfcheck(fixes, heads, make_runner(RunRequest(), env), work, Reporter().track)


def test_every_shipped_mutation_is_causal(tmp_path: Path, matrix_path: Path, matrix) -> None:
    ids = [f.id for f in matrix.fixes if f.head.release]
    results = _run_selfcheck(matrix_path, ids, tmp_path)
    # a fix older than every pin with no probe has nothing for a mutation to flip (selfcheck says so)
    reverted = {f.id for f in matrix.fixes if f.head.release and f.probes}
    assert results and {r.fix for r in results} == reverted
    assert all(r.outcome == "causal" for r in results), [(r.fix, r.mutation, r.outcome, r.reason) for r in results]


def test_useless_probe_is_insensitive_and_stale_mutation_is_reported(
    tmp_path: Path, matrix_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A probe that only checks a field the fix does not touch cannot prove causality."""
    probes = tmp_path / "probes"
    shutil.copytree(Path(__file__).resolve().parents[1] / "probes", probes)
    (probes / "useless_prefill_door.py").write_text(
        "def observe(kit):\n"
        "    from sglang.srt.disaggregation import utils\n"
        "    return {'s.has_reject_helper': hasattr(utils, 'is_unadmitted_reject'), 's.version': kit.sglang_version,\n"
        "            'old.has_reject_helper': hasattr(utils, 'is_aborted')}\n"
    )
    text = matrix_path.read_text()
    start = text.index('id = "38935"')
    block = text[start : text.index("[[fixes]]", start)]
    mutation = block[block.index("[[fixes.mutations]]") :].split("\n\n")[0]
    mutation = re.sub(r"\n(targets|hunks) = \[.*\]", "", mutation) + '\ntargets = ["useless_prefill_door"]'
    useless = (
        '[[fixes]]\nid = "38935"\npr = 38935\ntitle = "useless"\nfamily = "kv-safety"\nbase = { release = "0.5.20" }\n'
        'head = { release = "0.5.21" }\n[[fixes.probes]]\nname = "useless_prefill_door"\n'
        '[fixes.probes.expect]\n"s.has_reject_helper" = [false, true]\n'
        '[fixes.probes.controls]\n"old.has_reject_helper" = true\n\n' + mutation + "\n\n"
        '[[fixes.mutations]]\nname = "stale"\nfile = "sglang/srt/disaggregation/prefill.py"\n'
        "find = '''this text is not in any release'''\nreplace = ''\ntargets = [\"useless_prefill_door\"]\n"
    )
    m = tmp_path / "m.toml"
    m.write_text(text[: text.index("[[fixes]]")] + useless)
    monkeypatch.setenv("DIFFLAB_PROBES", str(probes))
    results = {r.mutation: r for r in _run_selfcheck(m, ["38935"], tmp_path / "w")}
    assert results["stale"].outcome == "mutation-stale"
    assert "fix 38935" in results["stale"].reason and "prefill.py" in results["stale"].reason
    assert "0.5.21" in results["stale"].reason
    (useless_result,) = [r for name, r in results.items() if name != "stale"]
    assert useless_result.outcome == "insensitive", useless_result.reason
