"""``difflab gpu``'s own decisions (:mod:`difflab.workflows.gpu`), through its seams, with no GPU, engine or server.

The host check, the deployments and the scenarios are the tier's seams: here the host is a ready one (or
not), each deployment a recording stand-in built from the same :class:`DeploymentConfig` the Docker target
would get, and each scenario a stand-in that answers by the image's release (the fixes land in 0.5.21).
What the tier decides is then exact: which fixes and images it plans, which deployments it shares and keeps
up, the order of the scenarios, what a failed deployment or scenario becomes, when it runs the throughput
A/B, what it records and writes, how it exits, and that every deployment it made is closed. The real
test servers and Docker deployments are exercised in ``test_gpu_tier.py`` and ``test_gpu_deployment.py``.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pytest

from difflab.engine.client import EngineError
from difflab.engine.metrics import PURPOSE as METRICS_PURPOSE
from difflab.engine.names import DEFERRED_ENV
from difflab.errors import ConfigError
from difflab.gpu.bench import BenchError, BenchResult, BenchSpec
from difflab.gpu.deployment import DeploymentConfig
from difflab.gpu.host import SKIP_EXIT_CODE, HostCheck
from difflab.gpu.images import ImageMap
from difflab.gpu.scenarios import Limits, Outcome, ScenarioUnavailable
from difflab.gpu.scenarios.base import Endpoints
from difflab.matrix import load_matrix
from difflab.matrix.gpu import load_gpu_plans
from difflab.progress import Reporter
from difflab.workflows import gpu as tier
from matrix_samples import RELEASES

DIGEST = {"0.5.20": "2" * 64, "0.5.21": "3" * 64, "0.5.22": "4" * 64}
IMAGES = [f"lmsysorg/sglang:v{v}@sha256:{d}" for v, d in DIGEST.items()]
LIMITS = Limits(request_timeout_s=1.0, settle_s=0.1)
JITTER = (0.03, -0.02, 0.05, 0.0, 0.04, -0.01, 0.02, 0.06)
"""How far head's throughput is from base's, round by round: the bootstrap resamples differ, so its seed shows."""

FIXES = """
[releases."0.5.22"]
file = "sglang-0.5.22-cp311-cp311-manylinux_2_34_x86_64.whl"
sha256 = "4444444444444444444444444444444444444444444444444444444444444444"

[[fixes]]
id = "1"
pr = 101
title = "door"
base = { release = "0.5.20" }
head = { release = "0.5.21" }
[[fixes.probes]]
name = "cpu_door"
[fixes.probes.expect]
"rejected.enqueued" = [true, false]

[[fixes]]
id = "2"
pr = 102
title = "canary"
base = { release = "0.5.20" }
head = { release = "0.5.21" }
[[fixes.probes]]
name = "cpu_canary"
[fixes.probes.expect]
"canary.seen" = [true, false]

[[fixes]]
id = "3"
pr = 103
title = "storm"
base = { release = "0.5.21" }
head = { release = "0.5.22" }
[[fixes.probes]]
name = "cpu_storm"
[fixes.probes.expect]
"storm.ok" = [false, true]

[[fixes]]
id = "4"
pr = 104
title = "no gpu plan"
base = { release = "0.5.20" }
head = { release = "0.5.21" }
[[fixes.probes]]
name = "cpu_other"
[fixes.probes.expect]
"other.ok" = [false, true]

[gpu."1"]
throughput = true
[[gpu."1".probes]]
name = "gpu_oversized_prompt"
expect = { "oversized.rejected_at_once" = [false, true] }
controls = { "oversized.control_ok" = true }

[[gpu."2".probes]]
name = "gpu_canary_leak"
expect = { "canary.leak_seen" = [true, false] }
[[gpu."2".probes]]
name = "gpu_abort_storm"
expect = { "abort.decode_kv_back_to_baseline" = [false, true] }

[[gpu."3".probes]]
name = "gpu_abort_storm"
expect = { "abort.storm_ok" = [false, true] }
"""
"""Fixes 1 and 2 share the 0.5.20 and 0.5.21 deployments; fix 3's base is fix 1's head; fix 4 has no GPU plan."""


def matrix(tmp_path: Path, extra: str = "") -> Path:
    path = tmp_path / "matrix" / "upstream.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(RELEASES + FIXES + extra)
    return path


class Said(Reporter):
    """A reporter that keeps what it said."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def say(self, message: str) -> None:
        self.lines.append(message)


class Clock:
    """``time.monotonic`` that moves a seventh of a second at every reading (kept to the millisecond: 0.143)."""

    def __init__(self) -> None:
        self.now = 10.0

    def monotonic(self) -> float:
        self.now += 1 / 7
        return self.now


class FakeClient:
    """An engine that says its version and answers nothing else (the preflight's gates read it as unknown)."""

    def __init__(self, role: str, version: str) -> None:
        self.base_url, self.version = f"http://{role}.invalid", version
        self.server_info_path: str | None = None
        self.model_info_path: str | None = None

    def server_info(self) -> dict[str, Any]:
        self.server_info_path = "/server_info"
        return {"version": self.version}

    def model_info(self) -> dict[str, Any]:
        raise EngineError(f"{self.base_url}: no model info")

    def metrics(self) -> Any:
        raise EngineError(f"{self.base_url}: no metrics")


