"""What the test server simulates: sizes, timings, and the switches for each pre-fix behaviour."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from difflab.engine import names

ROLES = ("prefill", "decode")


def safe_env() -> dict[str, str]:
    """The environment of a deployment that passes every preflight gate."""
    return {
        names.DEFERRED_ENV: "1",
        names.DEFERRED_TIMEOUT_ENV: "30",
        names.TRANSFER_BATCH_ENV: str(1 << 30),
        names.CHECKSUM_ENV: "1",
    }


@dataclass
class TestServerConfig:
    """One simulated 1P1D deployment. Defaults: nothing unsafe switched on, pool >= context."""

    __test__ = False  # not a pytest test class despite the name

    model: str = "Qwen/Qwen3-0.6B"
    version: str = "0.5.23"
    context_length: int = 2048
    page_size: int = 16
    prefill_pool_tokens: int = 4096
    decode_pool_tokens: int = 8192
    transfer_s: float = 0.15  # how long one request's KV write is in flight
    decode_token_s: float = 0.0004
    deferred_timeout_s: float = 1.0
    wait_for_pages_s: float = 2.0
    # --- pre-fix behaviours -------------------------------------------------------------------
    admit_rejected: bool = False  # #38935 base: an over-pool prompt is handed off with stale pages
    rejected_hang_s: float = 0.0  # ... and decode waits this long before answering (0.5.20: up to 300 s)
    prefill_leaks_aborted: bool = False  # #36988 base: an aborted request's prefill pages are never freed
    # --- what the engines report about themselves -------------------------------------------
    env: dict[str, dict[str, str]] = field(default_factory=lambda: {r: safe_env() for r in ROLES})
    server_args: dict[str, dict[str, Any]] = field(default_factory=lambda: {r: {} for r in ROLES})
    model_info_paths: tuple[str, ...] = ("/model_info", "/get_model_info")
    server_info_paths: tuple[str, ...] = ("/server_info", "/get_server_info")
    deferred_metric: bool = True  # 0.5.22+ expose decode_deferred_kv_release_total{outcome}

    def pool_tokens(self, role: str) -> int:
        return self.prefill_pool_tokens if role == "prefill" else self.decode_pool_tokens

    @property
    def deferred_release(self) -> bool:
        """Decode holds an aborted request's pages until its in-flight write drains."""
        return names.parse_bool(self.env.get("decode", {}).get(names.DEFERRED_ENV, "0")) is True

    def checksum_level(self, role: str) -> int:
        """Checksum as this role reports it: the old server flag, else the newer environment level."""
        flag = self.server_args.get(role, {}).get(names.CHECKSUM_FLAG_KEY)
        if flag is not None:
            return 1 if flag else 0
        try:
            return int(self.env.get(role, {}).get(names.CHECKSUM_ENV, "0"))
        except ValueError:
            return 0

    @property
    def checksum_active(self) -> bool:
        """Decode compares only when both sides digest with the same settings (else it skips)."""
        levels = {self.checksum_level(r) for r in ROLES}
        return len(levels) == 1 and levels.pop() > 0

    def with_env(self, role: str, **values: str | None) -> TestServerConfig:
        """A copy with environment variables of one role set (``None`` removes one)."""
        env = {r: dict(v) for r, v in self.env.items()}
        for key, value in values.items():
            if value is None:
                env[role].pop(key, None)
            else:
                env[role][key] = value
        return replace(self, env=env)


def head_config(**overrides: Any) -> TestServerConfig:
    """The fixed build: every pre-fix switch off. The prefill pool is below the context length on
    purpose, as in the GPU deployment, so that an over-pool prompt within the context exists."""
    return replace(TestServerConfig(prefill_pool_tokens=1024), **overrides)


def base_config(**overrides: Any) -> TestServerConfig:
    """The pre-fix build: stale hand-off, prefill leak on abort, no deferred release, no checksum."""
    cfg = head_config(admit_rejected=True, prefill_leaks_aborted=True, deferred_metric=False, version="0.5.20")
    older = {names.DEFERRED_ENV: "0", names.CHECKSUM_ENV: "0"}
    cfg = cfg.with_env("prefill", **older).with_env("decode", **older)
    return replace(cfg, **overrides)
