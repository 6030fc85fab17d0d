"""The self-check judge on a fix whose paths run on each transport back end, and the words it leaves.

#41404's probe observes every scenario on Mooncake, NIXL and Mori (the machinery matrix's own
declaration), so each of its paths is three paths, ``failure-notify@mooncake`` and so on. A head
that lacks one back end (or its machinery) says so in a single ``<backend>:not-applicable`` field:
that back end's copies of a path are then neither reverted, nor targeted, nor counted in coverage,
and the result names the back end with its reason. The reasons are what ``selfcheck.md`` and the
JUnit cases print; they are read here in full, as a reader of those files would.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from difflab.diff.mutation import fix_coverage, judge_mutation, not_run
from difflab.matrix import Fix, Mutation, load_matrix
from difflab.matrix.model import ProbeSpec
from difflab.observation import Observation
from difflab.probe.kit import BACKEND_NOT_APPLICABLE, backend_field

MACHINERY_MATRIX = Path(__file__).resolve().parent / "fixtures" / "machinery" / "upstream.toml"
MATRIX = load_matrix(MACHINERY_MATRIX)
FIX = MATRIX.fix("41404")
DOORS = MATRIX.fix("38935")  # back-end independent paths
HEAD = "0.5.21"
NO_NIXL = "this build ships no NIXL connector"


def spec_of(fix: Fix, name: str) -> ProbeSpec:
    return next(s for s in fix.probes if s.name == name)


def mutation(fix: Fix, name: str) -> Mutation:
    return next(m for m in fix.mutations if m.name == name)


def observed(
    fix: Fix, reverted: tuple[str, ...], missing: dict[str, str] | None = None, change: dict[str, Any] | None = None
) -> dict[str, Observation]:
    """Each probe at head with the ``reverted`` paths' fields at base; a ``missing`` back end reports only why."""
    missing = missing or {}
    at_base = {pf for h in fix.hunks if h.id in reverted for pf in h.observed()}
    out = {}
    for spec in fix.probes:
        fields = {f: pair[0] if (spec.name, f) in at_base else pair[1] for f, pair in spec.expect.items()}
        fields |= dict(spec.controls)
        fields = {f: v for f, v in fields.items() if f.split(":", 1)[0] not in missing}
        fields |= {backend_field(b, BACKEND_NOT_APPLICABLE): why for b, why in missing.items()}
        fields |= (change or {}).get(spec.name, {})
        out[spec.name] = Observation(fix.id, spec.name, "mutated", {"kind": "release"}, "ok", fields=fields)
    return out


def test_each_declared_path_is_one_path_per_back_end() -> None:
    m = mutation(FIX, "skip-abort-notify-on-failure")
    assert m.hunks == ("failure-notify@mooncake", "failure-notify@nixl", "failure-notify@mori")
    assert spec_of(FIX, "pr41404_deferred_release").backends == ("mooncake", "nixl", "mori")


def test_a_back_end_the_head_lacks_is_neither_reverted_nor_counted_and_is_named_with_its_reason() -> None:
    m = mutation(FIX, "skip-abort-notify-on-failure")
    kept = ("failure-notify@mooncake", "failure-notify@mori")
    result = judge_mutation(FIX, m, HEAD, observed(FIX, kept, {"nixl": NO_NIXL}))
    assert (result.outcome, result.passed) == ("causal", True)
    assert result.hunks == list(kept) and result.not_applicable == {"nixl": NO_NIXL}
    assert result.reason == (
        "reverting failure-notify@mooncake, failure-notify@mori brings back its base behaviour; "
        "the fix's other paths and every control hold"
    )
    assert result.probes == {"pr41404_deferred_release": "mixed"}  # its reverted fields at base, without NIXL's
    coverage = fix_coverage(FIX, [result])
    assert [h for h in coverage.hunks if "@nixl" in h] == [] and "failure-notify@mooncake" in coverage.hunks
    assert coverage.covered == list(kept)
    assert coverage.note == f"not applicable on nixl in the head: {NO_NIXL}"


def test_a_back_end_that_applies_is_still_judged_beside_one_that_does_not() -> None:
    """Mori's copy of the path left at head is named; the missing NIXL copy is not blamed for anything."""
    m = mutation(FIX, "skip-abort-notify-on-failure")
    result = judge_mutation(FIX, m, HEAD, observed(FIX, ("failure-notify@mooncake",), {"nixl": NO_NIXL}))
    assert result.outcome == "insensitive" and "mori:failed.abort_messages" in result.reason
    assert "nixl" not in result.reason and result.not_applicable == {"nixl": NO_NIXL}


def test_another_path_on_a_missing_back_end_is_not_asked_to_hold() -> None:
    """The fix's other paths on NIXL have no fields on this head: only Mooncake's and Mori's must keep head."""
    m = mutation(FIX, "skip-abort-notify-on-failure")
    kept = ("failure-notify@mooncake", "failure-notify@mori")
    moved = {"pr41404_deferred_release": {"mori:racing_ack.outcome": "held", "mooncake:racing_ack.still_held": True}}
    result = judge_mutation(FIX, m, HEAD, observed(FIX, kept, {"nixl": NO_NIXL}, moved))
    assert result.outcome == "entangled"
    assert result.reason == (
        "reverting failure-notify@mooncake, failure-notify@mori also moved other path(s): "
        "arm-before-abort@mooncake (pr41404_deferred_release:mooncake:racing_ack.still_held), "
        "arm-before-abort@mori (pr41404_deferred_release:mori:racing_ack.outcome) "
        "-- the matrix's hunk fields or the mutation are too broad"
    )