@dataclass
class Lab:
    """Every deployment the tier made and what happened to each; what the stand-ins should do."""

    made: list[FakeTarget] = field(default_factory=list)
    log: list[tuple[str, ...]] = field(default_factory=list)
    broken: dict[str, str] = field(default_factory=dict)
    """image version -> why its deployment does not come up."""
    raises: dict[tuple[str, str], Exception] = field(default_factory=dict)
    """(image version, scenario) -> what the scenario raises there."""
    unfixed: set[str] = field(default_factory=set)
    """scenarios whose fix never landed: the 0.5.21 image still shows the bug."""
    bench_fails: set[tuple[str, int]] = field(default_factory=set)
    """(side, round) whose benchmark gives no result."""
    depth: int = 1
    """How many calls down a scenario raises what ``raises`` names."""

    def target(self, cfg: DeploymentConfig, bench: BenchSpec, seed: int, persistent: bool) -> FakeTarget:
        made = FakeTarget(self, cfg, bench, seed, persistent)
        self.made.append(made)
        return made


@dataclass(eq=False)
class FakeTarget:
    """In place of ``DockerTarget``: the same key and label shape, a session that records its use."""

    lab: Lab
    cfg: DeploymentConfig
    bench_spec: BenchSpec
    seed: int
    persistent: bool
    runner: str = "gpu-fake"
    closed: int = 0

    @property
    def version(self) -> str:
        return self.cfg.image.version or "?"

    @property
    def key(self) -> str:
        return f"fake-{self.version}"

    def label(self) -> dict[str, Any]:
        return {"label": f"{self.version} (fake)", "kind": "fake", "image": str(self.cfg.image)}

    @contextlib.contextmanager
    def session(self) -> Iterator[Endpoints]:
        self.lab.log.append(("up", self.version))
        if self.version in self.lab.broken:
            raise RuntimeError(self.lab.broken[self.version])
        clients = {role: FakeClient(f"{role}-{self.version}", self.version) for role in ("router", "prefill", "decode")}
        yield Endpoints(**clients)
        self.lab.log.append(("down", self.version))

    def engine_env(self) -> dict[str, dict[str, str]]:
        """The deployment spec's variables: deferred release on for prefill, off for decode."""
        return {"prefill": {DEFERRED_ENV: "1"}, "decode": {DEFERRED_ENV: "0"}}

    def bench(self, round_index: int, output_file: Path) -> BenchResult:
        side = self.cfg.side
        self.lab.log.append(("bench", side, str(round_index)))
        if (side, round_index) in self.lab.bench_fails:
            raise BenchError(f"{output_file}: benchmark output is empty")
        rate = 10.0 + round_index / 10 + (JITTER[round_index % len(JITTER)] if side == "head" else 0.0)
        values = {"request_throughput": rate, "output_throughput": 12 * rate, "median_ttft_ms": 50.0 - round_index}
        return BenchResult(values={**values, "median_itl_ms": 5.0 + round_index}, completed=8, raw={})

    def describe(self) -> dict[str, Any]:
        return {"kind": "fake", "side": self.cfg.side, "gpus": list(self.cfg.gpus), "load_format": self.cfg.load_format}

    def close(self) -> None:
        self.closed += 1


@dataclass
class FakeScenario:
    """A scenario answering by release: the fixes land in 0.5.21 (fix 3's storm in 0.5.22)."""

    name: str
    needs_content: bool
    lab: Lab

    def run(self, ep: Endpoints, limits: Limits) -> Outcome:
        version = ep.decode.version
        self.lab.log.append(("run", version, self.name, str(limits.request_timeout_s)))
        if (version, self.name) in self.lab.raises:
            self.fail(self.lab.raises[(version, self.name)], self.lab.depth)
        fixed = version >= "0.5.21" and self.name not in self.lab.unfixed
        fields = {
            "gpu_oversized_prompt": {"oversized.rejected_at_once": fixed, "oversized.control_ok": True},
            "gpu_canary_leak": {"canary.leak_seen": not fixed},
            "gpu_abort_storm": {"abort.decode_kv_back_to_baseline": fixed, "abort.storm_ok": version >= "0.5.22"},
        }[self.name]
        return Outcome(fields=fields, events=[{"event": "ran", "on": version}], problems=[] if fixed else ["the bug"])

    def fail(self, exc: Exception, depth: int) -> None:
        if depth <= 1:
            raise exc
        self.fail(exc, depth - 1)


@pytest.fixture
def lab(monkeypatch: pytest.MonkeyPatch) -> Lab:
    made = Lab()
    scenarios = {
        name: FakeScenario(name, content, made)
        for name, content in (("gpu_oversized_prompt", False), ("gpu_canary_leak", True), ("gpu_abort_storm", False))
    }
    monkeypatch.setattr(tier, "FUNCTIONAL", scenarios)
    monkeypatch.setattr(tier, "DockerTarget", made.target)
    monkeypatch.setattr(tier, "check_host", lambda: HostCheck(gpus=["0", "1", "2", "3"], rdma=True))
    monkeypatch.setattr(tier, "time", Clock())
    return made


