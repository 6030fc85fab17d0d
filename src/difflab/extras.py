"""Optional dependencies (pip extras): imported where they are used; a missing one is a clean exit 2.

The base install stays small: numpy/scipy (statistics), prometheus_client (the GPU tier's metrics)
and sigstore (keyless signatures) come with extras. Code that needs one calls :func:`require`
at the point of use, so everything else keeps working without it and the user is told which
extra to install instead of seeing a traceback.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from difflab.errors import DifflabError

# Top-level module -> the extra that installs it (pyproject.toml [project.optional-dependencies]).
EXTRA_OF = {
    "numpy": "stats",
    "scipy": "stats",
    "prometheus_client": "gpu",
    "sigstore": "sigstore",
}


def install_hint(extra: str) -> str:
    return f"pip install 'sglang-difflab[{extra}]'"


class MissingExtra(DifflabError):
    """An optional dependency is not installed (exit 2); the message is the pip line that fixes it."""

    def __init__(self, module: str, purpose: str) -> None:
        self.module = module
        self.extra = EXTRA_OF[module.split(".")[0]]
        super().__init__(f"{purpose} needs {module.split('.')[0]}, which is not installed: {install_hint(self.extra)}")


def require(module: str, purpose: str) -> ModuleType:
    """Import ``module`` (e.g. ``scipy.stats``) or raise :class:`MissingExtra` naming the extra.

    Only the absence of the package itself is translated; any other import failure propagates.
    """
    top = module.split(".")[0]
    if top not in EXTRA_OF:
        raise ValueError(f"{top} is not an optional dependency (known: {', '.join(sorted(EXTRA_OF))})")
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (exc.name == top or exc.name.startswith(f"{top}.")):
            raise MissingExtra(module, purpose) from None
        raise
