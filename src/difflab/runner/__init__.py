"""Execution back ends: how a probe gets run against a source.

All answer :class:`~difflab.runner.base.Runner`; :func:`runner_for` picks one.
"""

from __future__ import annotations

from typing import Any

from difflab.runner.base import ProbeJob, Runner


def runner_for(name: str, **options: Any) -> Runner:
    """The back end for ``--backend NAME``."""
    from difflab.errors import ConfigError

    if name == "subprocess":
        from difflab.runner.subprocess import SubprocessRunner

        return SubprocessRunner(**options)
    if name == "warm":
        from difflab.runner.warm import WarmRunner

        return WarmRunner(**options)
    if name == "docker":
        from difflab.runner.docker import DockerRunner

        return DockerRunner(**options)
    raise ConfigError(f"unknown backend {name!r} (expected subprocess, warm or docker)")


def build_runner(name: str, environment: Any, use_cache: bool, **options: Any) -> Runner:
    """``runner_for`` plus the shared environment and, unless docker or ``--no-cache``, the result cache."""
    if name in ("subprocess", "warm"):
        options.setdefault("environment", environment)
    runner = runner_for(name, **options)
    if use_cache and name != "docker":
        from difflab.runner.cache import CachingRunner

        return CachingRunner(inner=runner, environment=environment)
    return runner


__all__ = ["ProbeJob", "Runner", "build_runner", "runner_for"]
