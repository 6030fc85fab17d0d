"""The self-check judge (:mod:`difflab.diff.mutation`) refuses each way a broken revert could look causal.

Observations are shaped like #38935's own (the shipped matrix's fix, hunks and mutations): every
field at head, the reverted hunk's fields at base, controls as declared; then exactly one thing is
off, and the outcome, ``passed``, hunk coverage and the overall pass must all say so.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from difflab.diff.mutation import MutationResult, hunk_coverage, judge_mutation, not_run, selfcheck_passed
from difflab.matrix import Fix, Mutation, load_matrix
from difflab.matrix.model import ProbeSpec
from difflab.observation import Observation

MACHINERY_MATRIX = Path(__file__).resolve().parent / "fixtures" / "machinery" / "upstream.toml"
FIX = load_matrix(MACHINERY_MATRIX).fix("38935")  # a frozen shape: the judge's rules, not the default matrix
HEAD = "0.5.21"


def observed(reverted: tuple[str, ...], change: dict[str, dict[str, Any]] | None = None) -> dict[str, Observation]:
    at_base = {pf for h in FIX.hunks if h.id in reverted for pf in h.observed()}
    out = {}
    for spec in FIX.probes:
        fields = {f: pair[0] if (spec.name, f) in at_base else pair[1] for f, pair in spec.expect.items()}
        fields |= dict(spec.controls) | (change or {}).get(spec.name, {})
        out[spec.name] = Observation(FIX.id, spec.name, "mutated", {"kind": "release"}, "ok", fields=fields)
    return out


def spec_of(name: str) -> ProbeSpec:
    return next(s for s in FIX.probes if s.name == name)


def mutation(name: str) -> Mutation:
    return next(m for m in FIX.mutations if m.name == name)


def all_causal() -> list[MutationResult]:
    return [judge_mutation(FIX, m, HEAD, observed(m.hunks)) for m in FIX.mutations if m.hunks]


def with_one(result: MutationResult) -> list[MutationResult]:
    """Every mutation causal except ``result``'s, which replaces its causal judgment."""
    return [r for r in all_causal() if r.mutation != result.mutation] + [result]


def covered(results: list[MutationResult]) -> tuple[list[str], bool]:
    (coverage,) = hunk_coverage([FIX], {FIX.id: object()}, results)
    return coverage.uncovered, selfcheck_passed(results, hunk_coverage([FIX], {FIX.id: object()}, results))


def test_the_baseline_is_causal_and_fully_covered() -> None:
    assert covered(all_causal()) == ([], True)


def test_a_control_moved_by_the_mutation_is_never_causal() -> None:
    m = mutation("drop-group-retire")
    obs = observed(m.hunks, {"pr38935_prefill_door": {"group_valid.live_groups": 0}})
    result = judge_mutation(FIX, m, HEAD, obs)
    assert (result.outcome, result.passed) == ("error", False)
    assert "pr38935_prefill_door:group_valid.live_groups" in result.reason
    uncovered, passed = covered(with_one(result))
    assert uncovered == ["retire-group"] and not passed


def test_a_targeted_field_at_neither_value_did_not_flip() -> None:
    """``other`` is not ``base``: a field that went somewhere new did not return to the base behaviour."""
    m = mutation("drop-group-retire")
    result = judge_mutation(
        FIX, m, HEAD, observed(m.hunks, {"pr38935_prefill_door": {"rejected_group.live_groups": 7}})
    )
    assert (result.outcome, result.passed) == ("insensitive", False)
    assert "pr38935_prefill_door:rejected_group.live_groups" in result.reason


def test_every_targeted_field_of_a_hunk_is_checked_not_only_the_first() -> None:
    m = mutation("drop-group-retire")
    head_value = spec_of("pr38935_prefill_door").expect["rejected_group.live_groups"][1]
    result = judge_mutation(
        FIX, m, HEAD, observed(m.hunks, {"pr38935_prefill_door": {"rejected_group.live_groups": head_value}})
    )
    assert result.outcome == "insensitive" and "rejected_group.live_groups" in result.reason
    assert "rejected_group.group_retired" not in result.reason  # the field that did flip is not blamed


def test_every_expected_field_of_a_named_target_is_checked_not_only_the_first() -> None:
    """A mutation without hunks targets whole probes: each of their expected fields must go back to base."""
    spec = spec_of("pr38935_decode_door")
    m = Mutation("revert-decode", "sglang/srt/disaggregation/decode.py", "a", "b", (spec.name,))
    fields = {f: pair[0] for f, pair in spec.expect.items()}
    last = list(spec.expect)[-1]
    obs = observed(("decode-door",), {spec.name: fields | {last: spec.expect[last][1]}})
    assert judge_mutation(FIX, m, HEAD, observed(("decode-door",), {spec.name: fields})).outcome == "causal"
    result = judge_mutation(FIX, m, HEAD, obs)
    assert result.outcome == "insensitive" and f"{spec.name}:{last}" in result.reason


def test_an_insensitive_mutation_is_not_passed_and_does_not_cover_its_hunk() -> None:
    m = mutation("drop-group-retire")
    head_value = spec_of("pr38935_prefill_door").expect["rejected_group.group_retired"][1]
    result = judge_mutation(
        FIX, m, HEAD, observed(m.hunks, {"pr38935_prefill_door": {"rejected_group.group_retired": head_value}})
    )
    assert result.outcome == "insensitive" and not result.passed and result.to_dict()["passed"] is False
    assert result.hunks == ["retire-group"]  # it did revert the hunk, so only its outcome keeps it uncovered
    uncovered, passed = covered(with_one(result))
    assert uncovered == ["retire-group"] and not passed


def test_a_stale_mutation_is_not_passed_even_with_every_hunk_covered() -> None:
    stale = not_run(FIX, mutation("drop-group-retire"), HEAD, "mutation-stale", "the text to revert is not in the head")
    assert not stale.passed and stale.to_dict()["passed"] is False
    results = [*all_causal(), stale]  # the hunk is covered by the causal one: only the stale row can fail it
    uncovered, passed = covered(results)
    assert uncovered == [] and not passed


def test_uncovered_hunks_fail_the_selfcheck_though_every_mutation_passed() -> None:
    results = [r for r in all_causal() if r.mutation != "drop-group-retire"]
    assert results and all(r.passed for r in results)
    uncovered, passed = covered(results)
    assert uncovered == ["retire-group"] and not passed


def test_a_fix_without_mutations_is_an_error_row_and_no_results_never_pass() -> None:
    bare = Fix("9", 9, "no mutations", FIX.base, FIX.head, FIX.probes)
    row = not_run(bare, None, HEAD, "error", "no reverting mutation declared for this fix in the matrix")
    assert (row.mutation, row.outcome, row.passed) == ("(none)", "error", False)
    assert not selfcheck_passed([], hunk_coverage([bare], {bare.id: object()}, []))
    headless = hunk_coverage([FIX], {}, [])  # no head: nothing counted, so nothing was shown causal either
    assert not selfcheck_passed([], headless) and not selfcheck_passed([], [])
