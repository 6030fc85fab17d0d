"""The verdict table, one rule per test: each verdict, each precedence between two verdicts, declared and
undeclared ``unavailable``, and fixes whose probes disagree. Expected verdicts and reasons are written out."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from difflab.diff.classify import Match, classify, controls_hold, field_side, same
from difflab.diff.verdict import VERDICTS, judge_all, judge_fix, judge_probe
from difflab.matrix.model import Fix, ProbeSpec, SidePin
from difflab.observation import Observation

EXPECT = {"rejected.enqueued": (True, False), "rejected.retired": (0, 1)}
CONTROLS = {"valid.enqueued": True, "valid.retired": 0}
BUG = {"rejected.enqueued": True, "rejected.retired": 0, "valid.enqueued": True, "valid.retired": 0}
FIXED = {"rejected.enqueued": False, "rejected.retired": 1, "valid.enqueued": True, "valid.retired": 0}


def spec(name: str = "p") -> ProbeSpec:
    return ProbeSpec(name=name, expect=dict(EXPECT), controls=dict(CONTROLS))


def make_fix(*names: str, head: SidePin | None = None, base: SidePin | None = None) -> Fix:
    return Fix(
        id="7",
        pr=7,
        title="t",
        part="a",
        base=base or SidePin(release="0.5.20"),
        head=head or SidePin(release="0.5.21"),
        probes=tuple(spec(n) for n in names or ("p",)),
    )


def obs(fields: dict, side: str = "base", probe: str = "p", status: str = "ok", error: str | None = None):
    return Observation(fix="7", probe=probe, side=side, source={}, status=status, fields=dict(fields), error=error)


def gone(side: str = "head", probe: str = "p", why: str = "no release carries it") -> Observation:
    return Observation.unavailable("7", probe, side, why)


def crashed(side: str, probe: str = "p", error: str = "Traceback\nAttributeError: fake lacks x") -> Observation:
    return obs({}, side, probe, status="error", error=error)


# Observations that make one probe reach each verdict on its own (base, head).
CASES: dict[str, tuple[Observation | None, Observation | None]] = {
    "confirmed": (obs(BUG), obs(FIXED, "head")),
    "not-fixed": (obs(BUG), obs(BUG, "head")),
    "not-reproduced": (obs(FIXED), obs(FIXED, "head")),
    "control-drift": (obs(BUG), obs(dict(FIXED, **{"valid.retired": 3}), "head")),
    "unavailable": (obs(BUG), gone()),
    "error": (crashed("base"), obs(FIXED, "head")),
}
REASONS = {
    "confirmed": "base shows the bug, head the fix, controls equal",
    "not-fixed": "head does not show the fix: rejected.enqueued=True (expected False), rejected.retired=0 (expected 1)",
    "not-reproduced": "base does not show the bug: rejected.enqueued=False (expected True), rejected.retired=1 "
    "(expected 0)",
    "control-drift": "control field(s) changed or off their declared value: valid.retired",
    "unavailable": "head unavailable: no release carries it; base shows the bug",
    "error": "base: AttributeError: fake lacks x",
}
# Most severe first: a fix takes the verdict of its worst probe.
PRECEDENCE = ["error", "control-drift", "not-reproduced", "not-fixed", "unavailable", "confirmed"]


def one(verdict: str, name: str) -> tuple[Observation | None, Observation | None]:
    base, head = CASES[verdict]
    return (
        Observation.from_dict(dict(base.to_dict(), probe=name)) if base else None,
        Observation.from_dict(dict(head.to_dict(), probe=name)) if head else None,
    )


def judge(fix: Fix, per_probe: dict[str, tuple[Observation | None, Observation | None]]):
    base = {n: b for n, (b, _) in per_probe.items() if b is not None}
    head = {n: h for n, (_, h) in per_probe.items() if h is not None}
    return judge_fix(fix, base, head, {"label": "0.5.20"}, {"label": "0.5.21"})


def test_the_table_lists_every_verdict() -> None:
    assert VERDICTS == ("confirmed", "not-fixed", "not-reproduced", "control-drift", "unavailable", "error")


@pytest.mark.parametrize("verdict", PRECEDENCE)
def test_each_verdict_with_its_reason(verdict: str) -> None:
    base, head = CASES[verdict]
    probe = judge_probe(spec(), base, head)
    assert (probe.verdict, probe.reason) == (verdict, REASONS[verdict])
    fixed = judge(make_fix("p"), {"p": (base, head)})
    assert fixed.verdict == verdict
    expected_reason = "1 probe(s): base shows the bug, head the fix, controls equal"
    assert fixed.reason == (expected_reason if verdict == "confirmed" else f"p: {REASONS[verdict]}")
    assert fixed.passed is (verdict == "confirmed")


@pytest.mark.parametrize(("worse", "better"), list(itertools.combinations(PRECEDENCE, 2)))
def test_a_fix_takes_its_worst_probe(worse: str, better: str) -> None:
    """Every pair of verdicts, in both probe orders: the more severe one decides, and only it is the reason."""
    for first, second in ((worse, better), (better, worse)):
        names = {first: "first", second: "second"}
        fix = make_fix("first", "second")
        v = judge(fix, {"first": one(first, "first"), "second": one(second, "second")})
        assert v.verdict == worse, (first, second)
        assert v.reason == f"{names[worse]}: {REASONS[worse]}"
        assert [p.verdict for p in v.probes] == [first, second]


def test_probes_that_agree_are_all_named() -> None:
    fix = make_fix("first", "second")
    v = judge(fix, {"first": one("not-fixed", "first"), "second": one("not-fixed", "second")})
    assert v.reason == f"first: {REASONS['not-fixed']}; second: {REASONS['not-fixed']}"
    v = judge(fix, {"first": one("confirmed", "first"), "second": one("confirmed", "second")})
    assert (v.verdict, v.reason) == ("confirmed", "2 probe(s): base shows the bug, head the fix, controls equal")


# -- precedence inside one probe ---------------------------------------------------------------------


def test_base_error_beats_an_unavailable_head() -> None:
    p = judge_probe(spec(), crashed("base"), gone())
    assert (p.verdict, p.reason) == ("error", "base: AttributeError: fake lacks x")
    assert (p.base_match, p.head_match) == ("error", "error")


def test_unavailable_head_says_whether_the_base_shows_the_bug() -> None:
    mixed = dict(BUG, **{"rejected.retired": 1})
    p = judge_probe(spec(), obs(mixed), gone())
    assert (p.verdict, p.reason) == (
        "unavailable",
        "head unavailable: no release carries it; base does not show the bug (mixed)",
    )
    assert (p.base_match, p.head_match) == ("mixed", "error")


def test_unavailable_head_beats_a_drifted_base_control() -> None:
    p = judge_probe(spec(), obs(dict(BUG, **{"valid.enqueued": False})), gone())
    assert p.verdict == "unavailable"


def test_head_error_beats_control_drift() -> None:
    p = judge_probe(spec(), obs(dict(BUG, **{"valid.enqueued": False})), crashed("head"))
    assert (p.verdict, p.reason) == ("error", "head: AttributeError: fake lacks x")


def test_control_drift_beats_not_fixed() -> None:
    p = judge_probe(spec(), obs(BUG), obs(dict(BUG, **{"valid.retired": 3}), "head"))
    assert (p.verdict, p.reason) == ("control-drift", REASONS["control-drift"])


def test_control_drift_beats_not_reproduced() -> None:
    p = judge_probe(spec(), obs(dict(FIXED, **{"valid.enqueued": False})), obs(FIXED, "head"))
    assert (p.verdict, p.reason) == (
        "control-drift",
        "control field(s) changed or off their declared value: valid.enqueued",
    )


def test_control_drift_on_the_base_alone_counts() -> None:
    p = judge_probe(spec(), obs(dict(BUG, **{"valid.retired": 2})), obs(FIXED, "head"))
    assert (p.verdict, p.reason) == ("control-drift", REASONS["control-drift"])


def test_control_drift_names_every_drifted_field_of_both_sides_once() -> None:
    base = obs(dict(BUG, **{"valid.retired": 2}))
    head = obs({k: v for k, v in FIXED.items() if k != "valid.enqueued"} | {"valid.retired": 2}, "head")
    p = judge_probe(spec(), base, head)
    assert p.reason == "control field(s) changed or off their declared value: valid.enqueued, valid.retired"


def test_not_reproduced_is_checked_before_not_fixed() -> None:
    """A base that does not show the bug says nothing about the head: the probe does not discriminate."""
    p = judge_probe(spec(), obs(dict(BUG, **{"rejected.retired": 1})), obs(BUG, "head"))
    assert (p.verdict, p.reason) == ("not-reproduced", "base does not show the bug: rejected.retired=1 (expected 0)")


def test_half_fixed_head_is_not_fixed_naming_only_the_unfixed_field() -> None:
    p = judge_probe(spec(), obs(BUG), obs(dict(FIXED, **{"rejected.retired": 0}), "head"))
    assert (p.verdict, p.reason) == ("not-fixed", "head does not show the fix: rejected.retired=0 (expected 1)")
    assert (p.base_match, p.head_match) == ("base", "mixed")


def test_a_value_matching_neither_side() -> None:
    p = judge_probe(spec(), obs(dict(BUG, **{"rejected.retired": 7})), obs(FIXED, "head"))
    assert (p.verdict, p.reason) == ("not-reproduced", "base does not show the bug: rejected.retired=7 (expected 0)")
    p = judge_probe(spec(), obs(BUG), obs(dict(FIXED, **{"rejected.retired": 7}), "head"))
    assert (p.verdict, p.reason) == ("not-fixed", "head does not show the fix: rejected.retired=7 (expected 1)")
    assert p.head_match == "other"


# -- what makes an observation untrustworthy -----------------------------------------------------------


@pytest.mark.parametrize("side", ["base", "head"])
def test_an_error_observation_that_still_carries_fields_is_an_error(side: str) -> None:
    fields = BUG if side == "base" else FIXED
    bad = obs(fields, side, status="error", error="RuntimeError: swallowed by transfer_worker")
    base, head = (bad, obs(FIXED, "head")) if side == "base" else (obs(BUG), bad)
    p = judge_probe(spec(), base, head)
    assert (p.verdict, p.reason) == ("error", f"{side}: RuntimeError: swallowed by transfer_worker")
    assert classify(bad, spec()) is Match.ERROR
    assert controls_hold(bad, spec()) == ["valid.enqueued", "valid.retired"]


def test_missing_observation_on_either_side() -> None:
    assert judge_probe(spec(), None, obs(FIXED, "head")).reason == "base: no observation"
    assert judge_probe(spec(), obs(BUG), None).reason == "head: no observation"


def test_an_ok_observation_missing_an_expected_field() -> None:
    head = obs({k: v for k, v in FIXED.items() if k != "rejected.retired"}, "head")
    p = judge_probe(spec(), obs(BUG), head)
    assert p.verdict == "error"
    assert p.reason.startswith("head: field(s) the matrix declares that p did not return: expect 'rejected.retired'")


def test_a_misspelt_field_is_named_with_the_probes_closest_field() -> None:
    """A name missing on both sides is the matrix's misspelling: an error naming it, never drift or a verdict."""
    typo = ProbeSpec(
        name="p",
        expect={"rejected.enqueud": (True, False)},
        controls={"valid.enqueued": True, "valid.retried": 0},
    )
    bug = {"rejected.enqueued": True, "valid.enqueued": True, "valid.retired": 0}
    p = judge_probe(typo, obs(bug), obs({**bug, "rejected.enqueued": False}, "head"))
    assert p.verdict == "error"
    assert "expect 'rejected.enqueud' (closest: 'rejected.enqueued')" in p.reason
    typo = ProbeSpec(name="p", expect={"rejected.enqueued": (True, False)}, controls={"valid.retried": 0})
    p = judge_probe(typo, obs(bug), obs({**bug, "rejected.enqueued": False}, "head"))
    assert (p.verdict, p.reason) == (
        "error",
        "field(s) the matrix declares that p did not return: control 'valid.retried' (closest: 'valid.retired')",
    )


