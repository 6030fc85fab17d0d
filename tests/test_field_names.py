"""The names the matrix and a probe disagree on (:mod:`difflab.diff.fields`), as a verdict's reason says them.

A misspelt matrix field is named with the probe's closest field, offered only from observations that
ran; a field the probe returned that the matrix declares nowhere is listed once.
"""

from __future__ import annotations

from difflab.diff.fields import describe_missing, undeclared
from difflab.matrix.model import ProbeSpec
from difflab.observation import Observation

SPEC = ProbeSpec(
    "door", expect={"rejected.enqueued": (True, False), "timeout.held": (False, True)}, controls={"x.y": 1}
)


def observation(status: str, **fields: object) -> Observation:
    return Observation("7", "door", "head", {}, status, fields=dict(fields))  # type: ignore[arg-type]


def test_each_missing_field_is_named_with_its_closest_returned_name_or_alone() -> None:
    ran = observation("ok", **{"rejected.enqueud": False, "x.y": 1, "other.thing": 2})
    errored = observation("error", **{"timeout.held_": True})  # an errored run's names are not offered
    said = describe_missing(SPEC, None, errored, ran)
    assert said == (
        "field(s) the matrix declares that door did not return: expect 'rejected.enqueued' (closest: "
        "'rejected.enqueud'), expect 'timeout.held'"
    )
    assert undeclared(SPEC, [None, errored, ran]) == ["other.thing", "rejected.enqueud"]