def request(tmp_path: Path, *fixes: str, **changes: Any) -> tier.TierRequest:
    settings: dict[str, Any] = {
        "fixes": list(fixes) or None,
        "out": tmp_path / "out",
        "images": ImageMap.from_args(IMAGES),
        "matrix": matrix(tmp_path),
        "rounds": 0,
        "limits": LIMITS,
        "argv": ["difflab", "gpu"],
    }
    return tier.TierRequest(**(settings | changes))


def read(out: Path, name: str) -> Any:
    return json.loads((out / name).read_text())


def observation(out: Path, fix: str, side: str, probe: str) -> dict[str, Any]:
    return read(out, f"observations/{fix}/{side}/{probe}.json")


# -- a whole tier: plan, deployments, scenarios, verdicts, files, exit ----------------------------------------------
def test_every_fix_confirmed_passes_and_each_deployment_runs_its_scenarios_once_in_order(
    tmp_path: Path, lab: Lab
) -> None:
    said = Said()
    outcome = tier.run_tier(request(tmp_path), said)
    assert (outcome.status, outcome.exit_code, outcome.reason) == ("passed", 0, "every verdict as expected")
    assert [(v.id, v.verdict, v.passed) for v in outcome.verdicts] == [
        ("1", "confirmed", True),
        ("2", "confirmed", True),
        ("3", "confirmed", True),
    ]
    assert outcome.out_dir == (tmp_path / "out").resolve() and outcome.host is not None and outcome.host.rdma
    # one deployment per image, each up once with every scenario any fix needs there, the storm last
    assert [t.version for t in lab.made] == ["0.5.20", "0.5.21", "0.5.22"]
    runs = [entry[1:3] for entry in lab.log if entry[0] == "run"]
    assert runs == [
        ("0.5.20", "gpu_oversized_prompt"),
        ("0.5.20", "gpu_canary_leak"),
        ("0.5.20", "gpu_abort_storm"),
        ("0.5.21", "gpu_oversized_prompt"),
        ("0.5.21", "gpu_canary_leak"),
        ("0.5.21", "gpu_abort_storm"),
        ("0.5.22", "gpu_abort_storm"),
    ]
    assert {entry[3] for entry in lab.log if entry[0] == "run"} == {"1.0"}  # the request's limits
    ups = [entry for entry in lab.log if entry[0] in ("up", "down")]
    assert ups == [(way, v) for v in ("0.5.20", "0.5.21", "0.5.22") for way in ("up", "down")]
    assert [t.closed for t in lab.made] == [1, 1, 1]
    assert said.lines[:2] == ["0.5.20 (fake): gpu_oversized_prompt", "0.5.20 (fake): gpu_canary_leak"]
    # three images on four GPUs: they take turns on the first pair; the canary needs real weights
    assert all(not t.persistent and t.cfg.gpus == ("0", "1") for t in lab.made)
    assert {t.cfg.load_format for t in lab.made} == {"auto"} and all(t.cfg.rdma for t in lab.made)
    assert [t.cfg.side for t in lab.made] == ["base", "head", "head"]  # the side that first needed it
    assert all(t.seed == tier.TierRequest().seed and t.bench_spec == BenchSpec() for t in lab.made)
    out = outcome.out_dir
    diff = read(out, "diff.json")
    assert diff["passed"] is True and diff["mode"] == "docker" and [f["id"] for f in diff["fixes"]] == ["1", "2", "3"]
    seen = observation(out, "2", "base", "gpu_canary_leak")
    assert (seen["status"], seen["fields"], seen["runner"], seen["sglang_version"]) == (
        "ok",
        {"canary.leak_seen": True},
        "gpu-fake",
        "0.5.20",
    )
    assert seen["events"] == [{"event": "ran", "on": "0.5.20"}] and seen["problems"] == ["the bug"]
    assert seen["source"] == lab.made[0].label() and seen["error"] is None
    assert (seen["fix"], seen["probe"], seen["side"]) == ("2", "gpu_canary_leak", "base")
    judged = {f["id"]: f for f in diff["fixes"]}["2"]
    assert (judged["base"], judged["head"]) == (lab.made[0].label(), lab.made[1].label())
    assert [(p["base"], p["head"]) for p in judged["probes"]] == [
        (observation(out, "2", "base", name), observation(out, "2", "head", name))
        for name in ("gpu_canary_leak", "gpu_abort_storm")
    ]
    assert sorted(p.name for p in (out / "observations" / "2" / "head").iterdir()) == [
        "gpu_abort_storm.json",
        "gpu_canary_leak.json",
    ]
    assert not (out / "observations" / "4").exists()  # no GPU plan: not part of the tier
    for version in ("0.5.20", "0.5.21", "0.5.22"):
        assert read(out, f"deployment/fake-{version}.json")["kind"] == "fake"
        assert read(out, f"preflight/fake-{version}.json")["gates"]
    assert not (out / "throughput").exists()  # no rounds asked
    preflight = read(out, "preflight/fake-0.5.21.json")["engines"]
    assert {role: (e["role"], e["version"], e["env_source"]) for role, e in preflight.items()} == {
        "prefill": ("prefill", "0.5.21", "deployment spec"),
        "decode": ("decode", "0.5.21", "deployment spec"),
    }
    assert preflight["decode"]["url"] == "http://decode-0.5.21.invalid"
    (deferred,) = [g for g in read(out, "preflight/fake-0.5.21.json")["gates"] if g["gate"] == "deferred-release"]
    assert deferred["status"] == "fail" and deferred["reason"].startswith("off on decode:")
    assert [(e["role"], e["value"], e["source"]) for e in deferred["evidence"]] == [
        ("prefill", True, f"env {DEFERRED_ENV} (deployment spec)"),
        ("decode", False, f"env {DEFERRED_ENV} (deployment spec)"),
    ]
    summary = (out / "summary.md").read_text()
    assert "## Preflight gates of each deployment" in summary and "0.5.22 (fake)" in summary
    # a tier is never sealed: its verdicts, observations, deployments and preflight, and the run's record
    assert sorted(p.name for p in out.iterdir()) == [
        "deployment", "diff.json", "junit.xml", "matrix.toml", "observations", "preflight", "run.json", "summary.md",
    ]  # fmt: skip


