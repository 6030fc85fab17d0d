"""Cloudflare's four deployment gates, each judged from what the running engines report.

1. ``kv-pool``: the KV pool holds a whole context on BOTH roles (else an over-pool
   prompt within the context exists, the #38935 door).
2. ``deferred-release``: deferred decode KV release is on for both roles (an abort
   never frees pages an RDMA write may still land in).
3. ``transfer-batch``: Mooncake's synchronous transfer batches are bounded.
4. ``kv-checksum``: the PD KV checksum is on where supported, on both roles with the
   same settings, so decode actually compares (a one-sided digest is skipped).

A gate is ``pass``, ``fail``, ``unknown`` (the engines do not say; fails closed) or
``not-applicable``. Every result lists the evidence it used and where it came from.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from difflab.engine import names
from difflab.engine.client import EngineClient
from difflab.engine.facts import EngineFacts, Fact

REPORT_SCHEMA = 1
ROLES = ("prefill", "decode")
PASSING = ("pass", "not-applicable")


@dataclass
class Evidence:
    role: str
    what: str
    value: Any
    source: str


@dataclass
class GateResult:
    gate: str
    title: str
    status: str  # pass | fail | unknown | not-applicable
    reason: str
    evidence: list[Evidence] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.status in PASSING


@dataclass
class PreflightReport:
    gates: list[GateResult]
    engines: dict[str, dict[str, Any]]

    @property
    def ok(self) -> bool:
        return all(g.ok for g in self.gates)

    @property
    def failing(self) -> list[str]:
        return [g.gate for g in self.gates if not g.ok]

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": REPORT_SCHEMA,
            "ok": self.ok,
            "failing": self.failing,
            "gates": [asdict(g) for g in self.gates],
            "engines": self.engines,
        }


def _unreachable(facts: dict[str, EngineFacts]) -> list[str]:
    return [
        f"{r} engine at {f.url} did not answer ({'; '.join(f.errors) or 'no reply'})"
        for r, f in facts.items()
        if not f.reachable
    ]


# -- gate 1 ---------------------------------------------------------------------------------------
def gate_kv_pool(facts: dict[str, EngineFacts]) -> GateResult:
    title = "KV pool >= context length on both roles"
    evidence: list[Evidence] = []
    short, missing = [], []
    for role in ROLES:
        pool, ctx = facts[role].pool_tokens(), facts[role].context_len()
        for what, fact in (("kv_pool_tokens", pool), ("context_len", ctx)):
            if fact is None:
                missing.append(f"{role} {what}")
            else:
                evidence.append(Evidence(role, what, fact.value, fact.source))
        if pool is not None and ctx is not None and pool.value < ctx.value:
            short.append(f"{role} pool {pool.value} < context {ctx.value}")
    if short:
        return GateResult(
            "kv-pool", title, "fail", "; ".join(short) + ": a prompt over the pool fits the context", evidence
        )
    if missing:
        return GateResult("kv-pool", title, "unknown", "not reported: " + ", ".join(missing), evidence)
    return GateResult("kv-pool", title, "pass", "every role's pool holds a full context", evidence)


# -- gate 2 ---------------------------------------------------------------------------------------
def deferred_setting(f: EngineFacts) -> Fact | None:
    """Explicit environment first; else the release's default (known for 0.5.19 onwards)."""
    env = f.env_var(names.DEFERRED_ENV)
    if env is not None:
        return Fact(names.parse_bool(env.value), env.source)
    version = names.parse_version(f.version)
    if version is not None and version >= names.DEFERRED_DEFAULT_KNOWN_FROM:
        on = version >= names.DEFERRED_DEFAULT_ON_FROM
        return Fact(on, f"default of SGLang {f.version} (off before 0.5.21, on from 0.5.21)")
    return None


def gate_deferred_release(facts: dict[str, EngineFacts]) -> GateResult:
    title = "deferred decode KV release on for both roles"
    evidence, off, unknown = [], [], []
    for role in ROLES:
        fact = deferred_setting(facts[role])
        if fact is None or fact.value is None:
            unknown.append(
                f"{role} ({names.DEFERRED_ENV} not visible and version "
                f"{facts[role].version or 'unknown'} has no known default)"
            )
            continue
        evidence.append(Evidence(role, names.DEFERRED_ENV, fact.value, fact.source))
        if not fact.value:
            off.append(role)
    if off:
        return GateResult(
            "deferred-release",
            title,
            "fail",
            f"off on {', '.join(off)}: an abort frees pages an in-flight write can still land in",
            evidence,
        )
    if unknown:
        return GateResult("deferred-release", title, "unknown", "cannot tell for " + "; ".join(unknown), evidence)
    return GateResult("deferred-release", title, "pass", "on for both roles", evidence)


# -- gate 3 ---------------------------------------------------------------------------------------
def gate_transfer_batch(facts: dict[str, EngineFacts]) -> GateResult:
    """Prefill is the Mooncake sender; its synchronous batch must have a positive byte bound."""
    title = "Mooncake transfer batch bounded"
    backend = facts["prefill"].info(names.BACKEND_INFO_KEY)
    evidence = [Evidence("prefill", "transfer_backend", backend.value, backend.source)] if backend else []
    if backend is not None and str(backend.value).lower() != "mooncake":
        return GateResult(
            "transfer-batch",
            title,
            "not-applicable",
            f"transfer backend is {backend.value!r}, not mooncake",
            evidence,
        )
    fact = facts["prefill"].env_var(names.TRANSFER_BATCH_ENV)
    if fact is None:
        where = facts["prefill"].env_source or "no environment source given (--env prefill=...)"
        return GateResult(
            "transfer-batch",
            title,
            "unknown",
            f"{names.TRANSFER_BATCH_ENV} not set on prefill ({where}); the releases default it to 0 "
            "(one unbounded batch; `difflab preflight --build` reads this build's): "
            "set it explicitly to a positive index count",
            evidence,
        )
    evidence.append(Evidence("prefill", names.TRANSFER_BATCH_ENV, fact.value, fact.source))
    try:
        limit = int(fact.value)
    except ValueError:
        return GateResult(
            "transfer-batch",
            title,
            "fail",
            f"{names.TRANSFER_BATCH_ENV}={fact.value!r} is not an integer index count",
            evidence,
        )
    if limit <= 0:
        return GateResult(
            "transfer-batch",
            title,
            "fail",
            f"{names.TRANSFER_BATCH_ENV}={limit}: splitting is "
            "disabled, one request can submit an unbounded synchronous batch",
            evidence,
        )
    return GateResult("transfer-batch", title, "pass", f"batches bounded to {limit} KV indices", evidence)


