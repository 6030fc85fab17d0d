"""``difflab gpu``: live scenarios on base and head deployments -> observations -> the usual verdicts.

One pass: pick the fixes that have a GPU plan, decide each side's target (a pinned
image on GPUs, or the CPU test server), run each distinct target's scenarios once,
benchmark base and head in interleaved rounds where the plan asks for it, then
judge with :func:`difflab.diff.judge_fix` and write the run folder like ``difflab run``.
"""

from __future__ import annotations

import sys
import time
import traceback
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from difflab.diff.verdict import FixVerdict, judge_fix
from difflab.engine.facts import read_engine
from difflab.engine.metrics import PURPOSE as METRICS_PURPOSE
from difflab.errors import ConfigError
from difflab.extras import require
from difflab.gpu.bench import BenchSpec
from difflab.gpu.deployment import DEFAULT_MODEL, DeploymentConfig, place
from difflab.gpu.host import SKIP_EXIT_CODE, HostCheck, check_host
from difflab.gpu.images import ImageMap
from difflab.gpu.report import preflight_section, throughput_section
from difflab.gpu.scenarios import FUNCTIONAL, Limits, Outcome, ScenarioUnavailable
from difflab.gpu.scenarios.throughput import THROUGHPUT, ABResult, run_ab
from difflab.gpu.targets import DockerTarget, Target, TestServerTarget
from difflab.gpu.verdicts import judge_throughput
from difflab.matrix import Fix, Matrix
from difflab.matrix.gpu import GpuPlan, load_gpu_plans
from difflab.observation import SIDES, Observation
from difflab.paths import default_matrix
from difflab.preflight.gates import PreflightReport, evaluate
from difflab.progress import Reporter
from difflab.report.gpu import write_ab, write_deployment, write_preflight, write_tier
from difflab.stats.compare import DEFAULT_SEED
from difflab.testing.testserver import base_config, head_config
from difflab.workflows.session import ProbeOptions, Session

SCENARIO_ORDER = ("gpu_oversized_prompt", "gpu_canary_leak", "gpu_abort_storm")  # the storm may leak: last
TESTSERVER_LIMITS = Limits(
    request_timeout_s=10.0,
    at_once_s=1.0,
    settle_s=0.6,
    poll_s=0.02,
    abort_stagger_s=0.02,
    abort_delays_s=(0.0, 0.02, 0.04, 0.06, 0.08, 0.1, 0.12, 0.14),  # inside the 0.15 s transfers
    canary_fractions=(0.9, 1.1),  # one length under the pool, one over it
)
TESTSERVER_BENCH = BenchSpec(num_prompts=8, input_len=48, output_len=12, max_concurrency=4)


@dataclass
class TierRequest:
    fixes: list[str] | None = None
    out: Path | None = None
    force: bool = False
    testserver: bool = False
    images: ImageMap = field(default_factory=lambda: ImageMap({}))
    model: str = DEFAULT_MODEL
    rounds: int = 6  # per side; with fewer than 4 no difference can reach p < 0.05
    seed: int = DEFAULT_SEED
    matrix: Path = field(default_factory=default_matrix)
    hf_cache: Path | None = None
    limits: Limits | None = None
    bench: BenchSpec | None = None
    argv: list[str] = field(default_factory=lambda: list(sys.argv))


@dataclass
class TierOutcome:
    status: str  # passed | failed | skipped
    exit_code: int
    out_dir: Path | None = None
    verdicts: list[FixVerdict] = field(default_factory=list)
    reason: str = ""
    host: HostCheck | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "exit_code": self.exit_code,
            "reason": self.reason,
            "out_dir": str(self.out_dir) if self.out_dir else None,
            "verdicts": [{"id": v.id, "verdict": v.verdict, "passed": v.passed} for v in self.verdicts],
            "host": self.host.to_dict() if self.host else None,
        }


@dataclass
class ScenarioRun:
    outcome: Outcome | None
    error: str | None
    duration_s: float
    version: str | None


# -- targets ------------------------------------------------------------------------------------------
def testserver_targets(fixes: list[Fix], seed: int, bench: BenchSpec) -> dict[str, dict[str, Target]]:
    """Every fix is judged on the same pair: the pre-fix switches on (base) and off (head)."""
    pair: dict[str, Target] = {
        "base": TestServerTarget("base", base_config(), bench, seed),
        "head": TestServerTarget("head", head_config(), bench, seed),
    }
    return {f.id: pair for f in fixes}


