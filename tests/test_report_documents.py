"""A backport check's files, written for a fork run with mixed verdicts and read back.

The fork's observations are shaped like a real fork's: #38935's prefill door behaves like its head and
its decode door like its base (partial, path by path), #41404 shows the published base observation
(absent), #43719a's send-ack probe crashed and its in-flight probe left nothing (error), #36988 shows the
published head observation (present), and a fix declares no probes (error, with no probe cases).
The git evidence disagrees with the behaviour on #41404 (the fix commit
is in the history), and its head probe forced a switch. ``backport.json`` must hold every verdict,
``junit.xml`` must fail or error exactly the cases whose probe is not head-like, and ``summary.md`` must
be the page below (``tests/fixtures/reports/backport-summary.md``; after a deliberate change to the
page, rewrite it from ``render_summary`` and read the diff).

Each test writes its own folder (no module-wide fixture): ``nox -s mutation`` runs a mutant against the
tests it saw reach the mutated function, and a writer called in a shared fixture is seen by one test only.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path

import pytest
from junitparser import Error, Failure, JUnitXml, Skipped

from difflab.backport.evidence import Evidence, disagreements
from difflab.diff.containment import (
    ABSENT,
    ERROR,
    NOT_APPLICABLE,
    PARTIAL,
    PRESENT,
    Cell,
    ContainmentTable,
    ProbeCell,
    ReleaseColumn,
    find_regressions,
)
from difflab.diff.likeness import BackportVerdict, judge_backport
from difflab.diff.mutation import HunkCoverage, MutationResult, coverage_ratio, hunk_coverage, judge_mutation
from difflab.diff.throughput import ThroughputResult, judge_throughput
from difflab.diff.verdict import FixVerdict, judge_all
from difflab.matrix import load_matrix
from difflab.matrix.model import ProbeSpec
from difflab.observation import SCHEMA_VERSION, Observation
from difflab.report import write_reports
from difflab.report.backport import SCHEMA, backport_document, render_summary, write_files
from difflab.report.containment import document as contains_document
from difflab.report.containment import render_markdown as render_contains
from difflab.report.containment import write_files as write_contains
from difflab.report.grid import write_html
from difflab.report.markdown import cell as markdown_cell
from difflab.report.markdown import code as markdown_code
from difflab.report.markdown import render_summary as render_run_summary
from difflab.report.results import diff_document
from difflab.report.selfcheck import document as selfcheck_document
from difflab.report.selfcheck import render_markdown as render_selfcheck
from difflab.report.selfcheck import write_selfcheck
from difflab.report.throughput import Measured, junit_cases, summary_lines, write_log_tail
from test_mutation_judge import FIX, mutation, observed
from test_report_readback import FORCED, PUBLISHED
from test_throughput_judge import SIZES, WORKLOADS, rounds

GOLDEN = Path(__file__).with_name("fixtures") / "reports" / "backport-summary.md"
MACHINERY_MATRIX = Path(__file__).with_name("fixtures") / "machinery" / "upstream.toml"
"""A frozen matrix: the pages below do not move when the default matrix gains a fix or renames one."""


def _as_golden(text: str, golden: Path) -> str:
    """The reviewed page ``golden`` holds; ``DIFFLAB_WRITE_GOLDENS=1`` writes ``text`` there first (review the diff)."""
    if os.environ.get("DIFFLAB_WRITE_GOLDENS") == "1":
        golden.write_text(text, encoding="utf-8")
    return golden.read_text(encoding="utf-8")


FORK = {"repo": "https://example.org/fork/sglang", "ref": "release/lab", "commit": "c" * 40, "tree": "e" * 40}


def _observed(fix: str, side: str, probe: str) -> Observation:
    doc = json.loads((PUBLISHED / "observations" / fix / side / f"{probe}.json").read_text())
    return Observation.from_dict(doc | {"side": "fork"})


def _synthetic(fix: str, spec: ProbeSpec, side: int) -> Observation:
    """What the probe returns on a build that behaves like the base (0) or the head (1) of its fix."""
    fields = {f: pair[side] for f, pair in spec.expect.items()} | dict(spec.controls)
    return Observation(fix, spec.name, "fork", {"kind": "git"}, "ok", fields=fields, duration_s=0.25)


def _verdicts() -> list[BackportVerdict]:
    published, current = load_matrix(PUBLISHED / "matrix.toml"), load_matrix(MACHINERY_MATRIX)
    doors = {p.name: p for p in current.fix("38935").probes}
    split = {
        "pr38935_prefill_door": _synthetic("38935", doors["pr38935_prefill_door"], 1),
        "pr38935_decode_door": _synthetic("38935", doors["pr38935_decode_door"], 0),
    }
    release = _observed("41404", "base", "pr41404_deferred_release")
    release.forced = [FORCED]
    ack = _observed("43719a", "head", "pr43719_failed_send_ack")
    ack.status, ack.fields = "error", {}
    ack.error = "Traceback (most recent call last):\nRuntimeError: the KV sender thread never started"
    retire = {"pr36988_retire_aborted": _observed("36988", "head", "pr36988_retire_aborted")}
    partial = judge_backport(current.fix("38935"), split)
    absent = judge_backport(published.fix("41404"), {"pr41404_deferred_release": release})
    broken = judge_backport(current.fix("43719a"), {"pr43719_failed_send_ack": ack})  # its in-flight probe: none
    present = judge_backport(published.fix("36988"), retire)
    bare = judge_backport(dataclasses.replace(published.fix("43719b"), probes=[]), {})
    claims = Evidence(
        fix_commit="f" * 40,
        ancestor=True,
        patch_equivalent=True,
        equivalent_commits=["a" * 40, "b" * 40],
        version="0.5.21",
        first_release_with_fix="0.5.21",
        version_claims_fix=True,
        notes=["fetched the fix commit from upstream"],
    )
    absent.evidence = claims.to_dict()
    absent.disagreements = disagreements(absent.verdict, claims)
    partial.evidence = Evidence(ancestor=False, patch_equivalent=False, version_claims_fix=None).to_dict()
    return [partial, absent, broken, present, bare]


@pytest.fixture
def written(tmp_path: Path) -> tuple[list[BackportVerdict], Path]:
    verdicts = _verdicts()
    assert [v.verdict for v in verdicts] == ["partial", "absent", "error", "present", "error"]
    folder = tmp_path
    write_files(folder, FORK, verdicts, ["", "## SGLang's own tests", "", "not replayed"])
    return verdicts, folder


def test_backport_json_holds_every_verdict_and_fails_the_run(written: tuple[list[BackportVerdict], Path]) -> None:
    verdicts, folder = written
    text = (folder / "backport.json").read_text()
    doc = json.loads(text)
    assert text == json.dumps(doc, indent=2, sort_keys=True) + "\n"  # as every run-folder JSON file is written
    assert doc == json.loads(json.dumps(backport_document(FORK, verdicts)))
    assert doc["schema"] == SCHEMA == 2 and doc["fork"] == FORK and doc["passed"] is False
    assert [(f["id"], f["verdict"], f["passed"]) for f in doc["fixes"]] == [
        ("38935", "partial", False),
        ("41404", "absent", False),
        ("43719a", "error", False),
        ("36988", "present", True),
        ("43719b", "error", False),
    ]
    assert doc["fixes"][1]["evidence"]["ancestor"] is True and doc["fixes"][1]["disagreements"]
    assert backport_document(FORK, verdicts[3:4])["passed"] is True


def test_junit_fails_or_errors_exactly_the_probes_not_like_the_head(
    written: tuple[list[BackportVerdict], Path],
) -> None:
    verdicts, folder = written
    (suite,) = list(JUnitXml.fromfile(str(folder / "junit.xml")))
    assert suite.name == "difflab-backport"
    cases = {(c.classname, c.name): c for c in suite}
    expected = {(f"backport.{v.id}", p.probe): p for v in verdicts for p in v.probes}
    assert set(cases) == set(expected) | {("backport.43719b", "(no probes)")}
    for key, probe in expected.items():
        case = cases[key]
        assert case.time == (round(probe.observation.duration_s, 3) if probe.observation else 0.0)
        lines = (case.system_out or "").splitlines()
        assert [line.split(": observed=", 1)[0] for line in lines] == [f"{c.kind} {c.field}" for c in probe.fields]
        if probe.like == "head":
            assert case.is_passed and not case.result, key
            continue
        (result,) = case.result
        assert result.message == f"{probe.like}: {probe.reason}"
        if probe.like == "error":
            assert isinstance(result, Error) and result.type == "error"
        else:
            assert isinstance(result, Failure) and result.type == f"behaves like {probe.like}"
    (bare,) = cases[("backport.43719b", "(no probes)")].result
    assert isinstance(bare, Error) and bare.type == "error" and bare.message == verdicts[4].reason
    send = cases[("backport.43719a", "pr43719_failed_send_ack")]
    assert "observed=" in (send.system_out or "") and "declared=" in (send.system_out or "")
    assert [k for k, c in cases.items() if c.is_passed] == [k for k, p in expected.items() if p.like == "head"]
    assert len([k for k, c in cases.items() if c.is_passed]) == 2


def test_a_control_drift_or_other_probe_is_an_error_case(tmp_path: Path) -> None:
    """Only a head-like probe passes: control drift and a match with neither side err, base or mixed fail."""
    verdicts = _verdicts()
    probe = verdicts[0].probes[0]
    for like in ("control-drift", "other", "base", "mixed"):
        probe.like = like
        write_files(tmp_path, FORK, verdicts[:1])
        case = next(c for s in JUnitXml.fromfile(str(tmp_path / "junit.xml")) for c in s if c.name == probe.probe)
        (result,) = case.result
        assert isinstance(result, Error if like in ("control-drift", "other") else Failure), like
        assert result.type == (like if like in ("control-drift", "other") else f"behaves like {like}")


def test_summary_is_the_page_a_reader_gets(written: tuple[list[BackportVerdict], Path]) -> None:
    verdicts, folder = written
    text = (folder / "summary.md").read_text()
    assert text == render_summary(FORK, verdicts, ["", "## SGLang's own tests", "", "not replayed"])
    assert text == _as_golden(text, GOLDEN)


def test_summary_names_the_part_and_the_back_ends(tmp_path: Path) -> None:
    verdicts = _verdicts()
    broken = verdicts[2]
    broken.backends = {"mooncake": "present", "nixl": "absent"}
    text = render_summary(FORK, [broken], ["", "the end", "", ""])
    assert "| 43719 (a) |" in text and "## #43719 (a): error" in text
    assert "- on the mooncake transport back end: present\n- on the nixl transport back end: absent" in text
    assert text.endswith("|\n\nthe end\n")  # trailing blank lines of the appendix dropped
    broken.verdict = "not-applicable"  # a verdict with no icon of its own
    assert "| A failed Mooncake send never acks the drain |  not-applicable |" in render_summary(FORK, [broken])


# -- a self-check's files ------------------------------------------------------------------------------
SELFCHECK_GOLDEN = GOLDEN.with_name("selfcheck.md")


def _selfcheck() -> tuple[list[MutationResult], list[HunkCoverage]]:
    """#38935's shipped mutations: causal but one left a field at head (insensitive), one met a probe error;
    a second fix had no head to mutate (not counted)."""
    results = [judge_mutation(FIX, m, "0.5.21", observed(FIX, m.hunks)) for m in FIX.mutations if m.hunks]
    door = next(s for s in FIX.probes if s.name == "pr38935_prefill_door")
    at_head = {door.name: {"rejected.enqueued": door.expect["rejected.enqueued"][1]}}
    results[0] = judge_mutation(FIX, mutation(results[0].mutation), "0.5.21", observed(FIX, results[0].hunks, at_head))
    crashed = observed(FIX, results[1].hunks)
    crashed[door.name] = Observation(FIX.id, door.name, "mutated", {}, "error", error="Traceback\nKeyError: 'rid'")
    results[1] = judge_mutation(FIX, mutation(results[1].mutation), "0.5.21", crashed)
    headless = dataclasses.replace(FIX, id="41404")
    return results, hunk_coverage([FIX, headless], {FIX.id: object()}, results)


def test_selfcheck_files_fail_the_mutations_that_are_not_causal_and_the_uncovered_paths(tmp_path: Path) -> None:
    results, coverage = _selfcheck()
    assert [r.outcome for r in results][:2] == ["insensitive", "error"] and results[2].outcome == "causal"
    write_selfcheck(tmp_path, results, coverage)
    doc = json.loads((tmp_path / "selfcheck.json").read_text())
    assert doc == json.loads(json.dumps(selfcheck_document(results, coverage)))
    assert doc["passed"] is False and doc["schema"] == 1
    covered, total = coverage_ratio(coverage)
    assert doc["hunk_coverage"] == {
        "covered": covered,
        "hunks": total,
        "fixes": [json.loads(json.dumps(c.to_dict())) for c in coverage],
    }
    assert 0 < covered < total == len(FIX.hunks)  # the headless fix's paths are not counted
    (suite,) = list(JUnitXml.fromfile(str(tmp_path / "selfcheck-junit.xml")))
    assert suite.name == "difflab-selfcheck"
    cases = [(c.classname, c.name, c) for c in suite]
    assert [(k, n) for k, n, _ in cases] == [
        *((f"selfcheck.{r.fix}", r.mutation) for r in results),
        ("selfcheck.38935", "hunk-coverage"),
        ("selfcheck.41404", "hunk-coverage"),
    ]
    for r, (_, _, case) in zip(results, cases[: len(results)], strict=True):
        if r.outcome == "causal":
            assert case.is_passed and not case.result
            continue
        (result,) = case.result
        assert isinstance(result, Error if r.outcome == "error" else Failure), r.outcome
        assert (result.type, result.message) == (r.outcome, r.reason)
    (uncovered,) = cases[len(results)][2].result
    assert isinstance(uncovered, Failure) and uncovered.type == "uncovered"
    assert uncovered.message == "no causal mutation for: " + ", ".join(coverage[0].uncovered)
    assert cases[-1][2].is_skipped  # a fix with no head to revert is said (skipped), neither passed nor failed
    text = (tmp_path / "selfcheck.md").read_text()
    assert text == _as_golden(text, SELFCHECK_GOLDEN)


def test_a_selfcheck_without_coverage_passes_on_its_mutations_alone(tmp_path: Path) -> None:
    results, coverage = _selfcheck()
    causal = [r for r in results if r.passed]
    assert selfcheck_document(causal, [])["passed"] is True
    assert selfcheck_document(results, [])["passed"] is False
    assert selfcheck_document(causal, coverage)["passed"] is False  # every mutation causal, two paths uncovered
    every = [judge_mutation(FIX, m, "0.5.21", observed(FIX, m.hunks)) for m in FIX.mutations if m.hunks]
    full = hunk_coverage([FIX], {FIX.id: object()}, every)
    assert selfcheck_document(every, full)["passed"] is True
    assert "| 38935 | 7 | 7 | - | - |" in render_selfcheck(every, full)
    both = dataclasses.replace(every[0], hunks=["prefill-door", "decode-door"])  # one mutation, two paths
    assert "| `drop-prefill-door-guard` | prefill-door, decode-door | `" in render_selfcheck([both], [])
    write_selfcheck(tmp_path, causal)
    text = (tmp_path / "selfcheck.md").read_text()
    assert "| fix | paths |" not in text and "Hunk coverage: 0/0 declared paths" in text
    assert text.endswith(" |\n") and text.count("| 38935 | `") == len(causal)


# -- a run's diff.json, junit.xml and summary.md ---------------------------------------------------------
RUN_GOLDEN = GOLDEN.with_name("run-summary.md")


def _run_verdicts() -> list[FixVerdict]:
    """The published run judged again with edits shaped like real outcomes: #38935's base already shows the
    head on the prefill door (not-reproduced), #41404's head forced a switch and returned a field nobody
    declares, #43719a's head probe crashed (error); #36988 stays confirmed, #43719b has no head release
    (unavailable, as declared); and one fix declares no probes."""
    matrix = load_matrix(PUBLISHED / "matrix.toml")
    published = json.loads((PUBLISHED / "diff.json").read_text())["fixes"]
    labels = {(f["id"], side): f[side] for f in published for side in ("base", "head")}
    observations = [
        Observation.from_dict(json.loads(p.read_text())) for p in sorted(PUBLISHED.glob("observations/*/*/*.json"))
    ]
    for o in observations:
        if (o.fix, o.side, o.probe) == ("38935", "base", "pr38935_prefill_door"):
            door = next(p for p in matrix.fix("38935").probes if p.name == o.probe)
            o.fields |= {f: pair[1] for f, pair in door.expect.items()}
        elif (o.fix, o.side) == ("41404", "head"):
            o.forced, o.fields = [FORCED], o.fields | {"failed.pages_leaked": 0}
        elif (o.fix, o.side) == ("43719a", "head"):
            o.status, o.fields, o.error = "error", {}, "Traceback (most recent call last):\nKeyError: 'bootstrap_room'"
    fixes = [*matrix.fixes, dataclasses.replace(matrix.fix("36988"), id="40000", pr=40000, probes=[])]
    return judge_all(fixes, observations, labels)


@pytest.fixture
def run_folder(tmp_path: Path) -> tuple[list[FixVerdict], Path]:
    verdicts = _run_verdicts()
    folder = tmp_path
    write_reports(folder, verdicts, extra={"matrix_sha256": "0" * 64}, appendix=["", "## Appendix", "", "kept"])
    return verdicts, folder


def test_a_run_with_mixed_verdicts_fails_in_diff_json(run_folder: tuple[list[FixVerdict], Path]) -> None:
    verdicts, folder = run_folder
    doc = json.loads((folder / "diff.json").read_text())
    assert doc == json.loads(json.dumps(diff_document(verdicts, {"matrix_sha256": "0" * 64})))
    assert doc["schema"] == SCHEMA_VERSION and doc["passed"] is False and doc["matrix_sha256"] == "0" * 64
    assert [(f["id"], f["verdict"], f["passed"]) for f in doc["fixes"]] == [
        ("36988", "confirmed", True),
        ("38935", "not-reproduced", False),
        ("41404", "confirmed", True),
        ("43719a", "error", False),
        ("43719b", "unavailable", True),
        ("40000", "error", False),
    ]
    assert diff_document([v for v in verdicts if v.passed])["passed"] is True
    assert "throughput" not in json.dumps(doc["fixes"][0])


def test_a_run_junit_case_per_probe_follows_its_verdict(run_folder: tuple[list[FixVerdict], Path]) -> None:
    verdicts, folder = run_folder
    (suite,) = list(JUnitXml.fromfile(str(folder / "junit.xml")))
    assert suite.name == "difflab"
    cases = {(c.classname, c.name): c for c in suite}
    probes = {(f"fix.{v.id}", p.probe): p for v in verdicts for p in v.probes}
    assert list(cases) == [*probes, ("fix.40000", "(no probes)")]
    kinds = {}
    for key, p in probes.items():
        case = cases[key]
        assert case.time == round(sum(o.duration_s for o in (p.base, p.head) if o is not None), 3)
        lines = (case.system_out or "").splitlines()
        assert [line.split(": base=", 1)[0] for line in lines] == [f"{f.kind} {f.field}" for f in p.fields]
        assert all(line.endswith(" ok" if f.ok else " MISMATCH") for f, line in zip(p.fields, lines, strict=True))
        if not case.result:
            kinds[key] = "passed"
            continue
        (result,) = case.result
        kinds[key] = type(result).__name__
        if isinstance(result, Skipped):
            assert result.message == f"{p.verdict}: {p.reason}"
        else:
            assert result.type == p.verdict  # "error" for an error, the verdict for a failure
            assert result.message == f"{p.verdict}: {p.reason}"
    assert kinds == {
        ("fix.36988", "pr36988_retire_aborted"): "passed",
        ("fix.38935", "pr38935_prefill_door"): "Failure",
        ("fix.38935", "pr38935_decode_door"): "passed",
        ("fix.41404", "pr41404_deferred_release"): "passed",
        ("fix.43719a", "pr43719_failed_send_ack"): "Error",
        ("fix.43719b", "pr43719_failed_room_quarantine"): "Skipped",
    }
    (bare,) = cases[("fix.40000", "(no probes)")].result
    assert isinstance(bare, Error) and (bare.type, bare.message) == ("error", verdicts[-1].reason)


def test_an_unavailable_side_not_declared_so_is_a_failed_case(tmp_path: Path) -> None:
    verdict = next(v for v in _run_verdicts() if v.id == "43719b")
    verdict.expected_unavailable = False
    write_reports(tmp_path, [verdict])
    (case,) = [c for s in JUnitXml.fromfile(str(tmp_path / "junit.xml")) for c in s]
    (result,) = case.result
    assert isinstance(result, Failure) and result.type == "unavailable"


def test_a_run_summary_is_the_page_a_reader_gets(run_folder: tuple[list[FixVerdict], Path]) -> None:
    _, folder = run_folder
    text = (folder / "summary.md").read_text()
    assert "- head: `server_args.disaggregation_decode_polling_interval` forced to 1" in text
    assert "- observed, declared in no expect or control: `failed.pages_leaked`" in text
    assert text == RUN_GOLDEN.read_text(encoding="utf-8")


# -- a release table's contains.json, contains.md, junit.xml and contains.html --------------------------
CONTAINS_GOLDEN, GRID_GOLDEN = GOLDEN.with_name("contains.md"), GOLDEN.with_name("contains.html")
SWITCH = "the decode offload is off by default in this build (server_args.enable_offload): forced on by the probe"


def _release_table() -> ContainmentTable:
    """Three fixes on four releases, each cell as ``judge_cell`` makes it: #38935 present from 0.5.21 and lost
    again on the new 0.5.23rc1 (a regression), #41404 errored on 0.5.22 and lacks the machinery on 0.5.19
    (n/a), #36988 present everywhere though its pins say absent on 0.5.19, with a switch forced there."""
    m = load_matrix(MACHINERY_MATRIX)
    fixes = [m.fix("38935"), m.fix("41404"), m.fix("36988")]
    releases = [
        ReleaseColumn("0.5.19", "sglang-0.5.19.whl", "1" * 64, yanked="broken wheel"),
        ReleaseColumn("0.5.21", "sglang-0.5.21.whl", "2" * 64),
        ReleaseColumn("0.5.22", "sglang-0.5.22.whl", "3" * 64),
        ReleaseColumn(
            "0.5.23rc1", "sglang-0.5.23rc1.whl", "4" * 64, new=True, first_seen="2026-11-30", prerelease=True
        ),
        ReleaseColumn("0.5.24", "sglang-0.5.24.whl", "5" * 64, new=True),
    ]
    door = {
        "pr38935_prefill_door": ProbeCell("head", "observations/38935/0.5.21/pr38935_prefill_door.json", "ok"),
        "pr38935_decode_door": ProbeCell("base", "observations/38935/0.5.21/pr38935_decode_door.json", "ok"),
    }
    split = {"mooncake": "present", "nixl": "present", "mori": "not-applicable: no Mori in this build"}
    cells = [
        Cell("38935", "0.5.19", ABSENT, None, "every path behaves like its base, the bug", door),
        Cell("38935", "0.5.21", PRESENT, PRESENT, "every path behaves like its head", door, backends=split),
        Cell("38935", "0.5.22", PRESENT, PRESENT, "every path behaves like its head", door),
        Cell("38935", "0.5.23rc1", PARTIAL, PRESENT, "like head: prefill-door; like base: decode-door", door),
        Cell("38935", "0.5.24", PRESENT, PRESENT, "every path behaves like its head"),
        Cell("41404", "0.5.19", NOT_APPLICABLE, ABSENT, "pr41404_deferred_release: no deferred release here"),
        Cell("41404", "0.5.21", PRESENT, PRESENT, "every path behaves like its head"),
        Cell("41404", "0.5.22", ERROR, PRESENT, "pr41404_deferred_release: probe error: KeyError: 'room'"),
        Cell("41404", "0.5.23rc1", PRESENT, PRESENT, ""),
        Cell("41404", "0.5.24", PRESENT, None, "every path behaves like its head"),
        Cell("36988", "0.5.19", PRESENT, ABSENT, "behaves like the head", notes=[SWITCH]),
        Cell("36988", "0.5.21", PRESENT, PRESENT, "behaves like the head", notes=[SWITCH]),
        Cell("36988", "0.5.22", PRESENT, PRESENT, "behaves like the head"),
        Cell("36988", "0.5.23rc1", PRESENT, PRESENT, "behaves like the head"),
        Cell("36988", "0.5.24", PRESENT, PRESENT, "behaves like the head"),
    ]
    versions = [r.version for r in releases]
    return ContainmentTable(fixes, releases, cells, find_regressions(fixes, versions, cells))


