"""Exit codes and ``passed`` flags of whole runs, on matrices whose fixes do NOT all agree.

Every other run test has uniform verdicts, so "all" turned into "any" (or a gate that alone
decides the exit) would go unseen there. The runs here drive ``difflab.cli.main`` on the real
probes and the cached releases: one fix whose head is the fixing release (confirmed) beside one
whose head is pinned to its own base (not-fixed, a real head that still shows the bug).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from junitparser import Failure, JUnitXml

from difflab.cli import main
from difflab.paths import probes_dir
from matrix_samples import FIX, RELEASES

# The sample fix with its head pinned to its base release: a real not-fixed beside the confirmed one.
STILL_BROKEN = (
    FIX.replace('id = "38935"', 'id = "38935-unfixed"')
    .replace("pr = 38935", "pr = 1")
    .replace('title = "t"', 'title = "head pinned to the base release"')
    .replace('head = { release = "0.5.21" }', 'head = { release = "0.5.20" }')
)


@pytest.fixture(scope="module")
def mixed_matrix(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("matrix") / "matrix.toml"
    path.write_text(RELEASES + FIX + STILL_BROKEN)
    return path


def _run_json(out: Path) -> dict:
    return json.loads((out / "run.json").read_text())


@pytest.fixture(scope="module")
def throughput_run(mixed_matrix: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[int, Path]:
    """``--throughput`` on the mixed matrix: the gate itself passes (no bench declared, no factor)."""
    out = tmp_path_factory.mktemp("tp") / "out"
    argv = ["run", "--matrix", str(mixed_matrix), "--out", str(out), "--no-bundle", "--throughput"]
    code = main([*argv, "--rounds", "2", "--throughput-sizes", "10,20"])
    return code, out


def test_a_not_fixed_verdict_fails_a_run_whose_other_fix_is_confirmed(throughput_run: tuple[int, Path]) -> None:
    code, out = throughput_run
    diff = json.loads((out / "diff.json").read_text())
    by_id = {f["id"]: f for f in diff["fixes"]}
    assert (by_id["38935"]["verdict"], by_id["38935"]["passed"]) == ("confirmed", True)
    assert (by_id["38935-unfixed"]["verdict"], by_id["38935-unfixed"]["passed"]) == ("not-fixed", False)
    assert diff["passed"] is False  # every fix must pass, not any
    assert code == 1 and _run_json(out)["exit_code"] == 1


def test_throughput_gate_passing_does_not_hide_a_failed_verdict(throughput_run: tuple[int, Path]) -> None:
    """The gate had nothing to fail on; the exit code is the verdicts' and the gate's together."""
    code, out = throughput_run
    assert _run_json(out)["throughput"]["rounds"] == 2  # the A/B did run, with these options
    assert code == 1


def test_junit_reads_one_passed_and_one_failed_case(throughput_run: tuple[int, Path]) -> None:
    _, out = throughput_run
    cases = {(c.classname, c.name): c for suite in JUnitXml.fromfile(str(out / "junit.xml")) for c in suite}
    confirmed = cases[("fix.38935", "pr38935_prefill_door")]
    unfixed = cases[("fix.38935-unfixed", "pr38935_prefill_door")]
    assert confirmed.is_passed and not confirmed.result
    (failure,) = unfixed.result
    assert isinstance(failure, Failure) and failure.type == "not-fixed"
    assert "rejected.enqueued" in (failure.message or "")


def test_run_selfcheck_end_to_end_on_the_default_matrix(tmp_path: Path) -> None:
    """A fix whose every declared mutation is causal passes; its selfcheck files are written and agree."""
    out = tmp_path / "out"
    code = main(["run", "--fix", "38935", "--out", str(out), "--no-bundle", "--selfcheck"])
    check = json.loads((out / "selfcheck.json").read_text())
    assert check["mutations"] and all(m["outcome"] == "causal" for m in check["mutations"])
    coverage = check["hunk_coverage"]
    assert coverage["covered"] == coverage["hunks"] > 0
    assert check["passed"] is True and code == 0 and _run_json(out)["exit_code"] == 0
    cases = [c for suite in JUnitXml.fromfile(str(out / "selfcheck-junit.xml")) for c in suite]
    assert len(cases) == len(check["mutations"]) + 1 and all(c.is_passed for c in cases)


def test_run_selfcheck_reports_and_fails_a_fix_without_mutations(mixed_matrix: Path, tmp_path: Path) -> None:
    """The fixture fix declares no mutation: confirmed, but its self-check is an error and the run fails."""
    out = tmp_path / "out"
    code = main(
        ["run", "--matrix", str(mixed_matrix), "--fix", "38935", "--out", str(out), "--no-bundle", "--selfcheck"]
    )
    diff = json.loads((out / "diff.json").read_text())
    assert [f["verdict"] for f in diff["fixes"]] == ["confirmed"] and diff["passed"] is True
    check = json.loads((out / "selfcheck.json").read_text())
    (row,) = check["mutations"]
    assert (row["fix"], row["outcome"], row["passed"]) == ("38935", "error", False)
    assert "no reverting mutation" in row["reason"]
    assert "38935" in (out / "selfcheck.md").read_text() and check["passed"] is False
    assert code == 1


def test_observe_exits_non_zero_when_a_probe_errored(mixed_matrix: Path, tmp_path: Path) -> None:
    out = tmp_path / "cell"
    argv = ["observe", "--matrix", str(mixed_matrix), "--side", "head", "--out", str(out), "--no-cache"]
    code = main([*argv, "--timeout", "0.05"])
    observations = [json.loads(p.read_text()) for p in (out / "observations").rglob("*.json")]
    assert observations and all(o["status"] == "error" for o in observations)
    assert code == 1 and _run_json(out)["exit_code"] == 1


LOST_MODULE_PROBE = '''"""A probe of a module this build lacks: it must end as an error, never as an observation."""

from difflab.probe.kit import Kit


def observe(kit: Kit) -> dict:
    import sglang.srt.disaggregation.no_such_module  # noqa: F401

    return {"rejected.enqueued": False}
'''


def test_observe_exits_non_zero_when_one_probe_errored_and_the_others_ran(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A probes folder of one's own (``$DIFFLAB_PROBES``) with one probe that cannot import what it probes."""
    probes = tmp_path / "probes"
    shutil.copytree(probes_dir(), probes, ignore=shutil.ignore_patterns("__pycache__"))
    (probes / "pr38935_lost_module.py").write_text(LOST_MODULE_PROBE)
    monkeypatch.setenv("DIFFLAB_PROBES", str(probes))
    matrix = tmp_path / "matrix.toml"
    matrix.write_text(RELEASES + FIX + STILL_BROKEN.replace('"pr38935_prefill_door"', '"pr38935_lost_module"'))
    out = tmp_path / "cell"
    code = main(["observe", "--matrix", str(matrix), "--side", "head", "--out", str(out), "--no-cache"])
    status = {p.parent.parent.name: json.loads(p.read_text())["status"] for p in (out / "observations").rglob("*.json")}
    assert status == {"38935": "ok", "38935-unfixed": "error"}
    assert code == 1 and _run_json(out)["exit_code"] == 1