def test_error_without_a_message() -> None:
    assert judge_probe(spec(), crashed("base", error=None), None).reason == "base: unknown error"
    assert judge_probe(spec(), crashed("base", error="  \n "), None).reason == "base: unknown error"


def test_an_unavailable_base_is_unavailable_and_says_what_the_head_shows() -> None:
    """A fix older than every pin: no base to show the bug; the head is still judged, and said."""
    why = "0.5.19 already carries it"
    p = judge_probe(spec(), gone("base", why=why), obs(FIXED, "head"))
    assert (p.verdict, p.reason) == ("unavailable", f"base unavailable: {why}; head shows the fix")
    p = judge_probe(spec(), gone("base", why=why), obs(BUG, "head"))
    assert (p.verdict, p.reason) == ("unavailable", f"base unavailable: {why}; head does not show the fix (base)")
    p = judge_probe(spec(), gone("base", why=why), crashed("head"))
    assert p.verdict == "error" and p.reason.startswith("head: "), p.reason


def test_a_declared_unavailable_base_passes_and_one_without_probes_says_so() -> None:
    older = SidePin(unavailable="0.5.19 already carries it")
    v = judge(make_fix("p", base=older), {"p": (gone("base", why=older.unavailable), obs(FIXED, "head"))})
    assert (v.verdict, v.expected_unavailable, v.passed) == ("unavailable", True, True)
    bare = judge(dataclasses.replace(make_fix(base=older), probes=()), {})
    assert (bare.verdict, bare.passed) == ("unavailable", True)
    assert bare.reason == "base unavailable: 0.5.19 already carries it; no probe judges it by behaviour"
    assert judge(dataclasses.replace(make_fix(), probes=()), {}).verdict == "error"  # an available base needs one