@pytest.fixture
def contains_folder(tmp_path: Path) -> tuple[ContainmentTable, Path]:
    t = _release_table()
    folder = tmp_path
    write_contains(folder, t, {"lock": "releases.lock"}, ["", "## SGLang's own tests", "", "not replayed"])
    write_html(folder, t, {"started": "2026-12-01T00:00:00Z", "exit_code": t.exit_code})
    return t, folder


def test_contains_json_names_the_regression_and_fails(contains_folder: tuple[ContainmentTable, Path]) -> None:
    t, folder = contains_folder
    doc = json.loads((folder / "contains.json").read_text())
    assert doc == json.loads(json.dumps(contains_document(t, {"lock": "releases.lock"})))
    assert doc["schema"] == 2 and doc["lock"] == "releases.lock" and doc["new_releases"] == ["0.5.23rc1", "0.5.24"]
    (regression,) = doc["regressions"]
    assert (regression["fix"], regression["present_in"], regression["lost_in"]) == ("38935", "0.5.22", "0.5.23rc1")
    assert doc["agrees"] is False and doc["exit_code"] == 1
    assert doc["fixes"] == [{"id": f.id, "label": f.label, "title": f.title} for f in t.fixes]
    assert [f["id"] for f in doc["fixes"]] == ["38935", "41404", "36988"] and doc["fixes"][0]["label"] == "#38935"
    assert len(doc["cells"]) == 15 and doc["releases"][0]["yanked"] == "broken wheel"