def docker_targets(
    req: TierRequest, fixes: list[Fix], host: HostCheck, bench: BenchSpec
) -> dict[str, dict[str, Target]]:
    """One target per distinct image; all stay up at once only when each gets its own GPU pair."""
    single = len(fixes) == 1
    images = {fix.id: {s: req.images.resolve(fix, s, single) for s in SIDES} for fix in fixes}
    digests = list(dict.fromkeys(i.digest for sides in images.values() for i in sides.values() if i))
    persistent = len(host.gpus) >= 2 * len(digests) and len(digests) > 1
    needs_content = any(FUNCTIONAL[p.name].needs_content for f in fixes for p in f.probes)
    by_digest: dict[str, Target] = {}
    out: dict[str, dict[str, Target]] = {}
    for fix in fixes:
        out[fix.id] = {}
        for side, image in images[fix.id].items():
            if image is None:
                continue
            if image.digest not in by_digest:
                cfg = DeploymentConfig(
                    side=side,
                    image=image,
                    model=req.model,
                    rdma=host.rdma,
                    hf_cache=req.hf_cache,
                    load_format="auto" if needs_content else "dummy",
                )
                cfg = place(cfg, host.gpus, digests.index(image.digest) if persistent else None)
                by_digest[image.digest] = DockerTarget(cfg, bench, req.seed, persistent)
            out[fix.id][side] = by_digest[image.digest]
    return out


# -- running -------------------------------------------------------------------------------------------
def _run_target(
    target: Target, names: list[str], limits: Limits, say: Any
) -> tuple[dict[str, ScenarioRun], PreflightReport | None]:
    runs: dict[str, ScenarioRun] = {}
    report = None
    try:
        with target.session() as ep:
            version = read_engine("decode", ep.decode).version
            for name in sorted(names, key=SCENARIO_ORDER.index):
                say(f"{target.label()['label']}: {name}")
                start = time.monotonic()
                try:
                    outcome, error = FUNCTIONAL[name].run(ep, limits), None
                except ScenarioUnavailable as exc:
                    outcome, error = None, f"scenario not possible on this deployment: {exc}"
                except Exception as exc:  # a scenario bug must become an error observation, not a crash
                    outcome, error = None, f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=4)}"
                runs[name] = ScenarioRun(outcome, error, time.monotonic() - start, version)
            envs = target.engine_env()
            facts = {
                role: read_engine(role, getattr(ep, role), envs.get(role), "deployment spec")
                for role in ("prefill", "decode")
            }
            report = evaluate(facts)
    except Exception as exc:  # the deployment itself failed: every scenario on it is an error
        message = f"deployment failed: {type(exc).__name__}: {exc}"
        for name in names:
            runs.setdefault(name, ScenarioRun(None, message, 0.0, None))
    return runs, report


def _observation(fix: Fix, side: str, probe: str, target: Target, run: ScenarioRun | None) -> Observation:
    source = target.label()
    if run is None:
        return Observation(
            fix=fix.id,
            probe=probe,
            side=side,
            source=source,
            status="error",
            error="scenario did not run",
            runner=target.runner,
        )
    out = run.outcome
    return Observation(
        fix=fix.id,
        probe=probe,
        side=side,
        source=source,
        status="ok" if out else "error",
        fields=dict(out.fields) if out else {},
        events=list(out.events) if out else [],
        problems=list(out.problems) if out else [],
        error=run.error,
        sglang_version=run.version,
        duration_s=round(run.duration_s, 3),
        runner=target.runner,
    )


def gpu_fixes(matrix: Matrix, wanted: list[str] | None, plans: dict[str, GpuPlan] | None = None) -> list[Fix]:
    """The selected matrix fixes that have a GPU plan, with the plan's scenarios in place of the CPU probes."""
    plans = load_gpu_plans(matrix) if plans is None else plans
    for fix_id, plan in plans.items():
        unknown = [p.name for p in plan.probes if p.name not in FUNCTIONAL]
        if unknown:
            raise ConfigError(
                f"{matrix.path}: gpu.{fix_id!r}: no scenario {unknown} (known: {', '.join(sorted(FUNCTIONAL))})"
            )
    chosen = [f for f in matrix.fixes if f.id in plans]
    if wanted:
        tokens = {t.lstrip("#") for t in wanted}
        chosen = [f for f in chosen if f.id in tokens or str(f.pr) in tokens]
        if not chosen:
            raise ConfigError(
                f"no GPU scenario for fix(es) {', '.join(sorted(tokens))}; the GPU tier covers "
                f"{', '.join(sorted(plans))}"
            )
    return [replace(f, probes=plans[f.id].probes) for f in chosen]