def test_head_status_other_than_unavailable_is_not_unavailable() -> None:
    p = judge_probe(spec(), obs(BUG), obs(FIXED, "head", status="n/a", error="skipped"))
    assert (p.verdict, p.reason) == ("error", "head: skipped")


# -- declared and undeclared unavailable -----------------------------------------------------------------


def test_declared_unavailable_head_passes() -> None:
    fix = make_fix("p", head=SidePin(unavailable="no release carries it"))
    v = judge(fix, {"p": CASES["unavailable"]})
    assert (v.verdict, v.expected_unavailable, v.passed) == ("unavailable", True, True)


def test_undeclared_unavailable_fails() -> None:
    """The matrix pins a release for the head, yet its observation says unavailable: not a pass."""
    v = judge(make_fix("p"), {"p": CASES["unavailable"]})
    assert (v.verdict, v.expected_unavailable, v.passed) == ("unavailable", False, False)


def test_a_declared_unavailable_side_does_not_excuse_other_verdicts() -> None:
    fix = make_fix("p", head=SidePin(unavailable="no release carries it"))
    for verdict in ("error", "not-fixed", "control-drift", "not-reproduced"):
        assert judge(fix, {"p": CASES[verdict]}).passed is False, verdict
    assert judge(fix, {"p": CASES["confirmed"]}).passed is True