# -- gate 4 ---------------------------------------------------------------------------------------
def checksum_level(f: EngineFacts) -> Fact | None:
    """The old ``--disaggregation-enable-kv-checksum`` flag as /server_info reports it, else the env level."""
    flag = f.info(names.CHECKSUM_FLAG_KEY)
    if flag is not None:
        return Fact(1 if names.parse_bool(flag.value) else 0, flag.source)
    env = f.env_var(names.CHECKSUM_ENV)
    if env is not None:
        try:
            return Fact(int(env.value), env.source)
        except ValueError:
            return Fact(1 if names.parse_bool(env.value) else 0, env.source)
    return None


_CHECKSUM_TITLE = "KV checksum enabled where supported and verifying"


def gate_kv_checksum(facts: dict[str, EngineFacts], probe: Callable[[], tuple[bool, str]] | None) -> GateResult:
    evidence: list[Evidence] = []
    for settled in (_checksum_unsupported, _checksum_settings):
        result = settled(facts, evidence)
        if result is not None:
            return result
    if probe is None:
        detail = "on for both roles with the same settings (decode compares; no --router given for a live request)"
        return _checksum("pass", detail, evidence)
    ok, detail = probe()
    evidence.append(Evidence("router", "live request", detail, "POST /generate"))
    if not ok:
        return _checksum("fail", f"on for both roles, but a live request failed: {detail}", evidence)
    detail = (
        "on for both roles with the same settings; a live request through the router was verified without a mismatch"
    )
    return _checksum("pass", detail, evidence)


def _checksum(status: str, detail: str, evidence: list[Evidence]) -> GateResult:
    return GateResult("kv-checksum", _CHECKSUM_TITLE, status, detail, evidence)


def _checksum_unsupported(facts: dict[str, EngineFacts], evidence: list[Evidence]) -> GateResult | None:
    """Context parallelism on either role: the checksum is not supported there."""
    for role in ROLES:
        for key in names.CHECKSUM_UNSUPPORTED_INFO_KEYS:
            fact = facts[role].info(key)
            if fact is not None and int(fact.value) > 1:
                evidence.append(Evidence(role, key, fact.value, fact.source))
                detail = f"{role} runs context parallelism ({key}={fact.value}): the checksum is not supported there"
                return _checksum("not-applicable", detail, evidence)
    return None


def _checksum_settings(facts: dict[str, EngineFacts], evidence: list[Evidence]) -> GateResult | None:
    """Each role's checksum level: off on a side, not visible, or differing levels fail (or stay unknown)."""
    levels: dict[str, int] = {}
    unknown = []
    for role in ROLES:
        fact = checksum_level(facts[role])
        if fact is None:
            unknown.append(role)
        else:
            levels[role] = int(fact.value)
            evidence.append(Evidence(role, "kv_checksum_level", fact.value, fact.source))
    off = [r for r, lv in levels.items() if lv <= 0]
    if off and len(off) < len(ROLES) and not unknown:
        detail = (
            f"off on {', '.join(off)} only: decode skips the "
            "comparison when one side ships no digest, so nothing is verified"
        )
        return _checksum("fail", detail, evidence)
    if off:
        return _checksum("fail", f"off on {', '.join(off)}", evidence)
    if unknown:
        detail = (
            f"not visible on {', '.join(unknown)}: neither /server_info {names.CHECKSUM_FLAG_KEY} nor "
            f"{names.CHECKSUM_ENV} in the given environment"
        )
        return _checksum("unknown", detail, evidence)
    if len(set(levels.values())) > 1:
        detail = f"levels differ ({levels}): the layout signatures disagree and decode skips the comparison"
        return _checksum("fail", detail, evidence)
    return None


def router_probe(router: EngineClient, timeout_s: float = 60.0) -> Callable[[], tuple[bool, str]]:
    """One short greedy request: a checksum mismatch aborts it (HTTP 500), a healthy path answers 200."""

    def probe() -> tuple[bool, str]:
        reply = router.generate("KV checksum preflight probe.", max_new_tokens=4, timeout=timeout_s)
        return reply.ok, f"HTTP {reply.status or reply.error}" + ("" if reply.ok else f": {reply.excerpt(160)}")

    return probe


def evaluate(facts: dict[str, EngineFacts], probe: Callable[[], tuple[bool, str]] | None = None) -> PreflightReport:
    """All four gates from already-scraped engine facts."""
    gates = [
        gate_kv_pool(facts),
        gate_deferred_release(facts),
        gate_transfer_batch(facts),
        gate_kv_checksum(facts, probe),
    ]
    down = _unreachable(facts)
    if down:
        for g in gates:
            if g.status == "unknown":
                g.reason += " — " + "; ".join(down)
    return PreflightReport(gates=gates, engines={r: f.summary() for r, f in facts.items()})
