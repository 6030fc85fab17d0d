"""Judging and reporting a throughput A/B from per-round samples with known answers.

Rounds are shaped like the bench's: ``rounds[r][workload][str(size)]`` = seconds per item.
Also: the matrix's ``[fixes.throughput]``, the ``run`` options, the [stats] extra's
absence, and ``reproduce`` comparing a timing within the recorded interval.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest
from junitparser import JUnitXml, Skipped

import difflab.diff.throughput as judging
from difflab import cli, stats
from difflab.bundle.compare import compare_runs
from difflab.diff.throughput import ThroughputResult, judge_throughput
from difflab.errors import ConfigError
from difflab.matrix import load_matrix
from difflab.report.junit import Case, write_cases
from difflab.report.throughput import junit_cases, summary_lines
from difflab.stats.scaling import fit_exponent, geometric_mean
from difflab.workflows.throughput import ThroughputOptions, gate_exit

SIZES = (10, 100, 1000)
WORKLOADS = [{"name": "door.valid", "unit": "requests", "what": "a door"}, {"name": "door.mixed", "unit": "requests"}]


def rounds(seed: int, per_item: float, exponent: float = 0.0, n: int = 12, noise: float = 0.03) -> list:
    """``n`` rounds of time per item ``per_item * (size/10)**exponent``, lognormal noise."""
    rng = np.random.default_rng(seed)
    return [
        {
            w["name"]: {str(s): per_item * (s / 10) ** exponent * float(rng.lognormal(0, noise)) for s in SIZES}
            for w in WORKLOADS
        }
        for _ in range(n)
    ]


def judged(base: list, head: list) -> ThroughputResult:
    result = ThroughputResult(fix="38935", label="#38935", status="error", probe="pr38935_doors")
    return judge_throughput(result, WORKLOADS, base, head, seed=1)


def test_the_same_distribution_is_not_significant():
    r = judged(rounds(1, 20e-6), rounds(2, 20e-6))
    assert r.ok and r.mark == "~" and 0.95 < r.ratio < 1.05 and r.ci[0] < 1 < r.ci[1]
    assert not r.fails(1.10) and all(w.mark == "~" for w in r.workloads)
    assert abs(r.exponent.base) < 0.05 and abs(r.exponent.head) < 0.05


def test_a_uniform_slowdown_is_plus_with_its_ratio_and_fails_beyond_the_factor():
    r = judged(rounds(3, 20e-6), rounds(4, 30e-6))
    assert r.mark == "+" and 1.45 < r.ratio < 1.55 and 1.4 < r.ci[0] < r.ci[1] < 1.6
    assert r.comparison.p_value < 0.002 and r.fails(1.10) and not r.fails(1.60) and not r.fails(None)
    assert all(w.mark == "+" for w in r.workloads)
    assert abs(r.exponent.head - r.exponent.base) < 0.05  # slower, but it does not grow
    faster = judged(rounds(5, 30e-6), rounds(6, 20e-6))
    assert faster.mark == "-" and not faster.fails(1.0)


def test_a_linear_scan_shows_in_the_exponent():
    r = judged(rounds(7, 20e-6), rounds(8, 20e-6, exponent=0.5))
    assert r.exponent.base == pytest.approx(0.0, abs=0.05) and r.exponent.head == pytest.approx(0.5, abs=0.05)
    assert r.exponent.p_value < 0.002
    assert r.workloads[0].sizes["1000"]["ratio"] == pytest.approx(10.0, rel=0.1)
    assert r.workloads[0].sizes["10"]["ratio"] == pytest.approx(1.0, rel=0.1)


def test_ten_rounds_are_the_fewest_that_can_be_significant():
    assert judged(rounds(9, 1e-5, n=9), rounds(10, 2e-5, n=9)).mark == "~"  # 2 / 2**9 = 0.0039
    assert judged(rounds(9, 1e-5, n=10), rounds(10, 2e-5, n=10)).mark == "+"  # 2 / 2**10 = 0.00195


def test_scaling_helpers():
    assert fit_exponent({10: 1.0, 100: 10.0, 1000: 100.0}) == pytest.approx(1.0)
    assert fit_exponent({10: 5.0, 1000: 5.0}) == pytest.approx(0.0)
    assert geometric_mean([2.0, 0.5]) == pytest.approx(1.0)
    with pytest.raises(ValueError):
        fit_exponent({10: 1.0})


def test_reports_name_the_mark_ratio_interval_p_and_exponents():
    slow = judged(rounds(3, 20e-6), rounds(4, 30e-6))
    same = judged(rounds(1, 20e-6), rounds(2, 20e-6))
    same.fix, same.label = "36988", "#36988"
    broken = ThroughputResult(fix="41404", label="#41404", status="error", reason="bench died\nlog")
    text = "\n".join(summary_lines([slow, same, broken], 1.10))
    assert re.search(r"\| #38935 \| `\+` \| 1\.[45]\d\d \| 1\.\d{3}–1\.\d{3} \| 0\.000\d+ \|", text), text
    assert "slower: beyond ×1.1, fails" in text
    assert "| #36988 | `~` |" in text and "no significant difference" in text
    assert "error: bench died" in text and "`door.mixed`" in text
    cases: dict[str, Case] = {c.classname: c for c in junit_cases([slow, same, broken], 1.10)}
    assert cases["throughput.38935"].outcome == "failed"
    assert cases["throughput.36988"].outcome == "passed"
    assert cases["throughput.41404"].outcome == "error"
    assert all(c.outcome != "failed" for c in junit_cases([slow], None))  # informational by default
    doc = slow.to_dict()
    assert doc["mark"] == "+" and doc["alpha"] == 0.002 and len(doc["samples"]["head"]) == 12
    assert json.loads(json.dumps(doc)) == doc


@pytest.mark.inventory
def test_matrix_declares_a_throughput_probe(tmp_path: Path, matrix):
    timed = [f for f in matrix.fixes if f.throughput]
    assert matrix.fix("38935").throughput == "pr38935_doors" and timed
    for fix in timed:  # named after its fix, with its file, and only where a head can be timed against the base
        assert fix.throughput.startswith(f"pr{fix.pr}"), (fix.id, fix.throughput)
        assert (Path(__file__).parents[1] / "probes" / "throughput" / f"{fix.throughput}.py").is_file()
        assert not fix.head.unavailable, fix.id
    text = matrix.path.read_text()
    for bad, message in (('probe = "no-dash"', "not a probe module name"), ('probe = "x"\nrounds = 3', "unknown")):
        broken = tmp_path / "m.toml"
        broken.write_text(text.replace('probe = "pr38935_doors"', bad, 1))
        with pytest.raises(ConfigError, match=message) as info:
            load_matrix(broken)
        assert "fix '38935'.throughput" in str(info.value)


def test_options_refuse_what_cannot_be_measured():
    with pytest.raises(ConfigError, match="at least 2"):
        ThroughputOptions(rounds=1)
    with pytest.raises(ConfigError, match="two different"):
        ThroughputOptions(sizes=(100, 100))
    with pytest.raises(ConfigError, match="factor"):
        ThroughputOptions(fail_above=0.9)
    assert ThroughputOptions.from_record(ThroughputOptions(sizes=(10, 300)).record()).sizes == (10, 300)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--throughput", "--backend", "subprocess"], "warm back end"),
        (["--throughput-fail-above", "1.1"], "needs --throughput"),
        (["--throughput", "--rounds", "1"], "at least 2"),
        (["--throughput", "--side", "base"], None),
    ],
)
def test_run_refuses_bad_throughput_options_with_exit_2(argv, message, tmp_path: Path, capsys):
    if "--side" in argv:  # observe has no --throughput at all
        with pytest.raises(SystemExit) as info:
            cli.main(["observe", "--fix", "38935", "--out", str(tmp_path / "o"), *argv])
        assert info.value.code == 2
        return
    assert cli.main(["run", "--fix", "38935", "--out", str(tmp_path / "o"), *argv]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_without_the_stats_extra_throughput_names_the_extra(tmp_path: Path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "scipy", None)  # import scipy fails, as without the extra
    assert stats.missing() == ["scipy"]
    assert cli.main(["run", "--fix", "38935", "--throughput", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "pip install 'sglang-difflab[stats]'" in err and "scipy" in err
    assert not (tmp_path / "o").exists()


def _run_folder(root: Path, throughput: dict) -> Path:
    root.mkdir()
    entry = {"id": "38935", "fix": 38935, "verdict": "confirmed", "throughput": throughput}
    (root / "diff.json").write_text(json.dumps({"schema": 1, "fixes": [entry]}))
    return root


@pytest.mark.parametrize(
    ("now", "differs", "noted"),
    [
        ({"status": "ok", "ratio": 1.48, "ci": [1.40, 1.57]}, False, False),  # inside the recorded interval
        ({"status": "ok", "ratio": 1.60, "ci": [1.52, 1.70]}, False, True),  # outside, intervals overlap
        ({"status": "ok", "ratio": 1.02, "ci": [0.98, 1.06]}, True, False),  # incompatible
        ({"status": "error", "ratio": None, "ci": None}, True, False),
    ],
)
def test_reproduce_compares_throughput_within_the_recorded_interval(tmp_path: Path, now, differs, noted):
    recorded = _run_folder(tmp_path / "a", {"status": "ok", "ratio": 1.46, "ci": [1.37, 1.58]})
    rerun = _run_folder(tmp_path / "b", now)
    report = compare_runs(recorded, rerun)
    assert bool(report.differences) == differs, report.differences
    assert any("throughput" in n for n in report.notes) == noted


def test_reproduce_re_runs_with_the_recorded_throughput_settings(tmp_path: Path):
    from difflab.workflows.reproduce import spec_for

    settings = ThroughputOptions(rounds=8, sizes=(10, 300), fail_above=1.2).record()
    (tmp_path / "run.json").write_text(
        json.dumps({"fixes": ["38935"], "sides": ["base", "head"], "throughput": settings})
    )
    spec = spec_for(tmp_path, tmp_path / "rerun")
    assert spec.throughput == settings
    assert ThroughputOptions.from_record(spec.throughput) == ThroughputOptions(
        rounds=8, sizes=(10, 300), fail_above=1.2
    )
    (tmp_path / "run.json").write_text(json.dumps({"fixes": ["38935"]}))
    assert spec_for(tmp_path, tmp_path / "rerun").throughput is None


def test_an_unstable_fix_says_so_with_its_spread_and_never_fails():
    base = rounds(11, 20e-6)
    head = [
        {w: {s: v * (1.8 if i % 2 else 0.55) for s, v in cells.items()} for w, cells in one.items()}
        for i, one in enumerate(base)
    ]
    r = judged(base, head)
    assert r.ok and r.mark == "?" and r.outcome == "unstable" and r.comparison.spread > 0.25
    assert not r.fails(1.0) and gate_exit([r], 1.0) == 0
    text = "\n".join(summary_lines([r], 1.10))
    assert re.search(r"\| #38935 \| `\?` \| .* \| unstable: too noisy to tell \(±\d+%\) \|", text), text
    (case,) = junit_cases([r], 1.10)
    assert case.outcome == "passed" and case.message.startswith("? unstable ratio ")
    assert "`?` unstable" in text and "± 25%" in text and "1 ± 10%" in text


def test_every_interval_is_drawn_with_the_given_seed(monkeypatch):
    """The overall, per-workload and wall comparisons all bootstrap with the run's seed (``reproduce`` redraws them)."""
    seeds = []
    real = judging.compare_paired

    def spy(metric, base, head, *, gate, bootstrap=None):
        seeds.append((metric, bootstrap.seed if bootstrap is not None else "default"))
        return real(metric, base, head, gate=gate, bootstrap=bootstrap)

    monkeypatch.setattr(judging, "compare_paired", spy)
    base, head = rounds(21, 20e-6), rounds(22, 30e-6)
    result = ThroughputResult(fix="38935", label="#38935", status="error", probe="pr38935_doors")
    judge_throughput(result, WORKLOADS, base, head, seed=987, wall={"base": base, "head": head})
    assert [m for m, _ in seeds] == [
        "seconds per item, geometric mean of every workload and size",
        "wall seconds per item, geometric mean",
        "door.valid: seconds per item, geometric mean of sizes",
        "door.mixed: seconds per item, geometric mean of sizes",
    ]
    assert {s for _, s in seeds} == {987}