# -- field results: both sides against the declaration ----------------------------------------------------


def fields_of(base: Observation | None, head: Observation | None) -> dict[str, tuple]:
    return {
        f.field: (f.kind, f.base, f.head, f.declared_base, f.declared_head, f.ok)
        for f in judge_probe(spec(), base, head).fields
    }


def test_field_results_of_a_confirmed_probe() -> None:
    assert fields_of(obs(BUG), obs(FIXED, "head")) == {
        "rejected.enqueued": ("expect", True, False, True, False, True),
        "rejected.retired": ("expect", 0, 1, 0, 1, True),
        "valid.enqueued": ("control", True, True, True, True, True),
        "valid.retired": ("control", 0, 0, 0, 0, True),
    }


def test_an_expect_field_is_judged_on_the_base_too() -> None:
    got = fields_of(obs(dict(BUG, **{"rejected.retired": 1})), obs(FIXED, "head"))
    assert got["rejected.retired"] == ("expect", 1, 1, 0, 1, False)
    assert got["rejected.enqueued"][-1] is True


def test_an_expect_field_is_judged_on_the_head() -> None:
    got = fields_of(obs(BUG), obs(dict(FIXED, **{"rejected.enqueued": True}), "head"))
    assert got["rejected.enqueued"] == ("expect", True, True, True, False, False)