def test_run_json_records_the_tiers_mode_images_host_and_limits(tmp_path: Path, lab: Lab) -> None:
    hf = tmp_path / "hf-cache"
    outcome = tier.run_tier(request(tmp_path, "1", rounds=0, seed=11, model="org/tiny-model", hf_cache=hf))
    assert [v.id for v in outcome.verdicts] == ["1"]  # its plan asks for an A/B, but no rounds: none
    record = read(outcome.out_dir, "run.json")
    assert (record["command"], record["exit_code"], record["fixes"]) == ("gpu", 0, ["1"])
    assert (record["mode"], record["model"], record["rounds"], record["seed"]) == ("docker", "org/tiny-model", 0, 11)
    assert record["images"] == {v: f"lmsysorg/sglang:v{v}@sha256:{d}" for v, d in DIGEST.items()}
    assert record["host"] == HostCheck(gpus=["0", "1", "2", "3"], rdma=True).to_dict()
    assert record["limits"] == json.loads(json.dumps(asdict(LIMITS)))
    assert all(t.cfg.model == "org/tiny-model" and t.seed == 11 and t.cfg.hf_cache == hf for t in lab.made)
    assert record["argv"] == ["difflab", "gpu"]
    # one fix, two images, two GPU pairs: both stay up, each on its own pair; no canary: dummy weights
    assert [(t.persistent, t.cfg.gpus, t.cfg.load_format) for t in lab.made] == [
        (True, ("0", "1"), "dummy"),
        (True, ("2", "3"), "dummy"),
    ]


def test_a_head_that_still_has_the_bug_fails_the_tier(tmp_path: Path, lab: Lab) -> None:
    lab.unfixed = {"gpu_canary_leak"}
    outcome = tier.run_tier(request(tmp_path))
    assert (outcome.status, outcome.exit_code, outcome.reason) == ("failed", 1, "some verdicts failed")
    verdicts = {v.id: (v.verdict, v.passed) for v in outcome.verdicts}
    assert verdicts["1"] == ("confirmed", True) and verdicts["2"][1] is False and verdicts["3"] == ("confirmed", True)
    assert read(outcome.out_dir, "diff.json")["passed"] is False and read(outcome.out_dir, "run.json")["exit_code"] == 1


def test_a_deployment_that_fails_is_every_scenario_on_it_an_error_and_the_others_still_run(
    tmp_path: Path, lab: Lab
) -> None:
    lab.broken = {"0.5.21": "no GPU memory left"}
    outcome = tier.run_tier(request(tmp_path))
    assert outcome.exit_code == 1 and outcome.status == "failed"
    out = outcome.out_dir
    for fix, probe in (("1", "gpu_oversized_prompt"), ("2", "gpu_canary_leak"), ("2", "gpu_abort_storm")):
        seen = observation(out, fix, "head", probe)
        assert seen["status"] == "error" and seen["error"] == "deployment failed: RuntimeError: no GPU memory left"
        assert seen["duration_s"] == 0.0 and seen["sglang_version"] is None
    assert observation(out, "3", "base", "gpu_abort_storm")["status"] == "error"  # fix 3's base is that image
    assert ("run", "0.5.22", "gpu_abort_storm", "1.0") in lab.log  # the next deployment still ran
    assert (out / "deployment" / "fake-0.5.21.json").is_file() and not (out / "preflight" / "fake-0.5.21.json").exists()
    assert (out / "preflight" / "fake-0.5.22.json").is_file()
    assert [t.closed for t in lab.made] == [1, 1, 1]


