"""Throughput A/B on the real hot paths of the real releases (CPU, warm back end).

- head against head is ``~`` (not significant) for every fix: the measurement does not
  invent differences;
- a deliberately slowed head -- a mutation, applied like ``difflab selfcheck`` applies one
  (a hard-linked copy of the release, one file edited), that adds a linear scan of the
  waiting requests to the prefill door -- is significantly slower, only at that door,
  with a higher growth exponent;
- ``difflab run --throughput --throughput-fail-above 1.10`` turns that slowdown into exit 1
  while every behaviour verdict is still ``confirmed``.

Few rounds and small sizes keep it short, but never below what the statistics need: seven
rounds per side is the fewest with which a difference can reach p < 0.002, and at 1000
waiting requests the scan costs several times the door itself.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from junitparser import JUnitXml

from difflab import cli
from difflab.environment.shared import SharedEnvironment
from difflab.matrix.model import Mutation
from difflab.progress import Reporter
from difflab.runner.warm import WarmRunner
from difflab.source.release import ReleaseSource
from difflab.workflows import run as run_workflow
from difflab.workflows.selfcheck import mutated_copy
from difflab.workflows.throughput import ThroughputOptions, gate_exit, measure

pytestmark = [pytest.mark.sglang, pytest.mark.xdist_group("release")]

SCAN = Mutation(
    name="throughput-test-scan-at-prefill-door",
    file="sglang/srt/disaggregation/prefill.py",
    find="if is_unadmitted_reject(req):",
    replace="if any(waiting.rid == req.rid for waiting in self.queue) or is_unadmitted_reject(req):",
    targets=(),
)
"""A duplicate-request check that scans every waiting request: an O(n) door."""
SAME = ThroughputOptions(rounds=7, sizes=(10, 100), min_items=50, min_runs=3, max_items=100)
"""Head against head: seven rounds, the fewest with which a difference could be significant."""
SLOWED = ThroughputOptions(rounds=12, sizes=(10, 1000), min_items=50, min_runs=3, max_items=300)
"""At 1000 waiting requests the scan costs several times the door itself. Twelve rounds a side: with eight,
p < 0.002 needs nearly every head round slower than every base round, which a machine busy with other
tests (a parallel suite on two cores) can deny even a 1.6x slowdown."""
FIXES = ("36988", "38935", "41404", "43719a")


@pytest.fixture(scope="module")
def measured(matrix, tmp_path_factory: pytest.TempPathFactory):
    """Every fix head against head, and #38935's head against its slowed copy, on one warm hub."""
    releases = ReleaseSource(matrix.releases)
    fixes, sources = [], {}
    for fix_id in FIXES:
        fix = matrix.fix(fix_id)
        head = releases.release(fix.head.release)
        fixes.append(fix)
        sources[(fix.id, "base")] = sources[(fix.id, "head")] = head
    door = matrix.fix("38935")
    pristine = releases.release(door.head.release)
    slowed = dataclasses.replace(door, id="38935-slowed")
    slowed_sources = {(slowed.id, "base"): pristine, (slowed.id, "head"): mutated_copy(pristine, SCAN)}
    work = tmp_path_factory.mktemp("throughput")
    with WarmRunner(environment=SharedEnvironment().ensure()) as runner:
        results = measure(fixes, sources, runner, work, Reporter(), SAME)
        results += measure([slowed], slowed_sources, runner, work, Reporter(), SLOWED)
    return {r.fix: r for r in results}


def test_head_against_head_is_not_significant_for_any_fix(measured):
    for fix_id in FIXES:
        r = measured[fix_id]
        assert r.status == "ok", (fix_id, r.reason)
        assert r.mark == "~", (fix_id, r.ratio, r.ci, r.comparison.p_value)
        assert r.ci[0] < 1.0 < r.ci[1] or r.comparison.p_value >= 0.002
        assert r.base["sglang_version"] == r.head["sglang_version"]
        assert len(r.samples["base"]) == len(r.samples["head"]) == SAME.rounds


def test_a_linear_scan_at_the_door_is_a_significant_slowdown_that_grows(measured):
    r = measured["38935-slowed"]
    assert r.status == "ok", r.reason
    assert r.mark == "+" and r.ratio > 1.10 and r.comparison.p_value < 0.002, (r.ratio, r.ci)
    assert r.exponent.head > r.exponent.base + 0.1 and r.exponent.p_value < 0.002, r.exponent
    door = {w.name: w for w in r.workloads}
    for name in ("prefill_door.valid", "prefill_door.mixed"):
        assert door[name].mark == "+", name
        assert door[name].sizes["1000"]["ratio"] > door[name].sizes["10"]["ratio"], name
    for name in ("decode_door.valid", "decode_door.mixed"):
        assert door[name].mark == "~", (name, door[name].comparison.ratio)  # the scan is not at this door
    assert r.fails(1.10) and gate_exit([r], 1.10) == 1 and gate_exit([r], None) == 0


def test_fail_above_turns_the_slowdown_into_exit_1(matrix, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    materialise = run_workflow.materialise_sides

    def slowed_head(*args, **kwargs):
        sources = materialise(*args, **kwargs)
        sources[("38935", "head")] = mutated_copy(sources[("38935", "head")], SCAN)
        return sources

    monkeypatch.setattr(run_workflow, "materialise_sides", slowed_head)
    out = tmp_path / "run"
    argv = ["run", "--fix", "38935", "--throughput", "--rounds", "12", "--throughput-sizes", "10,1000"]
    assert cli.main([*argv, "--throughput-fail-above", "1.10", "--no-bundle", "--out", str(out)]) == 1
    (fix,) = json.loads((out / "diff.json").read_text())["fixes"]
    assert fix["verdict"] == "confirmed"  # the behaviour passed: the exit 1 is the slowdown
    part = fix["throughput"]
    assert part["status"] == "ok" and part["mark"] == "+" and part["ratio"] > 1.10
    assert part["exponent"]["head"] > part["exponent"]["base"]
    cases = {(c.classname, c.name): c for suite in JUnitXml.fromfile(str(out / "junit.xml")) for c in suite}
    failed = cases[("throughput.38935", "throughput:pr38935_doors")]
    assert failed.result and failed.result[0].type == "slower"
    assert "fails" in (out / "summary.md").read_text()
    run_json = json.loads((out / "run.json").read_text())
    assert run_json["exit_code"] == 1 and run_json["throughput"]["fail_above"] == 1.10
    assert (out / "throughput" / "38935" / "head.log").is_file()