def test_contains_junit_fails_the_regression_and_the_contradicted_cell(
    contains_folder: tuple[ContainmentTable, Path],
) -> None:
    t, folder = contains_folder
    (suite,) = list(JUnitXml.fromfile(str(folder / "junit.xml")))
    assert suite.name == "difflab.contains"
    cases = {(c.classname, c.name): c for c in suite}
    assert list(cases) == [(f"contains.{f.id}", r.version) for f in t.fixes for r in t.releases]
    outcomes = {
        k: (type(c.result[0]).__name__, c.result[0].type, c.result[0].message) if c.result else None
        for k, c in cases.items()
    }
    assert outcomes == {
        ("contains.38935", "0.5.19"): None,
        ("contains.38935", "0.5.21"): None,
        ("contains.38935", "0.5.22"): None,
        ("contains.38935", "0.5.23rc1"): (
            "Failure",
            "regression",
            "regression: partial: like head: prefill-door; like base: decode-door",
        ),
        ("contains.38935", "0.5.24"): None,
        ("contains.41404", "0.5.19"): (
            "Skipped",
            None,
            "not-applicable: pr41404_deferred_release: no deferred release here",
        ),
        ("contains.41404", "0.5.21"): None,
        ("contains.41404", "0.5.22"): (
            "Error",
            "error",
            "error: pr41404_deferred_release: probe error: KeyError: 'room'",
        ),
        ("contains.41404", "0.5.23rc1"): None,
        ("contains.41404", "0.5.24"): None,
        ("contains.36988", "0.5.19"): ("Failure", "unexpected", "expected absent, got present: behaves like the head"),
        ("contains.36988", "0.5.21"): None,
        ("contains.36988", "0.5.22"): None,
        ("contains.36988", "0.5.23rc1"): None,
        ("contains.36988", "0.5.24"): None,
    }
    door = cases[("contains.38935", "0.5.21")].system_out
    assert door == (
        "pr38935_prefill_door: head (observations/38935/0.5.21/pr38935_prefill_door.json)\n"
        "pr38935_decode_door: base (observations/38935/0.5.21/pr38935_decode_door.json)"
    )
    assert cases[("contains.41404", "0.5.21")].system_out is None  # a cell with no probe: no output
    # a cell with no reason: the verdict alone
    assert t.cell("41404", "0.5.23rc1").reason == "" and cases[("contains.41404", "0.5.23rc1")].is_passed