def test_a_scenario_that_cannot_run_or_breaks_is_its_error_and_the_next_scenario_runs(tmp_path: Path, lab: Lab) -> None:
    lab.raises = {
        ("0.5.20", "gpu_oversized_prompt"): ScenarioUnavailable("the pool is larger than the context"),
        ("0.5.20", "gpu_canary_leak"): KeyError("usage"),
    }
    lab.depth = 6  # the scenario fails six calls down
    outcome = tier.run_tier(request(tmp_path, "1", "2"))
    out = outcome.out_dir
    unavailable = observation(out, "1", "base", "gpu_oversized_prompt")
    assert unavailable["status"] == "error" and unavailable["fields"] == {}
    assert unavailable["error"] == "scenario not possible on this deployment: the pool is larger than the context"
    assert unavailable["sglang_version"] == "0.5.20"  # the deployment came up: its version is known
    broken = observation(out, "2", "base", "gpu_canary_leak")
    assert broken["error"].startswith("KeyError: 'usage'\nTraceback (most recent call last):")
    assert broken["error"].count('\n  File "') == 4  # the traceback's first four frames, not all of them
    assert observation(out, "2", "base", "gpu_abort_storm")["status"] == "ok"
    assert {observation(out, "2", "base", p)["duration_s"] for p in ("gpu_canary_leak", "gpu_abort_storm")} == {0.143}
    assert outcome.exit_code == 1 and [v.passed for v in outcome.verdicts] == [False, False]


def test_a_scenario_that_did_not_run_on_a_side_is_an_error_there(tmp_path: Path, lab: Lab) -> None:
    fix = tier.gpu_fixes(load_matrix(matrix(tmp_path)), ["1"])[0]
    target = lab.target(
        DeploymentConfig(side="base", image=ImageMap.from_args(IMAGES).by_key["0.5.20"]), BenchSpec(), 0, False
    )
    seen = tier._observation(fix, "base", "gpu_oversized_prompt", target, None)
    assert (seen.status, seen.error, seen.runner, seen.source) == (
        "error",
        "scenario did not run",
        "gpu-fake",
        target.label(),
    )
    assert (seen.fix, seen.probe, seen.side, seen.fields) == ("1", "gpu_oversized_prompt", "base", {})


# -- the throughput A/B -------------------------------------------------------------------------------------------
def test_a_fix_whose_plan_asks_for_it_gets_an_interleaved_a_b_and_a_verdict_of_its_own(
    tmp_path: Path, lab: Lab
) -> None:
    said = Said()
    outcome = tier.run_tier(request(tmp_path, "1", "2", rounds=3), said)
    assert [v.id for v in outcome.verdicts] == ["1", "1-throughput", "2"]
    assert "#101: throughput A/B, 3 interleaved round(s) per side" in said.lines
    assert not any("#102: throughput" in line for line in said.lines)
    benches = [entry[1:] for entry in lab.log if entry[0] == "bench"]
    assert benches == [("base", "0"), ("head", "0"), ("base", "1"), ("head", "1"), ("base", "2"), ("head", "2")]
    out = outcome.out_dir
    ab = read(out, "throughput/1/ab.json")
    assert len(ab["rounds"]) == 6 and set(ab["comparisons"]) == {
        "request_throughput", "output_throughput", "median_ttft_ms", "median_itl_ms",
    }  # fmt: skip
    for side in ("base", "head"):
        seen = observation(out, "1", side, "gpu_throughput_ab")
        assert seen["status"] == "ok" and seen["runner"] == "gpu-fake" and seen["error"] is None
        assert seen["fields"]["throughput.rounds_ok"] == 3 and len(seen["fields"]["throughput.request_throughput"]) == 3
        assert seen["source"]["label"] == f"{'0.5.20' if side == 'base' else '0.5.21'} (fake)"
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == [
        "deployment",
        "observations",
        "preflight",
        "throughput",
    ]
    entry = {f["id"]: f for f in read(out, "diff.json")["fixes"]}["1-throughput"]
    (probe,) = entry["probes"]
    for side in ("base", "head"):
        assert probe[side] == observation(out, "1", side, "gpu_throughput_ab")
        assert (probe[side]["fix"], probe[side]["probe"], probe[side]["side"]) == ("1", "gpu_throughput_ab", side)
    assert (entry["base"]["label"], entry["head"]["label"]) == ("0.5.20 (fake)", "0.5.21 (fake)")
    assert not (out / "throughput" / "2").exists() and "## Throughput A/B: #101\n" in (out / "summary.md").read_text()


def test_an_a_b_without_results_is_an_error_observation_on_both_sides(tmp_path: Path, lab: Lab) -> None:
    lab.bench_fails = {("head", 0), ("head", 1)}
    outcome = tier.run_tier(request(tmp_path, "1", rounds=2))
    out = outcome.out_dir
    for side in ("base", "head"):
        seen = observation(out, "1", side, "gpu_throughput_ab")
        assert seen["status"] == "error" and seen["error"].startswith("not enough successful rounds to compare")
    assert "head round 0:" in observation(out, "1", "head", "gpu_throughput_ab")["error"]
    throughput = {v.id: v for v in outcome.verdicts}["1-throughput"]
    assert throughput.passed is False and outcome.exit_code == 1