def _check_extras(req: TierRequest, fixes: list[Fix], plans: dict[str, GpuPlan]) -> None:
    """The optional libraries this run will need, checked before anything starts (exit 2 naming the extra)."""
    require("prometheus_client.parser", METRICS_PURPOSE)
    if req.rounds > 0 and any(plans[f.id].throughput for f in fixes):
        require("numpy", "the throughput A/B statistics")
        require("scipy.stats", "the throughput A/B statistics")


def _targets(
    req: TierRequest, fixes: list[Fix], bench: BenchSpec
) -> tuple[dict[str, dict[str, Target]] | None, HostCheck | None]:
    """Each fix's base and head target; None when this host cannot run the Docker tier (``host`` says why)."""
    if req.testserver:
        return testserver_targets(fixes, req.seed, bench), None
    for fix in fixes:  # bad or missing images are the user's to fix first, GPU or not
        for side in SIDES:
            req.images.resolve(fix, side, len(fixes) == 1)
    host = check_host()
    if not host.ok:
        return None, host
    return docker_targets(req, fixes, host, bench), host


def _distinct(fixes: list[Fix], targets: dict[str, dict[str, Target]]) -> dict[str, tuple[Target, list[str]]]:
    """Each distinct target once, with every scenario any fix needs on it."""
    distinct: dict[str, Target] = {}
    needed: dict[str, set[str]] = {}
    for fix in fixes:
        for target in targets[fix.id].values():
            distinct[target.key] = target
            needed.setdefault(target.key, set()).update(p.name for p in fix.probes)
    return {key: (target, sorted(needed[key])) for key, target in distinct.items()}


@dataclass
class _Tier:
    """One tier run in progress: its request, fixes, targets and what the scenarios produced."""

    req: TierRequest
    fixes: list[Fix]
    plans: dict[str, GpuPlan]
    targets: dict[str, dict[str, Target]]
    work: Path
    runs: dict[str, dict[str, ScenarioRun]] = field(default_factory=dict)
    reports: dict[str, PreflightReport] = field(default_factory=dict)
    abs_: dict[str, ABResult] = field(default_factory=dict)
    verdicts: list[FixVerdict] = field(default_factory=list)


def _deploy_and_run(tier: _Tier, distinct: dict[str, tuple[Target, list[str]]], limits: Limits, say: Any) -> None:
    """Every distinct target's scenarios, its deployment and preflight kept beside the results."""
    for key, (target, names) in distinct.items():
        tier.runs[key], report = _run_target(target, names, limits, say)
        if report is not None:
            tier.reports[target.label()["label"]] = report
            write_preflight(tier.work, key, report.to_dict())
        write_deployment(tier.work, key, target.describe())


def _judge(tier: _Tier, say: Any) -> None:
    """Each fix's scenarios judged like probes; with both sides and rounds, its throughput A/B too."""
    rounds = tier.req.rounds
    for fix in tier.fixes:
        sides = tier.targets[fix.id]
        tier.verdicts.append(judge_scenarios(fix, sides, tier.runs, tier.work))
        if tier.plans[fix.id].throughput and all(s in sides for s in SIDES) and rounds > 0:
            say(f"{fix.label}: throughput A/B, {rounds} interleaved round(s) per side")
            tier.abs_[fix.id], verdict = throughput_ab(fix, sides, rounds, tier.req.seed, tier.work)
            tier.verdicts.append(verdict)


def _session(req: TierRequest, reporter: Reporter | None) -> Session:
    """The tier's session: its fixes are those with a GPU plan (scenarios, not probe files); never sealed."""
    options = ProbeOptions(
        matrix=req.matrix, fixes=req.fixes, out=req.out, force=req.force, bundle=False, argv=req.argv
    )
    return Session.open(
        "gpu",
        options,
        reporter,
        folder_prefix="gpu-",
        select=lambda m: gpu_fixes(m, req.fixes),
        probe_files=False,
    )