def test_a_control_must_hold_on_both_sides() -> None:
    head_off = fields_of(obs(BUG), obs(dict(FIXED, **{"valid.retired": 3}), "head"))
    base_off = fields_of(obs(dict(BUG, **{"valid.retired": 3})), obs(FIXED, "head"))
    assert head_off["valid.retired"] == ("control", 0, 3, 0, 0, False)
    assert base_off["valid.retired"] == ("control", 3, 0, 0, 0, False)


def test_an_unavailable_head_leaves_only_the_base_to_judge_fields() -> None:
    got = fields_of(obs(BUG), gone())
    assert got == {
        "rejected.enqueued": ("expect", True, None, True, False, True),
        "rejected.retired": ("expect", 0, None, 0, 1, True),
        "valid.enqueued": ("control", True, None, True, True, True),
        "valid.retired": ("control", 0, None, 0, 0, True),
    }
    assert fields_of(obs(dict(BUG, **{"valid.retired": 1})), gone())["valid.retired"][-1] is False
    assert fields_of(obs(BUG), None)["rejected.retired"][-1] is True


def test_an_unavailable_base_leaves_only_the_head_to_judge_fields() -> None:
    """A fix older than every pin: no base value to hold against the declaration, so the head alone decides."""
    got = fields_of(gone("base", why="0.5.19 already carries it"), obs(FIXED, "head"))
    assert got == {
        "rejected.enqueued": ("expect", None, False, True, False, True),
        "rejected.retired": ("expect", None, 1, 0, 1, True),
        "valid.enqueued": ("control", None, True, True, True, True),
        "valid.retired": ("control", None, 0, 0, 0, True),
    }
    assert fields_of(gone("base"), obs(BUG, "head"))["rejected.enqueued"][-1] is False
    assert fields_of(gone("base"), obs(dict(FIXED, **{"valid.retired": 1}), "head"))["valid.retired"][-1] is False


def test_the_fields_of_an_error_observation_are_not_read() -> None:
    bad = obs(FIXED, "head", status="error", error="boom")
    assert fields_of(obs(BUG), bad)["rejected.enqueued"] == ("expect", True, None, True, False, True)
    assert fields_of(obs(BUG, status="error", error="boom"), obs(FIXED, "head"))["rejected.enqueued"] == (
        "expect",
        None,
        False,
        True,
        False,
        False,
    )


# -- classification of one observation ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({}, Match.BASE),
        ({"rejected.enqueued": False, "rejected.retired": 1}, Match.HEAD),
        ({"rejected.retired": 1}, Match.MIXED),
        ({"rejected.retired": 7}, Match.OTHER),
        ({"rejected.enqueued": False, "rejected.retired": 7}, Match.OTHER),
        ({"rejected.enqueued": "yes", "rejected.retired": 1}, Match.OTHER),
        ({"rejected.retired": True}, Match.OTHER),  # strict JSON equality: True is not 1
        ({"rejected.retired": 0.0}, Match.OTHER),
    ],
)
def test_classify(changes: dict, match: Match) -> None:
    assert classify(obs(dict(BUG, **changes)), spec()) is match


def test_classify_untrustworthy() -> None:
    assert classify(None, spec()) is Match.ERROR
    assert classify(obs({"rejected.enqueued": True}), spec()) is Match.ERROR
    assert classify(gone(), spec()) is Match.ERROR


def test_controls_hold_lists_missing_and_off_fields_in_matrix_order() -> None:
    assert controls_hold(obs(BUG), spec()) == []
    assert controls_hold(obs({"valid.retired": 1}), spec()) == ["valid.enqueued", "valid.retired"]
    assert controls_hold(obs({"valid.enqueued": 1, "valid.retired": 0}), spec()) == ["valid.enqueued"]
    assert controls_hold(None, spec()) == ["valid.enqueued", "valid.retired"]


