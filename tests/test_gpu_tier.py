"""``difflab gpu`` end to end on the test servers, and its refusals and skip."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from junitparser import JUnitXml

from difflab import cli
from difflab.gpu.bench import BenchSpec
from difflab.gpu.host import HostCheck
from difflab.gpu.images import ImageMap
from difflab.observation import Observation
from difflab.testing.testserver import head_config
from difflab.workflows import gpu as tier

pytestmark = pytest.mark.xdist_group("gpu-testserver")
D = {v: f"lmsysorg/sglang:v{v}@sha256:{c * 64}" for v, c in (("0.5.19", "1"), ("0.5.20", "2"), ("0.5.21", "3"))}


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory) -> tuple[int, dict, Path]:
    out = tmp_path_factory.mktemp("gpu") / "run"
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = cli.main(["gpu", "--testserver", "--out", str(out), "--rounds", "2"])
    return code, json.loads(buf.getvalue()), out


def test_testserver_run_confirms_every_fix(run_folder):
    code, status, out = run_folder
    assert code == 0 and status["status"] == "passed" and status["out_dir"] == str(out)
    diff = json.loads((out / "diff.json").read_text())
    assert diff["tier"] == "gpu" and diff["mode"] == "testserver" and diff["passed"] is True
    assert {f["id"]: f["verdict"] for f in diff["fixes"]} == {
        "36988": "confirmed",
        "38935": "confirmed",
        "41404": "confirmed",
        "41404-throughput": "confirmed",
    }


def test_run_folder_layout_and_observations(run_folder):
    _, _, out = run_folder
    run = json.loads((out / "run.json").read_text())
    assert run["command"] == "gpu" and run["mode"] == "testserver" and run["rounds"] == 2
    expected = {
        "36988": ["gpu_abort_storm"],
        "38935": ["gpu_canary_leak", "gpu_oversized_prompt"],
        "41404": ["gpu_abort_storm", "gpu_throughput_ab"],
    }
    for fix, probes in expected.items():
        for side in ("base", "head"):
            found = sorted(p.stem for p in (out / "observations" / fix / side).glob("*.json"))
            assert found == probes
    base = Observation.read(out / "observations" / "38935" / "base" / "gpu_canary_leak.json")
    assert base.ok and base.fields["canary.leak_seen"] is True and base.problems and base.runner == "gpu-testserver"
    head = Observation.read(out / "observations" / "41404" / "head" / "gpu_abort_storm.json")
    assert head.fields["abort.deferred_metric_seen"] is True and head.sglang_version == "0.5.23"
    ab = json.loads((out / "throughput" / "41404" / "ab.json").read_text())
    assert ab["order"] == "interleaved B H B H" and len(ab["rounds"]) == 4
    assert set(ab["comparisons"]) == {
        "request_throughput",
        "output_throughput",
        "median_ttft_ms",
        "median_itl_ms",
    }
    assert len(list((out / "throughput" / "41404").glob("*-round*.jsonl"))) == 4
    pre = json.loads((out / "preflight" / "testserver-base.json").read_text())
    assert pre["failing"] == ["kv-pool", "deferred-release", "kv-checksum"]
    assert json.loads((out / "deployment" / "testserver-head.json").read_text())["kind"] == "testserver"
    assert not list(out.parent.glob(".run.partial-*"))  # written atomically


def test_reports_are_the_usual_ones(run_folder):
    _, _, out = run_folder
    cases = [c for suite in JUnitXml.fromfile(str(out / "junit.xml")) for c in suite]
    assert len(cases) == 5 and all(c.is_passed for c in cases)
    summary = (out / "summary.md").read_text()
    assert summary.startswith("# SGLang GPU/RDMA tier (test server")
    assert "## Throughput A/B: #41404" in summary and "no significant difference" in summary
    assert "## Preflight gates of each deployment" in summary


def test_a_head_that_still_has_the_bug_is_not_fixed(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(tier, "head_config", lambda: head_config(admit_rejected=True))
    monkeypatch.setattr(tier, "TESTSERVER_LIMITS", replace(tier.TESTSERVER_LIMITS, canary_fractions=(1.1,)))
    outcome = tier.run_tier(tier.TierRequest(fixes=["38935"], testserver=True, out=tmp_path / "r", rounds=0))
    assert outcome.exit_code == 1 and outcome.status == "failed"
    (verdict,) = outcome.verdicts
    assert verdict.verdict == "not-fixed"
    assert "oversized.rejected_at_once=False (expected True)" in verdict.reason


def test_refusals_exit_2(capsys):
    assert cli.main(["gpu"]) == 2
    assert "no images: pass --image 0.5.20=" in capsys.readouterr().err
    assert cli.main(["gpu", "--image", "lmsysorg/sglang:v0.5.20"]) == 2
    assert "is not pinned by digest" in capsys.readouterr().err
    assert cli.main(["gpu", "--image", D["0.5.20"], "--fix", "38935"]) == 2  # head image missing
    assert "fix 38935 head needs an image: pass --image 0.5.21=" in capsys.readouterr().err
    assert cli.main(["gpu", "--testserver", "--fix", "43719a"]) == 2
    assert "no GPU scenario for fix(es) 43719a" in capsys.readouterr().err


def test_no_gpu_host_skips_with_exit_3_and_the_reason(tmp_path: Path, monkeypatch, capsys):
    missing = HostCheck(missing=["nvidia-smi not found on PATH (no NVIDIA driver on this host)"])
    monkeypatch.setattr(tier, "check_host", lambda: missing)
    code = cli.main(
        [
            "gpu",
            "--image",
            D["0.5.20"],
            "--image",
            D["0.5.21"],
            "--fix",
            "38935",
            "--out",
            str(tmp_path / "o"),
        ]
    )
    captured = capsys.readouterr()
    assert code == 3
    assert "GPU tier skipped: nvidia-smi not found on PATH" in captured.err
    status = json.loads(captured.out)
    assert status["status"] == "skipped" and status["exit_code"] == 3 and status["host"]["missing"]
    assert json.loads((tmp_path / "o" / "status.json").read_text())["status"] == "skipped"


def test_docker_targets_share_images_and_place_sides(matrix):
    fixes = tier.gpu_fixes(matrix, None)
    req = tier.TierRequest(images=ImageMap.from_args(list(D.values())))
    six = HostCheck(gpus=[str(i) for i in range(6)], rdma=True)
    targets = tier.docker_targets(req, fixes, six, BenchSpec())  # three images, three GPU pairs: all up at once
    assert targets["38935"]["base"] is targets["41404"]["base"]  # same 0.5.20 image: one deployment
    assert targets["36988"]["head"] is targets["38935"]["base"]
    distinct = {id(t): t for sides in targets.values() for t in sides.values()}.values()
    assert len(distinct) == 3 and all(t.persistent for t in distinct)
    assert len({t.cfg.gpus for t in distinct}) == 3 and len({t.cfg.ports for t in distinct}) == 3
    assert len({s.name for t in distinct for s in t.deployment.specs.values()}) == 9
    a = targets["38935"]["base"]
    assert a.cfg.load_format == "auto"  # the canary needs real weights
    assert a.key == "docker-0.5.20-222222222222"  # names the run folder's files: no ':' in it
    described = a.describe()["containers"]["prefill"]
    assert described["image"].endswith("@sha256:" + "2" * 64) and described["network_mode"] == "host"
    four = tier.docker_targets(req, fixes, HostCheck(gpus=["0", "1", "2", "3"]), BenchSpec())
    assert not four["38935"]["head"].persistent and four["38935"]["head"].cfg.gpus == ("0", "1")  # take turns
    only = tier.docker_targets(
        tier.TierRequest(images=req.images),
        tier.gpu_fixes(matrix, ["41404"]),
        HostCheck(gpus=["0", "1", "2", "3"]),
        BenchSpec(),
    )
    assert only["41404"]["base"].persistent and only["41404"]["base"].cfg.load_format == "dummy"
