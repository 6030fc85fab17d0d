"""Which names the matrix and the probe disagree on.

A misspelt field in ``expect`` or ``controls`` is a field the probe never returns; said as
"an expected field is missing" it sends the reader through every name by hand. These
helpers name it, with the probe's closest field. The other way round, a field the probe
returns and the matrix declares nowhere is evidence nobody judges: the summaries list it.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

from difflab.matrix.model import ProbeSpec
from difflab.observation import Observation
from difflab.probe.kit import BACKEND_NOT_APPLICABLE, BACKEND_SEPARATOR


def never_returned(spec: ProbeSpec, *observations: Observation | None) -> list[str]:
    """Declared fields (expect, then controls) absent from every given ``ok`` observation.

    Absent on every side is a name the probe does not have (a misspelling); absent on one
    side only is that side's behaviour, judged as drift by the caller.
    """
    seen = [o for o in observations if o is not None and o.ok]
    if not seen:
        return []
    return [name for name in [*spec.expect, *spec.controls] if all(name not in o.fields for o in seen)]


def describe_missing(spec: ProbeSpec, *observations: Observation | None) -> str | None:
    """``field(s) the matrix declares that <probe> never returned: expect 'a.b' (closest: 'a.bc')``, or None."""
    names = never_returned(spec, *observations)
    if not names:
        return None
    returned = list(dict.fromkeys(f for o in observations if o is not None and o.ok for f in o.fields))
    shown = []
    for name in names:
        kind = "expect" if name in spec.expect else "control"
        close = difflib.get_close_matches(name, returned, n=1, cutoff=0.6)
        shown.append(f"{kind} {name!r}" + (f" (closest: {close[0]!r})" if close else ""))
    return f"field(s) the matrix declares that {spec.name} did not return: " + ", ".join(shown)


def undeclared(spec: ProbeSpec, observations: Iterable[Observation | None]) -> list[str]:
    """Fields the probe returned that neither ``expect`` nor ``controls`` names (back-end markers aside)."""
    declared = {*spec.expect, *spec.controls}
    seen: dict[str, None] = {}
    for obs in observations:
        for name in obs.fields if obs is not None and obs.ok else {}:
            if name not in declared and not name.endswith(BACKEND_SEPARATOR + BACKEND_NOT_APPLICABLE):
                seen[name] = None
    return sorted(seen)