def test_field_side() -> None:
    assert [field_side(v, (0, 1)) for v in (0, 1, 2, False)] == ["base", "head", "other", "other"]


# -- many fixes from one flat list of observations (a run, or merged CI cells) ------------------------------


def test_judge_all_groups_observations_by_fix_side_and_probe() -> None:
    fix = make_fix("p")
    other = Fix(id="8", pr=8, title="u", base=SidePin(release="a"), head=SidePin(release="b"), probes=(spec("q"),))
    flat = [
        obs(BUG),
        obs(FIXED, "head"),
        Observation(fix="8", probe="q", side="base", source={}, status="ok", fields=dict(FIXED)),
        Observation(fix="8", probe="q", side="head", source={}, status="ok", fields=dict(FIXED)),
        Observation(fix="7", probe="unlisted", side="base", source={}, status="error", error="ignored"),
    ]
    labels = {("7", "base"): {"label": "0.5.20"}, ("7", "head"): {"label": "0.5.21"}}
    first, second = judge_all([fix, other], flat, labels)
    assert (first.id, first.verdict, first.base, first.head) == (
        "7",
        "confirmed",
        {"label": "0.5.20"},
        {"label": "0.5.21"},
    )
    assert [p.probe for p in first.probes] == ["p"]
    assert (second.id, second.verdict, second.base, second.head) == (
        "8",
        "not-reproduced",
        {"label": "missing"},
        {"label": "missing"},
    )


def test_judge_all_reports_a_fix_with_no_observation_as_an_error() -> None:
    (v,) = judge_all([make_fix("p", "q")], [], {})
    assert (v.verdict, v.passed) == ("error", False)
    assert v.reason == "no observation of this fix on either side (base and head missing)"
    assert [(p.probe, p.verdict, p.reason) for p in v.probes] == [
        ("p", "error", "base: no observation"),
        ("q", "error", "base: no observation"),
    ]


def test_judge_all_one_side_missing() -> None:
    (v,) = judge_all([make_fix("p")], [obs(BUG)], {})
    assert (v.verdict, v.reason) == ("error", "p: head: no observation")


def test_no_probes_declared() -> None:
    fix = Fix(id="7", pr=7, title="t", base=SidePin(release="a"), head=SidePin(release="b"), probes=())
    v = judge_fix(fix, {}, {}, {}, {})
    assert (v.verdict, v.reason, v.probes) == ("error", "no probes declared for this fix in the matrix yet", [])


# -- what diff.json records ---------------------------------------------------------------------------------


def test_fix_verdict_record() -> None:
    base, head = CASES["confirmed"]
    doc = judge(make_fix("p"), {"p": (base, head)}).to_dict()
    assert {k: v for k, v in doc.items() if k != "probes"} == {
        "fix": 7,
        "id": "7",
        "part": "a",
        "title": "t",
        "verdict": "confirmed",
        "reason": "1 probe(s): base shows the bug, head the fix, controls equal",
        "passed": True,
        "expected_unavailable": False,
        "base": {"label": "0.5.20"},
        "head": {"label": "0.5.21"},
    }
    (probe,) = doc["probes"]
    assert probe["probe"] == "p" and probe["verdict"] == "confirmed"
    assert (probe["base_match"], probe["head_match"]) == ("base", "head")
    assert probe["base"] == base.to_dict() and probe["head"] == head.to_dict()
    assert probe["fields"][0] == {
        "field": "rejected.enqueued",
        "kind": "expect",
        "base": True,
        "head": False,
        "declared_base": True,
        "declared_head": False,
        "ok": True,
    }


def test_the_record_carries_what_sglangs_own_tests_said_only_when_they_were_replayed() -> None:
    base, head = CASES["confirmed"]
    verdict = judge(make_fix("p"), {"p": (base, head)})
    assert "upstream_tests" not in verdict.to_dict()
    said = {"text": "probe: confirmed; SGLang's tests: 1 fixed — they agree", "agree": True}
    verdict.upstream_tests = said
    assert verdict.to_dict()["upstream_tests"] == {
        "text": "probe: confirmed; SGLang's tests: 1 fixed — they agree",
        "agree": True,
    }