def test_contains_md_and_the_grid_are_the_pages_a_reader_gets(contains_folder: tuple[ContainmentTable, Path]) -> None:
    _, folder = contains_folder
    page, grid = (
        (folder / "contains.md").read_text(encoding="utf-8"),
        (folder / "contains.html").read_text(encoding="utf-8"),
    )
    assert page == _as_golden(page, CONTAINS_GOLDEN)
    assert grid == _as_golden(grid, GRID_GOLDEN)


def test_a_table_without_regressions_or_new_releases_says_so(tmp_path: Path) -> None:
    t = _release_table()
    t.fixes, t.releases = t.fixes[2:], t.releases[1:3]
    t.cells, t.regressions = [c for c in t.cells if c.fix == "36988" and c.release in ("0.5.21", "0.5.22")], []
    text = render_contains(t)
    assert "No regressions: no fix present in a release is absent or partial in a later one.\n\n|" in text
    assert "## New releases" not in text and "## Details" not in text and "0.5.21 (" not in text
    assert text.endswith("## Switches the probes forced\n\n- #36988 (0.5.21): " + markdown_cell(SWITCH) + "\n")
    assert contains_document(t)["agrees"] is True and contains_document(t)["exit_code"] == 0


# -- a run with a throughput A/B -------------------------------------------------------------------------
THROUGHPUT_GOLDEN = GOLDEN.with_name("run-throughput-summary.md")


