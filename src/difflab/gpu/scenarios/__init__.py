"""The live-deployment scenarios. Each is a class with ``name``, ``needs_content`` and ``run(ep, limits)``."""

from difflab.gpu.scenarios.abort_storm import AbortStorm
from difflab.gpu.scenarios.base import Endpoints, Limits, Outcome, Scenario, ScenarioUnavailable
from difflab.gpu.scenarios.canary import CanaryLeak
from difflab.gpu.scenarios.oversized import OversizedPrompt

FUNCTIONAL: dict[str, Scenario] = {s.name: s for s in (OversizedPrompt(), CanaryLeak(), AbortStorm())}

__all__ = [
    "FUNCTIONAL",
    "AbortStorm",
    "CanaryLeak",
    "Endpoints",
    "Limits",
    "Outcome",
    "OversizedPrompt",
    "Scenario",
    "ScenarioUnavailable",
]
