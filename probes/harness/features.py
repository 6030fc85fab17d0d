"""Does this SGLang have the machinery a fix modifies? A release that predates it is ``n/a``, not an error.

Each probe names, in its version-adaptation block, the code its fix changes (a module and an
attribute path inside it) and calls :meth:`Machinery.require` before anything else. A source
without that module or attribute stops the probe through ``kit.not_applicable`` with the
missing feature named. Only the named SGLang module itself missing counts: an import error
from one of its dependencies is a real failure and stays an error.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from difflab.probe.kit import Kit


@dataclass(frozen=True)
class Machinery:
    """The code a fix modifies: ``module`` and a dotted ``attribute`` path in it, and what a person calls it."""

    feature: str
    module: str
    attribute: str

    def require(self, kit: Kit) -> None:
        """Stop the probe as not applicable unless this source has the machinery."""
        try:
            found: object = importlib.import_module(self.module)
        except ModuleNotFoundError as exc:
            missing = exc.name or ""
            if missing.startswith("sglang.") and (self.module == missing or self.module.startswith(missing + ".")):
                kit.not_applicable(f"no {self.feature}: this SGLang has no module {missing}")
            raise
        for part in self.attribute.split("."):
            if not hasattr(found, part):
                kit.not_applicable(f"no {self.feature}: {self.module}.{self.attribute} does not exist in this SGLang")
            found = getattr(found, part)