def _measured() -> list[ThroughputResult]:
    """#38935 slower by half, #41404 faster, #36988 the same, #43719a too noisy to tell, #43719b's bench
    died, and a fix with no head release (unavailable)."""

    def judged(fix: str, base: list, head: list) -> ThroughputResult:
        result = ThroughputResult(fix=fix, label=f"#{fix}", status="error", probe=f"pr{fix[:5]}_doors")
        return judge_throughput(result, WORKLOADS, base, head, seed=1)

    base = rounds(11, 20e-6)
    noisy = [
        {w: {s: v * (1.8 if i % 2 else 0.55) for s, v in cells.items()} for w, cells in one.items()}
        for i, one in enumerate(base)
    ]
    measured = [
        judged("38935", rounds(3, 20e-6), rounds(4, 30e-6)),
        judged("41404", rounds(5, 20e-6), rounds(6, 14e-6)),
        judged("36988", rounds(1, 20e-6), rounds(2, 20e-6)),
        judged("43719a", base, noisy),
        ThroughputResult(fix="43719b", label="#43719b", status="error", reason="bench died\nTraceback ..."),
        ThroughputResult(fix="40000", label="#40000", status="unavailable", reason="no head release"),
    ]
    for r in measured[1:4]:  # as the workflow records them (the first result measured carries none here)
        r.settings = {"rounds": 12, "warmup": 2, "sizes": list(SIZES)}
    return measured


