"""What a running engine says about itself, whichever SGLang version it is.

Names drift between releases (``/get_model_info`` became ``/model_info``, the KV
checksum moved from a server flag to an environment variable), so every lookup
here names the alternatives it tried and records which one answered: a gate or a
scenario can then say *where* a number came from. Sources of truth are listed in
:mod:`difflab.engine.names`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from difflab.engine import names
from difflab.engine.client import EngineClient, EngineError
from difflab.engine.metrics import MetricSet


@dataclass
class Fact:
    """One value and where it came from (``source`` is human-readable, e.g. ``metric sglang:context_len``)."""

    value: Any
    source: str


@dataclass
class EngineFacts:
    """One scrape of one engine: its self-description, metrics and (when given) its environment."""

    role: str
    url: str
    server_info: dict[str, Any] | None = None
    server_info_path: str | None = None
    model_info: dict[str, Any] | None = None
    model_info_path: str | None = None
    metrics: MetricSet | None = None
    env: dict[str, str] | None = None
    env_source: str | None = None
    errors: list[str] = field(default_factory=list)

    @property
    def reachable(self) -> bool:
        return self.server_info is not None or self.metrics is not None

    @property
    def version(self) -> str | None:
        value = (self.server_info or {}).get("version")
        return str(value) if value else None

    def info(self, *keys: str) -> Fact | None:
        """The first of ``keys`` that /server_info reports with a non-null value."""
        for key in keys:
            value = (self.server_info or {}).get(key)
            if value is not None:
                return Fact(value, f"{self.server_info_path or '/server_info'} {key}")
        return None

    def metric_min(self, name: str) -> Fact | None:
        if self.metrics is None:
            return None
        value = self.metrics.minimum(name)
        return None if value is None else Fact(value, f"metric {name}")

    def env_var(self, name: str) -> Fact | None:
        """The variable from the given environment source; ``None`` when there is no source or it is unset."""
        if self.env is None or name not in self.env:
            return None
        return Fact(self.env[name], f"env {name} ({self.env_source})")

    def pool_tokens(self) -> Fact | None:
        """KV pool size in tokens (weakest rank), from metrics first, then /server_info."""
        fact = self.metric_min(names.POOL_METRIC) or self.info(names.POOL_INFO_KEY)
        return None if fact is None else Fact(int(fact.value), fact.source)

    def context_len(self) -> Fact | None:
        """The context length the engine serves (``context_length`` may be null: the model default)."""
        fact = self.metric_min(names.CONTEXT_METRIC) or self.info(*names.CONTEXT_INFO_KEYS)
        return None if fact is None else Fact(int(fact.value), fact.source)

    def summary(self) -> dict[str, Any]:
        return {
            "role": self.role,
            "url": self.url,
            "version": self.version,
            "reachable": self.reachable,
            "server_info_path": self.server_info_path,
            "model_info_path": self.model_info_path,
            "env_source": self.env_source,
            "errors": list(self.errors),
        }


def read_engine(
    role: str, client: EngineClient, env: dict[str, str] | None = None, env_source: str | None = None
) -> EngineFacts:
    """Scrape /server_info, /model_info and /metrics; an unanswered endpoint becomes an error line."""
    facts = EngineFacts(role=role, url=client.base_url, env=env, env_source=env_source)
    try:
        facts.server_info = client.server_info()
        facts.server_info_path = client.server_info_path
    except EngineError as exc:
        facts.errors.append(str(exc))
    try:
        facts.model_info = client.model_info()
        facts.model_info_path = client.model_info_path
    except EngineError as exc:
        facts.errors.append(str(exc))
    try:
        facts.metrics = client.metrics()
    except (EngineError, ValueError) as exc:
        facts.errors.append(str(exc))
    return facts
