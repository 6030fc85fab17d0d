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
from difflab.probe.kit import BACKEND_NOT_APPLICABLE, BACKEND_SEPARATOR, DEFAULT_BACKEND, backend_field

__all__ = ["applicable", "as_declared", "backend_field", "backend_of", "gaps"]


def as_declared(spec: ProbeSpec, obs: Observation | None) -> Observation | None:
    """``obs`` as ``spec`` names its fields.

    A matrix written before its probe observed each back end (no ``backends``, as in
    an older bundle) declares plain field names; the probe now reports them per back
    end. That matrix is then judged on the server's default back end's fields, the only
    ones the probe observed when the matrix was written.
    """
    if obs is None or spec.backends or not obs.fields:
        return obs
    names = [*spec.expect, *spec.controls]
    if any(n in obs.fields for n in names):
        return obs
    mark = f"{DEFAULT_BACKEND}{BACKEND_SEPARATOR}"
    if not any(backend_field(DEFAULT_BACKEND, n) in obs.fields for n in names):
        return obs
    fields = {k.removeprefix(mark): v for k, v in obs.fields.items() if k.startswith(mark)}
    return replace(obs, fields=fields)


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