def test_no_a_b_for_a_fix_with_a_side_unavailable_and_its_scenarios_are_unavailable_there(
    tmp_path: Path, lab: Lab
) -> None:
    """Fix 1's base is older than every pinned image: its head is still deployed and judged, with no A/B."""
    pins = 'base = { release = "0.5.20" }\nhead = { release = "0.5.21" }\n[[fixes.probes]]\nname = "cpu_door"'
    gone = FIXES.replace(pins, pins.replace('{ release = "0.5.20" }', '{ unavailable = "older than every image" }'))
    assert gone != FIXES
    path = tmp_path / "gone.toml"
    path.write_text(RELEASES + gone)
    outcome = tier.run_tier(request(tmp_path, "1", rounds=2, matrix=path))
    assert [entry for entry in lab.log if entry[0] == "bench"] == [] and [t.version for t in lab.made] == ["0.5.21"]
    assert [entry[1:3] for entry in lab.log if entry[0] == "run"] == [("0.5.21", "gpu_oversized_prompt")]
    seen = observation(outcome.out_dir, "1", "base", "gpu_oversized_prompt")
    assert (seen["status"], seen["fix"], seen["probe"], seen["side"]) == (
        "unavailable",
        "1",
        "gpu_oversized_prompt",
        "base",
    )
    assert "older than every image" in json.dumps(seen)
    assert [v.id for v in outcome.verdicts] == ["1"] and not (outcome.out_dir / "throughput").exists()
    (entry,) = read(outcome.out_dir, "diff.json")["fixes"]
    assert entry["base"] == {"label": "unavailable", "reason": "older than every image"}
    assert entry["head"] == lab.made[0].label() and entry["probes"][0]["base"] == seen


# -- refused or skipped before anything starts ----------------------------------------------------------------------
def test_no_gpu_host_skips_with_the_reason_and_starts_nothing(
    tmp_path: Path, lab: Lab, monkeypatch: pytest.MonkeyPatch
) -> None:
    host = HostCheck(missing=["nvidia-smi not found on PATH (no NVIDIA driver on this host)"])
    monkeypatch.setattr(tier, "check_host", lambda: host)
    outcome = tier.run_tier(request(tmp_path))
    assert (outcome.status, outcome.exit_code, outcome.host) == ("skipped", SKIP_EXIT_CODE, host)
    assert outcome.reason == "GPU tier skipped: nvidia-smi not found on PATH (no NVIDIA driver on this host)"
    assert outcome.out_dir is None and outcome.verdicts == [] and lab.made == [] and not (tmp_path / "out").exists()
    assert outcome.to_dict() == {
        "status": "skipped",
        "exit_code": SKIP_EXIT_CODE,
        "reason": outcome.reason,
        "out_dir": None,
        "verdicts": [],
        "host": host.to_dict(),
    }


def test_a_missing_image_is_refused_before_the_host_is_checked(
    tmp_path: Path, lab: Lab, monkeypatch: pytest.MonkeyPatch
) -> None:
    checked: list[bool] = []
    monkeypatch.setattr(tier, "check_host", lambda: checked.append(True) or HostCheck(gpus=["0", "1"]))
    req = request(tmp_path, "1", "3", images=ImageMap.from_args(IMAGES[:2]))  # no 0.5.22 for fix 3's head
    with pytest.raises(ConfigError, match=r"^fix 3 head needs an image: pass --image 0\.5\.22="):
        tier.run_tier(req)
    assert checked == [] and lab.made == [] and not (tmp_path / "out").exists()


def test_the_outcome_of_a_run_names_its_folder_and_verdicts(tmp_path: Path, lab: Lab) -> None:
    outcome = tier.run_tier(request(tmp_path, "#101"))
    assert outcome.to_dict() == {
        "status": "passed",
        "exit_code": 0,
        "reason": "every verdict as expected",
        "out_dir": str(outcome.out_dir),
        "verdicts": [{"id": "1", "verdict": "confirmed", "passed": True}],
        "host": outcome.host.to_dict(),
    }


def test_the_fixes_are_chosen_by_id_or_pr_and_only_those_with_a_gpu_plan(tmp_path: Path, lab: Lab) -> None:
    m = load_matrix(matrix(tmp_path))
    assert [f.id for f in tier.gpu_fixes(m, None)] == ["1", "2", "3"]
    assert [f.id for f in tier.gpu_fixes(m, ["#102", "3"])] == ["2", "3"]
    (chosen,) = tier.gpu_fixes(m, ["2"])
    assert [p.name for p in chosen.probes] == ["gpu_canary_leak", "gpu_abort_storm"]  # the plan's, not the CPU probes
    with pytest.raises(ConfigError, match=r"^no GPU scenario for fix\(es\) 4, 9; the GPU tier covers 1, 2, 3$"):
        tier.gpu_fixes(m, ["#4", "9"])


