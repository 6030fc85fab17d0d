"""Transport back ends inside one observation: whose fields are whose, and which back ends do not apply.

A probe whose scenarios run on each transport back end the build ships names its
fields ``<backend>:<field>`` (:func:`difflab.probe.kit.backend_field`); a back end
the build lacks, or one without the fix's machinery, contributes the single field
``<backend>:not-applicable`` saying why. The matrix declares each field once and
lists the back ends (``backends = [...]``); the loader expands the names. Judging
drops a non-applicable back end's fields (:func:`applicable`), so such a back end
is named beside the verdict instead of reading as a missing field.
"""

from __future__ import annotations

from dataclasses import replace

from difflab.matrix.model import ProbeSpec
from difflab.observation import Observation
from difflab.probe.kit import BACKEND_NOT_APPLICABLE, BACKEND_SEPARATOR, backend_field

__all__ = ["applicable", "backend_field", "backend_of", "gaps"]


def backend_of(field: str) -> str | None:
    """The back end a field was observed on, or None for a back-end independent field."""
    head, sep, _ = field.partition(BACKEND_SEPARATOR)
    return head if sep else None


def gaps(obs: Observation | None, spec: ProbeSpec) -> dict[str, str]:
    """Back end -> why it does not apply on this source, for the probe's declared back ends."""
    if obs is None or not obs.ok:
        return {}
    out = {}
    for backend in spec.backends:
        reason = obs.fields.get(backend_field(backend, BACKEND_NOT_APPLICABLE))
        if reason is not None:
            out[backend] = str(reason)
    return out


def applicable(spec: ProbeSpec, skip: set[str] | dict[str, str]) -> ProbeSpec:
    """``spec`` without the fields of the back ends in ``skip`` (the back ends that do not apply)."""
    if not skip:
        return spec

    def keep(field: str) -> bool:
        return backend_of(field) not in skip

    return replace(
        spec,
        expect={f: v for f, v in spec.expect.items() if keep(f)},
        controls={f: v for f, v in spec.controls.items() if keep(f)},
        channels={f: c for f, c in spec.channels.items() if keep(f)},
        backends=tuple(b for b in spec.backends if b not in skip),
    )
