"""Scrape the engines and evaluate the gates: the one entry point the CLI and the GPU tier call."""

from __future__ import annotations

from difflab.engine.client import EngineClient
from difflab.engine.facts import read_engine
from difflab.preflight.envsource import read_env
from difflab.preflight.gates import PreflightReport, evaluate, router_probe


def run_preflight(
    prefill_url: str,
    decode_url: str,
    router_url: str | None = None,
    env_sources: dict[str, str] | None = None,
    envs: dict[str, dict[str, str]] | None = None,
    timeout_s: float = 30.0,
) -> PreflightReport:
    """``env_sources`` name where to read each role's environment; ``envs`` give it directly (GPU tier)."""
    env_sources = env_sources or {}
    envs = envs or {}
    facts = {}
    for role, url in (("prefill", prefill_url), ("decode", decode_url)):
        env, label = envs.get(role), "deployment spec" if role in envs else None
        if env is None and role in env_sources:
            env, label = read_env(env_sources[role]), env_sources[role]
        facts[role] = read_engine(role, EngineClient(url, timeout_s), env, label)
    probe = router_probe(EngineClient(router_url, timeout_s), timeout_s) if router_url else None
    return evaluate(facts, probe)