def test_the_exponents_are_compared_pair_by_pair_as_differences():
    """Both sides grow as size**0.5 with noise: the exponents' differences straddle 0, so no change in scaling."""
    r = judged(rounds(23, 20e-6, exponent=0.5), rounds(24, 20e-6, exponent=0.5))
    assert r.exponent.base == pytest.approx(0.5, abs=0.05) and r.exponent.head == pytest.approx(0.5, abs=0.05)
    assert r.exponent.p_value > 0.05


def test_the_junit_cases_read_back_name_each_fix_its_reason_and_both_exponents(tmp_path: Path):
    """A fix with nothing to measure is skipped with its reason and the fixes after it still get their cases."""
    unmeasured = ThroughputResult(
        fix="36988", label="#36988", status="unavailable", reason="the matrix declares no throughput probe for this fix"
    )
    grows = judged(rounds(25, 20e-6), rounds(26, 20e-6, exponent=0.5))
    path = tmp_path / "junit.xml"
    write_cases(path, "throughput", junit_cases([unmeasured, grows], None))
    (suite,) = JUnitXml.fromfile(str(path))
    cases = {c.classname: c for c in suite}
    assert list(cases) == ["throughput.36988", "throughput.38935"]
    skipped = cases["throughput.36988"]
    assert skipped.name == "throughput:(none)" and isinstance(skipped.result[0], Skipped)
    assert skipped.result[0].message == "the matrix declares no throughput probe for this fix"
    passed = cases["throughput.38935"]
    assert passed.name == "throughput:pr38935_doors" and passed.is_passed
    exponents = f"exponent {grows.exponent.base:+.2f} -> {grows.exponent.head:+.2f}"
    assert exponents in passed.system_out.splitlines()[0]
    for w, line in zip(grows.workloads, passed.system_out.splitlines()[1:], strict=True):
        assert line.startswith(f"{w.name}: ") and line.endswith(
            f"exponent {w.exponent.base:+.2f} -> {w.exponent.head:+.2f}"
        )
