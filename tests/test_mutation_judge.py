"""Judging a reverting mutation (:mod:`difflab.diff.mutation`) and its files, on the shipped matrix's own fix.

Observations are built from #38935's declared values, its hunks and its mutations: each reverted
hunk's fields at their base value, everything else at head, controls as declared. Then one thing
is changed at a time, and the outcome must name it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from junitparser import JUnitXml

from difflab.diff.mutation import coverage_ratio, hunk_coverage, judge_mutation, selfcheck_passed
from difflab.matrix import Fix, Mutation, load_matrix
from difflab.observation import Observation
from difflab.report.selfcheck import write_selfcheck

MACHINERY_MATRIX = Path(__file__).resolve().parent / "fixtures" / "machinery" / "upstream.toml"
FIX = load_matrix(MACHINERY_MATRIX).fix("38935")  # a frozen shape: the judge's rules, not the default matrix


def observed(
    fix: Fix, reverted: tuple[str, ...], change: dict[str, dict[str, Any]] | None = None
) -> dict[str, Observation]:
    """Each probe at head, the fields of the ``reverted`` hunks at base, controls as declared; then ``change``."""
    at_base = {pf for h in fix.hunks if h.id in reverted for pf in h.observed()}
    out = {}
    for spec in fix.probes:
        fields = {f: pair[0] if (spec.name, f) in at_base else pair[1] for f, pair in spec.expect.items()}
        fields |= dict(spec.controls) | (change or {}).get(spec.name, {})
        out[spec.name] = Observation(fix.id, spec.name, "mutated", {"kind": "release"}, "ok", fields=fields)
    return out


def mutation(name: str) -> Mutation:
    return next(m for m in FIX.mutations if m.name == name)


def test_every_shipped_mutation_that_reverts_exactly_its_hunks_is_causal() -> None:
    with_hunks = [m for m in FIX.mutations if m.hunks]
    assert len(with_hunks) >= 3
    for m in with_hunks:
        result = judge_mutation(FIX, m, "0.5.21", observed(FIX, m.hunks))
        assert (result.outcome, result.passed, result.hunks) == ("causal", True, list(m.hunks)), result.reason
        assert set(result.probes) == {s.name for s in FIX.probes}


def test_a_targeted_field_left_at_head_is_insensitive_and_named() -> None:
    m = mutation("drop-prefill-door-guard")
    spec = next(s for s in FIX.probes if s.name == "pr38935_prefill_door")
    obs = observed(FIX, m.hunks, {spec.name: {"rejected.enqueued": spec.expect["rejected.enqueued"][1]}})
    result = judge_mutation(FIX, m, "0.5.21", obs)
    assert result.outcome == "insensitive" and "pr38935_prefill_door:rejected.enqueued" in result.reason


def test_a_mutation_that_also_moves_another_path_is_entangled_and_names_it() -> None:
    m = mutation("drop-prefill-door-guard")
    decode = next(s for s in FIX.probes if s.name == "pr38935_decode_door")
    obs = observed(FIX, m.hunks, {decode.name: {"rejected.pending": decode.expect["rejected.pending"][0]}})
    result = judge_mutation(FIX, m, "0.5.21", obs)
    assert result.outcome == "entangled" and "decode-door (pr38935_decode_door:rejected.pending)" in result.reason


def test_a_moved_control_is_an_error_not_a_causal_revert() -> None:
    m = mutation("drop-prefill-door-guard")
    spec = next(s for s in FIX.probes if s.name == "pr38935_prefill_door")
    control, value = next(iter(spec.controls.items()))
    obs = observed(FIX, m.hunks, {spec.name: {control: not value if isinstance(value, bool) else None}})
    result = judge_mutation(FIX, m, "0.5.21", obs)
    assert result.outcome == "error" and f"{spec.name}:{control}" in result.reason and "control" in result.reason


def test_a_probe_error_under_the_mutation_is_an_error_naming_its_last_line() -> None:
    m = mutation("drop-prefill-door-guard")
    obs = observed(FIX, m.hunks)
    obs["pr38935_prefill_door"] = Observation(
        FIX.id, "pr38935_prefill_door", "mutated", {}, "error", error="Traceback\nAttributeError: no attribute 'x'"
    )
    result = judge_mutation(FIX, m, "0.5.21", obs)
    assert result.outcome == "error" and "pr38935_prefill_door: AttributeError: no attribute 'x'" in result.reason


def test_coverage_counts_the_hunks_with_a_causal_mutation_and_leaves_a_headless_fix_out() -> None:
    results = [judge_mutation(FIX, m, "0.5.21", observed(FIX, m.hunks)) for m in FIX.mutations if m.hunks]
    coverage = hunk_coverage([FIX], {FIX.id: object()}, results)
    assert coverage_ratio(coverage) == (len(FIX.hunks), len(FIX.hunks)) and selfcheck_passed(results, coverage)
    missing = [r for r in results if r.mutation != "drop-prefill-door-guard"]
    partial = hunk_coverage([FIX], {FIX.id: object()}, missing)
    assert "prefill-door" in partial[0].uncovered and not selfcheck_passed(missing, partial)
    headless = hunk_coverage([FIX], {}, [])
    assert coverage_ratio(headless) == (0, 0) and not headless[0].counted


def test_a_fix_older_than_every_pin_without_probes_is_left_out_of_coverage_and_said_why(tmp_path: Path) -> None:
    """No base to show the bug and no probe to flip: nothing to revert, and not counted as uncovered."""
    import dataclasses

    from difflab.matrix.model import SidePin

    older = dataclasses.replace(FIX, id="old", base=SidePin(unavailable="0.5.19 carries it"), probes=(), mutations=())
    results = [judge_mutation(FIX, m, "0.5.21", observed(FIX, m.hunks)) for m in FIX.mutations if m.hunks]
    coverage = hunk_coverage([FIX, older], {FIX.id: object(), "old": object()}, results)
    assert [c.counted for c in coverage] == [True, False]
    assert coverage[1].note == "base unavailable and no probe: not counted"
    assert coverage_ratio(coverage) == (len(FIX.hunks), len(FIX.hunks)) and selfcheck_passed(results, coverage)
    probed = dataclasses.replace(FIX, base=SidePin(unavailable="0.5.19 carries it"))
    assert hunk_coverage([probed], {FIX.id: object()}, results)[0].counted  # a probe to flip: counted
    write_selfcheck(tmp_path, results, coverage)  # its coverage case is skipped with the reason, not passed
    cases = {c.classname: c for c in next(iter(JUnitXml.fromfile(str(tmp_path / "selfcheck-junit.xml"))))}
    assert cases["selfcheck.old"].is_skipped and "no probe" in cases["selfcheck.old"].result[0].message
    assert cases[f"selfcheck.{FIX.id}"].is_passed


def test_the_selfcheck_files_say_what_was_judged(tmp_path: Path) -> None:
    good = [judge_mutation(FIX, m, "0.5.21", observed(FIX, m.hunks)) for m in FIX.mutations if m.hunks]
    m = mutation("drop-prefill-door-guard")
    spec = next(s for s in FIX.probes if s.name == "pr38935_prefill_door")
    bad = judge_mutation(
        FIX,
        m,
        "0.5.21",
        observed(FIX, m.hunks, {spec.name: {"rejected.enqueued": spec.expect["rejected.enqueued"][1]}}),
    )
    results = [*[r for r in good if r.mutation != m.name], bad]
    coverage = hunk_coverage([FIX], {FIX.id: object()}, results)
    write_selfcheck(tmp_path, results, coverage)
    doc = json.loads((tmp_path / "selfcheck.json").read_text())
    assert doc["schema"] == 1 and doc["passed"] is False
    assert [x["outcome"] for x in doc["mutations"]] == [r.outcome for r in results]
    assert (
        doc["hunk_coverage"]["hunks"] == len(FIX.hunks)
        and "prefill-door" in doc["hunk_coverage"]["fixes"][0]["uncovered"]
    )
    suite = next(iter(JUnitXml.fromfile(str(tmp_path / "selfcheck-junit.xml"))))
    assert (suite.tests, suite.failures) == (len(results) + 1, 2)  # the insensitive mutation and the coverage case
    text = (tmp_path / "selfcheck.md").read_text()
    assert f"| {FIX.id} | `{m.name}` |" in text and "insensitive" in text