def run_tier(req: TierRequest, reporter: Reporter | None = None) -> TierOutcome:
    """Run the tier. Raises :class:`ConfigError` on bad input; ``skipped`` without GPU prerequisites."""
    session = _session(req, reporter)
    plans = load_gpu_plans(session.matrix)
    fixes = session.fixes
    _check_extras(req, fixes, plans)
    limits = req.limits or (TESTSERVER_LIMITS if req.testserver else Limits())
    bench = req.bench or (TESTSERVER_BENCH if req.testserver else BenchSpec())
    targets, host = _targets(req, fixes, bench)
    if targets is None:
        assert host is not None
        return TierOutcome("skipped", SKIP_EXIT_CODE, reason=host.reason, host=host)
    distinct = _distinct(fixes, targets)
    try:
        with session.folder() as work:
            tier = _Tier(req, fixes, plans, targets, work)
            _deploy_and_run(tier, distinct, limits, session.say)
            _judge(tier, session.say)
            passed = all(v.passed for v in tier.verdicts)
            _write(session, tier, host)
            session.finish(work, 0 if passed else 1)
    finally:
        for target, _names in distinct.values():
            target.close()
    reason = "every verdict as expected" if passed else "some verdicts failed"
    return TierOutcome("passed" if passed else "failed", 0 if passed else 1, session.out, tier.verdicts, reason, host)


def _labels(fix: Fix, sides: dict[str, Target]) -> dict[str, dict[str, Any]]:
    return {
        s: sides[s].label() if s in sides else {"label": "unavailable", "reason": getattr(fix, s).unavailable}
        for s in SIDES
    }


def judge_scenarios(
    fix: Fix, sides: dict[str, Target], runs: dict[str, dict[str, ScenarioRun]], work: Path
) -> FixVerdict:
    """The fix's scenarios on both sides as observations (written under observations/), judged like probes."""
    labels = _labels(fix, sides)
    obs: dict[str, dict[str, Observation]] = {s: {} for s in SIDES}
    for side in SIDES:
        for spec in fix.probes:
            if side not in sides:
                o = Observation.unavailable(fix.id, spec.name, side, labels[side].get("reason") or "no source")
            else:
                o = _observation(fix, side, spec.name, sides[side], runs[sides[side].key].get(spec.name))
            o.write(work / "observations" / fix.id / side / f"{spec.name}.json")
            obs[side][spec.name] = o
    return judge_fix(fix, obs["base"], obs["head"], labels["base"], labels["head"])


def throughput_ab(
    fix: Fix, sides: dict[str, Target], rounds: int, seed: int, work: Path
) -> tuple[ABResult, FixVerdict]:
    """Benchmark base and head in interleaved rounds; the result as observations and a verdict of its own."""
    labels = _labels(fix, sides)
    ab = run_ab(dict(sides), rounds, work / "throughput" / fix.id, seed)
    write_ab(work, fix.id, ab.to_dict())
    obs = {}
    for side in SIDES:
        obs[side] = Observation(
            fix=fix.id,
            probe=THROUGHPUT,
            side=side,
            source=labels[side],
            status="ok" if not ab.error else "error",
            fields=ab.side_fields(side),
            error=ab.error,
            runner=sides[side].runner,
        )
        obs[side].write(work / "observations" / fix.id / side / f"{THROUGHPUT}.json")
    return ab, judge_throughput(fix, ab, obs["base"], obs["head"], labels["base"], labels["head"])


def _write(session: Session, tier: _Tier, host: HostCheck | None) -> None:
    """run.json's tier details, then the verdict files with the throughput and preflight sections."""
    req = tier.req
    session.record.details = {
        "mode": "testserver" if req.testserver else "docker",
        "model": None if req.testserver else req.model,
        "rounds": req.rounds,
        "seed": req.seed,
        "images": {k: str(v) for k, v in req.images.by_key.items()},
        "host": host.to_dict() if host else None,
        "limits": asdict(req.limits or (TESTSERVER_LIMITS if req.testserver else Limits())),
    }
    by_id = {f.id: f for f in tier.fixes}
    sections = [line for fix_id, ab in tier.abs_.items() for line in throughput_section(by_id[fix_id].label, ab)]
    sections += preflight_section(tier.reports)
    write_tier(tier.work, tier.verdicts, testserver=req.testserver, sections=sections)