def test_a_run_with_a_throughput_ab_fails_only_the_slowdown_beyond_the_factor(tmp_path: Path) -> None:
    verdicts, results = _run_verdicts(), _measured()
    assert [r.mark for r in results] == ["+", "-", "~", "?", "!", "!"]
    write_reports(tmp_path, verdicts, throughput=Measured(results, fail_above=1.10))
    doc = json.loads((tmp_path / "diff.json").read_text())
    parts = {f["id"]: f["throughput"] for f in doc["fixes"]}  # each fix's own A/B inside its entry
    assert parts == json.loads(json.dumps({r.fix: r.to_dict() for r in results}))
    (suite,) = list(JUnitXml.fromfile(str(tmp_path / "junit.xml")))
    cases = {(c.classname, c.name): c for c in suite if c.classname.startswith("throughput.")}
    assert len(list(suite)) == len(cases) + 7  # the six probes' cases and the fix with none
    outcome = {k[0]: (type(c.result[0]).__name__, c.result[0].type) if c.result else None for k, c in cases.items()}
    assert outcome == {
        "throughput.38935": ("Failure", "slower"),
        "throughput.41404": None,
        "throughput.36988": None,
        "throughput.43719a": None,
        "throughput.43719b": ("Error", "error"),
        "throughput.40000": ("Skipped", None),
    }
    slow = cases[("throughput.38935", "throughput:pr38935_doors")]
    assert slow.result[0].message.startswith("+ slower ratio 1.") and slow.result[0].message.endswith(": beyond x1.1")
    assert slow.system_out.splitlines()[0].startswith("door.valid: + ratio 1.")
    faster = cases[("throughput.41404", "throughput:pr41404_doors")]
    assert faster.system_out.startswith("- faster ratio 0.") and "\ndoor.mixed: - ratio 0." in faster.system_out
    assert cases[("throughput.43719b", "throughput:(none)")].result[0].message.split() == [
        "bench",
        "died",
        "Traceback",
        "...",
    ]
    text = (tmp_path / "summary.md").read_text()
    assert text == THROUGHPUT_GOLDEN.read_text(encoding="utf-8")
    write_reports(tmp_path, verdicts, throughput=Measured(results))  # informational: nothing fails
    (suite,) = list(JUnitXml.fromfile(str(tmp_path / "junit.xml")))
    assert not [c for c in suite if c.classname == "throughput.38935" and c.result]
    assert "informational" in (tmp_path / "summary.md").read_text()