def test_the_plans_given_are_the_ones_used_and_an_id_is_matched_as_written(tmp_path: Path, lab: Lab) -> None:
    """Only a leading '#' is dropped from a choice: fix X9 is chosen as X9."""
    extra = FIXES[FIXES.index('[[fixes]]\nid = "4"') :].split("[gpu.", 1)[0].replace('id = "4"', 'id = "X9"')
    extra = extra.replace("pr = 104", "pr = 109") + '[[gpu."X9".probes]]\nname = "gpu_abort_storm"\n'
    extra += 'expect = { "abort.storm_ok" = [false, true] }\n'
    m = load_matrix(matrix(tmp_path, extra))
    assert [f.id for f in tier.gpu_fixes(m, ["X9"])] == ["X9"] and [f.id for f in tier.gpu_fixes(m, ["#X9"])] == ["X9"]
    plans = load_gpu_plans(m)
    assert [f.id for f in tier.gpu_fixes(m, None, {"2": plans["2"]})] == ["2"]


def test_a_plan_naming_an_unknown_scenario_is_refused_naming_the_matrix_and_fix(tmp_path: Path, lab: Lab) -> None:
    path = tmp_path / "teleport.toml"
    path.write_text(
        RELEASES + FIXES + '\n[[gpu."4".probes]]\nname = "gpu_teleport"\nexpect = { "x.y" = [false, true] }\n'
    )
    message = (
        f"{path}: gpu.'4': no scenario ['gpu_teleport'] (known: gpu_abort_storm, gpu_canary_leak, gpu_oversized_prompt)"
    )
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
        tier.run_tier(request(tmp_path, matrix=path))
    assert not (tmp_path / "out").exists()


STATS = ["prometheus_client.parser", "numpy", "scipy.stats"]


@pytest.mark.parametrize(
    ("fixes", "rounds", "needed"),
    [
        (["1"], 2, STATS),
        (["1"], 1, STATS),
        (["1"], 0, ["prometheus_client.parser"]),  # an A/B is planned but no rounds asked
        (["2"], 2, ["prometheus_client.parser"]),  # rounds asked but no A/B planned
    ],
)
def test_the_extras_a_run_needs_are_the_ones_it_checks(
    tmp_path: Path, lab: Lab, monkeypatch: pytest.MonkeyPatch, fixes: list[str], rounds: int, needed: list[str]
) -> None:
    asked: list[tuple[str, str]] = []
    monkeypatch.setattr(tier, "require", lambda module, purpose: asked.append((module, purpose)))
    tier.run_tier(request(tmp_path, *fixes, rounds=rounds))
    assert [m for m, _ in asked] == needed and asked[0] == ("prometheus_client.parser", METRICS_PURPOSE)
    assert all(p == "the throughput A/B statistics" for m, p in asked[1:])


@pytest.mark.parametrize("missing", STATS)
def test_a_missing_extra_is_refused_before_anything_starts(
    tmp_path: Path, lab: Lab, monkeypatch: pytest.MonkeyPatch, missing: str
) -> None:
    def require(module: str, purpose: str) -> None:
        if module == missing:
            raise ConfigError(f"{purpose} needs {module}")

    monkeypatch.setattr(tier, "require", require)
    with pytest.raises(ConfigError, match=f"needs {re.escape(missing)}$"):
        tier.run_tier(request(tmp_path, "1", rounds=2))
    assert lab.made == [] and not (tmp_path / "out").exists()