def test_probe_record_without_observations() -> None:
    doc = judge_probe(spec(), None, None).to_dict()
    assert (doc["base"], doc["head"], doc["verdict"]) == (None, None, "error")


def test_expected_unavailable_is_recorded_for_either_side() -> None:
    assert judge(make_fix("p", head=SidePin(unavailable="x")), {"p": CASES["confirmed"]}).expected_unavailable
    assert judge(make_fix("p", base=SidePin(unavailable="x")), {"p": CASES["confirmed"]}).expected_unavailable
    assert not judge(make_fix("p"), {"p": CASES["confirmed"]}).expected_unavailable


def test_same_is_strict_json_equality_whatever_the_key_order() -> None:
    assert same({"a": 1, "b": [2, {"c": 3, "d": 4}]}, {"b": [2, {"d": 4, "c": 3}], "a": 1})
    assert same({"b": 1, "a": 2}, {"b": 1, "a": 2}) and same({"b": 1, "a": 2}, {"a": 2, "b": 1})
    assert not same({"a": 1}, {"a": True}) and not same([1, 2], [2, 1]) and not same("é", "e")


# -- transport back ends ----------------------------------------------------------------------
def _per_backend(fields: dict, *backends: str) -> dict:
    return {f"{b}:{k}": v for b in backends for k, v in fields.items()}


def backend_spec() -> ProbeSpec:
    backends = ("mooncake", "mori")
    return ProbeSpec(
        name="p",
        expect={f"{b}:{k}": v for b in backends for k, v in EXPECT.items()},
        controls={f"{b}:{k}": v for b in backends for k, v in CONTROLS.items()},
        backends=backends,
    )


def test_a_back_end_without_the_machinery_on_one_side_is_left_out_and_named() -> None:
    base = obs(_per_backend(BUG, "mooncake") | {"mori:not-applicable": "no drain ack"}, "base")
    head = obs(_per_backend(FIXED, "mooncake", "mori"), "head")
    diff = judge_probe(backend_spec(), base, head)
    assert diff.verdict == "confirmed"
    assert diff.reason.endswith("; not applicable: mori on base (no drain ack)")
    assert diff.backends == ["mooncake"]
    broken = obs(_per_backend(BUG, "mooncake") | _per_backend(BUG, "mori"), "head")
    assert judge_probe(backend_spec(), base, broken).verdict == "not-fixed"  # mooncake's head shows the bug
    nothing = obs({"mooncake:not-applicable": "x", "mori:not-applicable": "y"}, "base")
    assert judge_probe(backend_spec(), nothing, head).verdict == "error"


def test_a_matrix_written_before_back_ends_judges_the_default_back_end() -> None:
    """An older matrix (a bundle's) names plain fields; the probe now reports them per back end."""
    base = obs(_per_backend(BUG, "mooncake") | _per_backend(FIXED, "nixl"), "base")
    head = obs(_per_backend(FIXED, "mooncake") | _per_backend(BUG, "nixl"), "head")
    assert judge_probe(spec(), base, head).verdict == "confirmed"  # mooncake, the server's default


def test_fields_the_probe_returns_and_the_matrix_ignores_are_listed_not_judged() -> None:
    from difflab.report.markdown import render_summary

    extra = {"rejected.sent": 1, "mori:not-applicable": "no Mori back end"}
    p = judge_probe(spec(), obs(BUG | extra), obs(FIXED | {"late.acks": 0}, "head"))
    assert p.verdict == "confirmed"  # evidence nobody judges changes no verdict
    assert p.undeclared == ["late.acks", "rejected.sent"]  # a back end's not-applicable marker is not evidence
    assert p.to_dict()["undeclared"] == ["late.acks", "rejected.sent"]
    v = judge_fix(make_fix(), {"p": obs(BUG | extra)}, {"p": obs(FIXED, "head")}, {}, {})
    text = render_summary([v])
    assert "- observed, declared in no expect or control: `rejected.sent`\n\n| field |" in text
    assert not judge_probe(spec(), obs(BUG), obs(FIXED, "head")).undeclared
