"""Execution back ends: how a probe gets run against a source.

All answer :class:`~difflab.runner.base.Runner`. Each back end is a class that declares its
``name`` (the ``--backend`` value) and three flags the protocol documents: ``result_cache`` (may the
result cache answer for it), ``local_environment`` (does it run probes in the local shared
environment) and ``hermetic`` (may it run code nobody vouched for: no network, nothing of the host
writable but its output); :data:`RUNNERS` lists them. A new back end is a new module here and one
entry in that tuple, nothing else.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from typing import Any

from difflab.errors import ConfigError
from difflab.probe import sandbox
from difflab.runner.base import ProbeJob, Runner
from difflab.runner.cache import CachingRunner
from difflab.runner.docker import DockerRunner
from difflab.runner.subprocess import SubprocessRunner
from difflab.runner.warm import WarmRunner

RunnerClass = type[Runner]
"""A registered back end class: its flags are read before an instance exists."""

RUNNERS: dict[str, RunnerClass] = {cls.name: cls for cls in (SubprocessRunner, WarmRunner, DockerRunner)}
"""``--backend NAME`` -> back end class."""

DEFAULT = WarmRunner.name


def _stderr(message: str) -> None:
    print(f"difflab: {message}", file=sys.stderr)


def runner_class(name: str) -> RunnerClass:
    try:
        return RUNNERS[name]
    except KeyError:
        known = ", ".join(RUNNERS)
        raise ConfigError(f"unknown backend {name!r} (expected one of {known})") from None


def runner_for(name: str, **options: Any) -> Runner:
    """The back end for ``--backend NAME``."""
    return runner_class(name)(**options)


def build_runner(
    name: str, environment: Any, use_cache: bool, say: Callable[[str], None] | None = None, **options: Any
) -> Runner:
    """``runner_for`` on the shared environment, wrapped in the result cache where the back end allows it.

    ``say`` goes to a back end that reports progress of its own (``say`` field: docker's image build).
    """
    cls = runner_class(name)
    options.setdefault("environment", environment)
    if say is not None and "say" in {f.name for f in dataclasses.fields(cls)}:
        options.setdefault("say", say)
    runner = cls(**options)
    boxed = not cls.local_environment or sandbox.available()
    if not boxed:
        (say or _stderr)(
            "this kernel has no Landlock: the probe processes can read the lab's keys (the signing key, the "
            "result cache's key), so the result cache is off; --backend docker runs code you did not write in a box"
        )
    if not (use_cache and cls.result_cache and boxed):
        return runner
    cache = options.get("cache")
    return CachingRunner(inner=runner, environment=environment, cache_dir=cache / "results" if cache else None)


__all__ = ["DEFAULT", "RUNNERS", "ProbeJob", "Runner", "RunnerClass", "build_runner", "runner_class", "runner_for"]