def test_a_mutation_whose_every_path_is_on_missing_back_ends_is_an_error_and_runs_no_judgment() -> None:
    m = mutation(FIX, "skip-abort-notify-on-failure")
    missing = {"mooncake": "no Mooncake", "nixl": NO_NIXL, "mori": "no Mori"}
    result = judge_mutation(FIX, m, HEAD, observed(FIX, (), missing))
    assert (result.outcome, result.passed, result.hunks, result.probes) == ("error", False, [], {})
    assert result.reason == "every path this mutation reverts is on a back end that does not apply here"
    assert result.not_applicable == missing
    coverage = fix_coverage(FIX, [result])
    assert coverage.hunks == [] and coverage.note == (
        f"not applicable on mooncake in the head: no Mooncake; not applicable on nixl in the head: {NO_NIXL}; "
        "not applicable on mori in the head: no Mori"
    )


def test_the_result_carries_every_observation_it_was_judged_on() -> None:
    m = mutation(DOORS, "drop-prefill-door-guard")
    obs = observed(DOORS, m.hunks)
    result = judge_mutation(DOORS, m, HEAD, obs)
    assert result.observations == [o.to_dict() for o in obs.values()]
    assert (result.fix, result.mutation, result.file, result.head) == (DOORS.id, m.name, m.file, HEAD)
    assert result.not_applicable == {} and result.to_dict()["passed"] is True


def test_each_failed_check_says_which_fields_in_full() -> None:
    m = mutation(DOORS, "drop-prefill-door-guard")
    door = spec_of(DOORS, "pr38935_prefill_door")
    first, second = list(door.controls)[:2]
    moved = {door.name: {first: "moved", second: "moved"}}
    drift = judge_mutation(DOORS, m, HEAD, observed(DOORS, m.hunks, change=moved))
    assert drift.reason == (
        f"the mutation changed control field(s), so it reverts more than the fix: {door.name}:{first}, "
        f"{door.name}:{second}"
    )
    head_values = {f: door.expect[f][1] for f in ("rejected.enqueued", "rejected.sender_created")}
    unflipped = judge_mutation(DOORS, m, HEAD, observed(DOORS, m.hunks, change={door.name: head_values}))
    assert unflipped.reason == (
        f"targeted field(s) did not return to the base behaviour: {door.name}:rejected.enqueued, "
        f"{door.name}:rejected.sender_created"
    )


def test_an_errored_probe_without_a_message_reads_as_no_observation() -> None:
    m = mutation(DOORS, "drop-prefill-door-guard")
    obs = observed(DOORS, m.hunks)
    for name in obs:
        obs[name] = Observation(DOORS.id, name, "mutated", {}, "error")
    result = judge_mutation(DOORS, m, HEAD, obs)
    assert result.reason == (
        "no trustworthy observation under the mutation: "
        "pr38935_prefill_door: no observation; pr38935_decode_door: no observation"
    )


def test_a_named_target_mutation_is_causal_on_its_targets_alone() -> None:
    """Without hunks a mutation targets whole probes; the fix's paths seen by other probes are not its business."""
    decode = spec_of(DOORS, "pr38935_decode_door")
    m = Mutation("revert-decode", "sglang/srt/disaggregation/decode.py", "a", "b", (decode.name,))
    at_base = {decode.name: {f: pair[0] for f, pair in decode.expect.items()}}
    door = spec_of(DOORS, "pr38935_prefill_door")
    moved = {door.name: {"rejected.enqueued": door.expect["rejected.enqueued"][0]}}
    result = judge_mutation(DOORS, m, HEAD, observed(DOORS, (), change=at_base | moved))
    assert (result.outcome, result.hunks) == ("causal", [])
    assert result.reason == "reverting the fix's lines brings back the base behaviour; controls hold"


def test_a_row_judged_before_any_probe_keeps_its_mutation_file_or_none() -> None:
    m = mutation(DOORS, "drop-prefill-door-guard")
    stale = not_run(DOORS, m, HEAD, "mutation-stale", "gone")
    assert (stale.mutation, stale.file, stale.observations, stale.probes) == (m.name, m.file, [], {})
    bare = not_run(DOORS, None, HEAD, "error", "none declared")
    assert (bare.mutation, bare.file, bare.head, bare.reason) == ("(none)", "", HEAD, "none declared")


def test_a_fix_without_declared_paths_is_told_to_declare_them() -> None:
    coverage = fix_coverage(Fix("7", 7, "no hunks", DOORS.base, DOORS.head, DOORS.probes), [])
    assert coverage.to_dict() == {
        "fix": "7",
        "hunks": ["(no hunks declared)"],
        "covered": [],
        "note": "declare the fix's paths as [[fixes.hunks]]",
        "uncovered": ["(no hunks declared)"],
    }