def test_a_bench_log_keeps_its_tail_and_says_how_much_it_dropped(tmp_path: Path) -> None:
    text = "".join(f"request {i}: 503\n" for i in range(250))
    path = write_log_tail(tmp_path, "38935", "head", text)
    assert path == tmp_path / "throughput" / "38935" / "head.log"
    kept = path.read_text().splitlines()
    assert kept[0] == "[50 earlier lines not kept]" and kept[1] == "request 50: 503" and kept[-1] == "request 249: 503"
    assert len(kept) == 201
    short = write_log_tail(tmp_path, "38935", "base", "one\ntwo\n").read_text()
    assert short == "one\ntwo\n"
    assert (
        write_log_tail(tmp_path, "38935", "base", "".join(f"{i}\n" for i in range(200))).read_text().startswith("0\n")
    )


def test_a_probe_measured_at_one_size_has_no_exponent_and_unrecorded_settings_are_said(tmp_path: Path) -> None:
    """One size gives no slope (the exponent is NaN), and results read back without their settings say '?'."""
    base = [{w: {"10": cells["10"]} for w, cells in r.items()} for r in rounds(7, 2e-5)]
    head = [{w: {"10": v["10"] * 1.5} for w, v in r.items()} for r in base]
    unmeasured = ThroughputResult(fix="38935", label="#38935", status="error", probe="p")
    result = judge_throughput(unmeasured, WORKLOADS, base, head, seed=1)
    assert result.ok and result.exponent.base != result.exponent.base  # NaN
    died = ThroughputResult(fix="43719b", label="#43719b", status="error")  # a bench that left no reason
    text = "\n".join(summary_lines([result, died], None))
    assert "| #43719b | | | | | | error:  |" in text
    assert "(? pairs after ? warm-up); sizes ." in text and "; informational." in text
    row = r"\| #38935 \| `\+` \| 1\.\d{3} \| 1\.\d{3}–1\.\d{3} \| [0-9.e-]+ \| n/a → n/a \| slower \|"
    assert re.search(row, text), text
    (case,) = junit_cases([result], None)
    assert case.outcome == "passed" and "exponent n/a -> n/a" in case.message