# -- the CPU test servers' mode ------------------------------------------------------------------------------------
def test_the_test_server_mode_judges_every_fix_on_one_pair_with_its_own_limits(
    tmp_path: Path, lab: Lab, monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[tuple[str, Any, BenchSpec, int]] = []

    def server(side: str, config: Any, bench: BenchSpec, seed: int) -> FakeTarget:
        made.append((side, config, bench, seed))
        image = ImageMap.from_args(IMAGES).by_key["0.5.20" if side == "base" else "0.5.21"]
        return lab.target(DeploymentConfig(side=side, image=image), bench, seed, False)

    monkeypatch.setattr(tier, "TestServerTarget", server)
    monkeypatch.setattr(tier, "check_host", lambda: pytest.fail("the test servers need no GPU host"))
    outcome = tier.run_tier(request(tmp_path, "1", "2", testserver=True, limits=None, images=ImageMap({}), seed=5))
    assert outcome.exit_code == 0 and outcome.host is None and outcome.to_dict()["host"] is None
    assert [(s, b, seed) for s, _c, b, seed in made] == [
        ("base", tier.TESTSERVER_BENCH, 5),
        ("head", tier.TESTSERVER_BENCH, 5),
    ]
    assert made[0][1] == tier.base_config() and made[1][1] == tier.head_config()
    assert {entry[3] for entry in lab.log if entry[0] == "run"} == {str(tier.TESTSERVER_LIMITS.request_timeout_s)}
    record = read(outcome.out_dir, "run.json")
    assert (record["mode"], record["model"], record["host"], record["images"]) == ("testserver", None, None, {})
    assert record["limits"] == json.loads(json.dumps(asdict(tier.TESTSERVER_LIMITS)))
    assert read(outcome.out_dir, "diff.json")["mode"] == "testserver"


def test_the_docker_mode_defaults_to_the_gpu_limits_and_bench(tmp_path: Path, lab: Lab) -> None:
    outcome = tier.run_tier(request(tmp_path, "1", limits=None))
    assert {entry[3] for entry in lab.log if entry[0] == "run"} == {str(Limits().request_timeout_s)}
    assert all(t.bench_spec == BenchSpec() for t in lab.made)
    assert read(outcome.out_dir, "run.json")["limits"] == json.loads(json.dumps(asdict(Limits())))


# -- images, folders and what is left behind ---------------------------------------------------------------------
def test_base_and_head_on_one_image_are_one_deployment_never_kept_up(tmp_path: Path, lab: Lab) -> None:
    """One fix: images keyed by side apply; the same image on both sides is one deployment, run once."""
    same = f"lmsysorg/sglang:v0.5.21@sha256:{DIGEST['0.5.21']}"
    outcome = tier.run_tier(request(tmp_path, "1", images=ImageMap.from_args([f"base={same}", f"head={same}"])))
    (made,) = lab.made
    assert not made.persistent and made.cfg.gpus == ("0", "1") and made.closed == 1
    assert [entry[1:3] for entry in lab.log if entry[0] == "run"] == [("0.5.21", "gpu_oversized_prompt")]
    assert outcome.exit_code == 1 and outcome.verdicts[0].verdict != "confirmed"  # the same behaviour on both sides


def test_images_keyed_by_side_apply_only_when_one_fix_is_chosen(
    tmp_path: Path, lab: Lab, monkeypatch: pytest.MonkeyPatch
) -> None:
    keyed = ImageMap.from_args([f"base={IMAGES[0]}", f"head={IMAGES[1]}"])
    monkeypatch.setattr(tier, "check_host", lambda: pytest.fail("images are checked before the host"))
    with pytest.raises(ConfigError, match=r"an image keyed 'base' applies only when one fix is selected\)$"):
        tier.run_tier(request(tmp_path, "1", "2", images=keyed))
    assert lab.made == []


def test_a_tier_without_out_goes_to_a_stamped_gpu_folder_and_refuses_to_overwrite_one_without_force(
    tmp_path: Path, lab: Lab, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    outcome = tier.run_tier(request(tmp_path, "1", out=None))
    (folder,) = (tmp_path / "results").iterdir()
    assert re.fullmatch(r"gpu-\d{8}T\d{6}Z", folder.name) and outcome.out_dir == folder.resolve()
    with pytest.raises(ConfigError):
        tier.run_tier(request(tmp_path, "1", out=folder))
    assert len(lab.made) == 2  # refused before any deployment
    again = tier.run_tier(request(tmp_path, "1", out=folder, force=True))
    assert again.exit_code == 0 and read(folder, "run.json")["exit_code"] == 0


def test_a_failure_while_writing_still_closes_every_deployment_and_writes_no_folder(
    tmp_path: Path, lab: Lab, monkeypatch: pytest.MonkeyPatch
) -> None:
    def cannot_describe(self: FakeTarget) -> dict[str, Any]:
        raise OSError("disk full")

    monkeypatch.setattr(FakeTarget, "describe", cannot_describe)
    with pytest.raises(OSError, match="^disk full$"):
        tier.run_tier(request(tmp_path, "1", "2"))
    assert [t.closed for t in lab.made] == [1, 1] and not (tmp_path / "out").exists()


def test_engine_facts_that_cannot_be_read_keep_the_scenarios_results(
    tmp_path: Path, lab: Lab, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The scenarios ran; only the deployment's environment failed: they keep their results, no preflight."""

    def no_env(self: FakeTarget) -> dict[str, dict[str, str]]:
        raise RuntimeError("inspect failed")

    monkeypatch.setattr(FakeTarget, "engine_env", no_env)
    outcome = tier.run_tier(request(tmp_path, "1"))
    assert outcome.exit_code == 0
    assert observation(outcome.out_dir, "1", "base", "gpu_oversized_prompt")["status"] == "ok"
    assert not (outcome.out_dir / "preflight").exists()
    assert "## Preflight gates" not in (outcome.out_dir / "summary.md").read_text()


def test_one_round_per_side_is_still_an_a_b(tmp_path: Path, lab: Lab) -> None:
    outcome = tier.run_tier(request(tmp_path, "1", rounds=1))
    assert [entry[1:] for entry in lab.log if entry[0] == "bench"] == [("base", "0"), ("head", "0")]
    assert [v.id for v in outcome.verdicts] == ["1", "1-throughput"]


def test_the_a_bs_intervals_come_from_the_requests_seed(tmp_path: Path, lab: Lab) -> None:
    """The same seed and samples give the same intervals; another seed, other resamples."""

    def intervals(folder: str, seed: int) -> dict[str, Any]:
        outcome = tier.run_tier(request(tmp_path / folder, "1", rounds=8, seed=seed))
        return read(outcome.out_dir, "throughput/1/ab.json")["comparisons"]

    first = intervals("first", 5)
    assert intervals("again", 5) == first and intervals("other", 6) != first
