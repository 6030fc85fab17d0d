"""Throughput A/B on the real hot paths of the real releases (CPU, warm back end).

What holds whatever this machine's speed:

- head against head: every fix's probe builds its loads on the real release, times every
  workload at every size in every round on both sides (positive CPU seconds per item), and
  the result is the judgment of exactly those samples;
- ``difflab run --throughput --throughput-fail-above 1.10`` turns a significant slowdown
  into exit 1 while every behaviour verdict is still ``confirmed``: the real run, with
  recorded samples of a 1.5x slower door standing in for the timed ones, so the mark, the
  ratio and the exit code are exact.

Which mark a real A/B gives is a timing, never asserted here: head against head at every
fix, alone and under load, is ``bench/bench_throughput_aa.py``; a slowed head is
``difflab run --throughput`` on the default matrix (docs/throughput.md).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from junitparser import JUnitXml

from difflab import cli
from difflab.diff.throughput import ThroughputResult, judge_throughput
from difflab.environment.shared import SharedEnvironment
from difflab.matrix import load_matrix
from difflab.paths import default_matrix
from difflab.progress import Reporter
from difflab.runner.warm import WarmRunner
from difflab.source.release import ReleaseSource
from difflab.workflows import throughput as workflow
from difflab.workflows.throughput import ThroughputOptions, measure

pytestmark = [pytest.mark.sglang, pytest.mark.xdist_group("release")]

SAME = ThroughputOptions(rounds=3, sizes=(10, 100), min_items=20, min_runs=2, max_items=100)
"""Head against head: enough rounds to judge (pairs), few enough to stay short."""
FIXES = tuple(f.id for f in load_matrix(default_matrix()).fixes if f.throughput)  # every fix with a throughput probe
WORKLOADS = {  # what each of these probes measures (a fix added later: its own names, non-empty and distinct)
    "36988": ["final_results"],
    "38935": ["prefill_door.valid", "prefill_door.mixed", "decode_door.valid", "decode_door.mixed"],
    "41404": ["failures"],
    "43719a": ["sends.succeeded", "sends.failed"],
}


@pytest.fixture(scope="module")
def measured(matrix, tmp_path_factory: pytest.TempPathFactory) -> dict[str, ThroughputResult]:
    """Every fix head against head, on one warm hub."""
    releases = ReleaseSource(matrix.releases)
    fixes, sources = [], {}
    for fix_id in FIXES:
        fix = matrix.fix(fix_id)
        head = releases.release(fix.head.release)
        fixes.append(fix)
        sources[(fix.id, "base")] = sources[(fix.id, "head")] = head
    work = tmp_path_factory.mktemp("throughput")
    with WarmRunner(environment=SharedEnvironment().ensure()) as runner:
        results = measure(fixes, sources, runner, work, Reporter(), SAME)
    return {r.fix: r for r in results}


def test_head_against_head_measures_every_workload_at_every_size_on_both_sides(measured):
    for fix_id in FIXES:
        r = measured[fix_id]
        assert r.status == "ok", (fix_id, r.reason)
        assert r.base["sglang_version"] == r.head["sglang_version"] is not None
        names = [w.name for w in r.workloads]
        assert names == WORKLOADS.get(fix_id, names) and names and len(set(names)) == len(names), fix_id
        assert all(w.unit and w.what for w in r.workloads), fix_id
        for side in ("base", "head"):
            assert len(r.samples[side]) == len(r.samples["wall"][side]) == SAME.rounds
            for one in r.samples[side]:
                assert set(one) == set(names)
                for cells in one.values():
                    assert set(cells) == {"10", "100"}
                    assert all(0.0 < v < 1.0 and math.isfinite(v) for v in cells.values()), (fix_id, cells)
        assert r.cpu_s > 0 and r.wall_s > 0


def test_head_against_head_is_judged_on_exactly_its_samples(measured):
    for fix_id in FIXES:
        r = measured[fix_id]
        described = [{"name": w.name, "unit": w.unit, "what": w.what} for w in r.workloads]
        fresh = ThroughputResult(fix=fix_id, label=r.label, status="error")
        again = judge_throughput(fresh, described, r.samples["base"], r.samples["head"], SAME.seed, r.samples["wall"])
        assert (again.mark, again.ratio, again.ci) == (r.mark, r.ratio, r.ci), fix_id
        assert r.comparison.p_value >= 2 / 2**SAME.rounds  # three pairs are never significant
        assert r.mark in ("~", "?") and not r.fails(1.0), (fix_id, r.ratio, r.ci)


def test_fail_above_turns_a_slowdown_into_exit_1(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The real run of #38935 with --throughput; recorded samples of a 1.5x slower prefill door are judged."""

    def recorded_slowdown(result, described, base, head, seed, wall=None):
        assert len(base) == len(head) == 10 and set(base[0]) == set(WORKLOADS["38935"])  # what was measured
        slowed = [
            {
                w: {s: v * (1.5 if w.startswith("prefill") else 1.0) for s, v in cells.items()}
                for w, cells in one.items()
            }
            for one in base
        ]
        return judge_throughput(result, described, base, slowed, seed)

    monkeypatch.setattr(workflow, "judge_throughput", recorded_slowdown)
    out = tmp_path / "run"
    argv = ["run", "--fix", "38935", "--throughput", "--rounds", "10", "--throughput-sizes", "10,100"]
    assert cli.main([*argv, "--throughput-fail-above", "1.10", "--no-bundle", "--out", str(out)]) == 1
    (fix,) = json.loads((out / "diff.json").read_text())["fixes"]
    assert fix["verdict"] == "confirmed"  # the behaviour passed: the exit 1 is the slowdown
    part = fix["throughput"]
    assert part["status"] == "ok" and part["mark"] == "+" and part["outcome"] == "slower"
    assert part["ratio"] == pytest.approx(1.5**0.5) and part["p_value"] == pytest.approx(2 / 2**10)
    marks = {w["name"]: w["mark"] for w in part["workloads"]}
    assert marks == {"prefill_door.valid": "+", "prefill_door.mixed": "+", "decode_door.valid": "~"} | {
        "decode_door.mixed": "~"
    }
    cases = {(c.classname, c.name): c for suite in JUnitXml.fromfile(str(out / "junit.xml")) for c in suite}
    failed = cases[("throughput.38935", "throughput:pr38935_doors")]
    assert failed.result and failed.result[0].type == "slower"
    assert "fails" in (out / "summary.md").read_text()
    run_json = json.loads((out / "run.json").read_text())
    assert run_json["exit_code"] == 1 and run_json["throughput"]["fail_above"] == 1.10
    assert (out / "throughput" / "38935" / "head.log").is_file()
