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
        from difflab.runner.warm import WarmRunner  # type: ignore[import-not-found]

        return WarmRunner(**options)
    if name == "docker":
        from difflab.runner.docker import DockerRunner  # type: ignore[import-not-found]

        return DockerRunner(**options)
    raise ConfigError(f"unknown backend {name!r} (expected subprocess, warm or docker)")


__all__ = ["ProbeJob", "Runner", "runner_for"]