def test_a_name_from_a_build_stays_one_code_span_in_one_table_cell() -> None:
    """A forced attribute's name comes from the build: its pipes, line breaks and backticks stay inside."""
    assert markdown_code("server_args.x") == "`server_args.x`"
    assert markdown_code("a|b\nc") == "`a\\|b c`"  # no cell boundary, no line break
    assert markdown_code("a`b") == "`` a`b ``"
    assert markdown_code("a``b|c") == "`` a` `b\\|c ``"


FILES = ("junit.xml", "summary.md")


@pytest.mark.parametrize("measured", [False, True])
def test_a_junit_writer_that_fails_leaves_a_stand_in_ci_reads_as_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], measured: bool
) -> None:
    """junit.xml in CI: a writer's own failure is one errored case naming it, and the run's other files stay."""
    import difflab.report as report

    def broken(*_args: object, **_kw: object) -> None:
        raise RuntimeError('writer broke on <"\x1b">')

    monkeypatch.setattr(report, "write_cases" if measured else "write_junit", broken)
    monkeypatch.setattr(report, "write_summary", broken)
    verdicts = _run_verdicts()
    report.write_reports(tmp_path, verdicts, throughput=Measured(_measured()[:1]) if measured else None)
    (suite,) = list(JUnitXml.fromfile(str(tmp_path / "junit.xml")))
    (case,) = list(suite)
    assert (suite.name, suite.tests, suite.errors, case.classname, case.name) == ("difflab", 1, 1, "difflab", "report")
    (error,) = case.result
    assert isinstance(error, Error) and error.message == 'RuntimeError: writer broke on <"\\x1b">'
    summary = (tmp_path / "summary.md").read_text()
    assert summary.startswith("# summary\n\nsummary.md could not be written: RuntimeError: writer broke on &lt;")
    assert summary.endswith("; diff.json holds every verdict.\n")
    assert len(json.loads((tmp_path / "diff.json").read_text())["fixes"]) == len(verdicts)
    err = capsys.readouterr().err.splitlines()
    why = 'RuntimeError: writer broke on <"\\x1b">'  # the ESC shown, never sent to the terminal
    assert err == [f"difflab: {name} could not be written ({why}); diff.json holds every verdict" for name in FILES]


def test_a_summary_goes_on_past_a_fix_with_no_probes_and_shows_every_forced_switch() -> None:
    """The fix with no probes first: every later fix keeps its section. Switches forced on both sides, by
    several variables or by none, are each said; a side with no label is left blank; build text stays text."""
    verdicts = _run_verdicts()
    verdicts = [verdicts[-1], *verdicts[:-1]]
    door = next(p for v in verdicts for p in v.probes if p.probe == "pr41404_deferred_release")
    door.base.forced = [dict(FORCED, env=["SGLANG_A", "SGLANG_B"])]
    door.head.forced = [dict(FORCED, env=[])]
    verdicts[0].head = {}
    verdicts[0].reason = "see https://example.org/x and www.example.org\nnext line"
    text = render_run_summary(verdicts)
    assert [line.split(":")[0] for line in text.splitlines() if line.startswith("## #")] == [
        f"## #{v.fix}{f' ({v.part})' if v.part else ''}" for v in verdicts[1:]
    ]
    forced = "`server_args.disaggregation_decode_polling_interval` forced to 1; this build's default is 10"
    assert f"- base: {forced} (SGLANG_A, SGLANG_B)\n- head: {forced} (no environment variable)" in text
    row = next(line for line in text.splitlines() if line.startswith("| 40000 |"))
    assert row.split("|")[3:5] == [" missing ", " "]  # the base's label, and no head label at all
    assert "see https&#58;//example.org/x and www&#46;example.org next line" in row
