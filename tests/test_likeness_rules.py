"""Backport verdicts (present / absent / partial / error), per probe and per code path, on the real matrix.

The fork observations are built from the default matrix's own declarations: each expect field gets its
declared base or head value as the case needs, every control its declared value. Expected verdicts, paths
and reasons are written out.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from difflab.diff.likeness import (
    VERDICTS,
    BackportVerdict,
    FieldCheck,
    PathCheck,
    ProbeComparison,
    _judge_paths,
    _path_checks,
    compare_probe,
    forced_notes,
    judge_backport,
)
from difflab.matrix import load_matrix
from difflab.matrix.model import Fix, Hunk, ProbeSpec, SidePin
from difflab.observation import Observation

ROOT = Path(__file__).resolve().parents[1]
MATRIX = load_matrix(ROOT / "tests" / "fixtures" / "machinery" / "upstream.toml")  # the judging rules' own fixes
DOOR = MATRIX.fix("38935")  # two probes, seven paths; retire-session and retire-group sit behind the prefill door
PREFILL, DECODE = "pr38935_prefill_door", "pr38935_decode_door"
WHERE = {
    "prefill-door": "sglang/srt/disaggregation/prefill.py: PrefillBootstrapQueue.add",
    "decode-door": "sglang/srt/disaggregation/decode.py: DecodePreallocQueue.add",
    "unadmitted-predicate": "sglang/srt/disaggregation/utils.py: is_unadmitted_reject",
    "retire-session": "sglang/srt/managers/scheduler.py: Scheduler.retire_unadmitted_request",
    "retire-group": "sglang/srt/managers/scheduler.py: Scheduler.retire_unadmitted_request",
    "retire-cache-finish": "sglang/srt/managers/scheduler.py: Scheduler.retire_unadmitted_request",
    "retire-finish-state": "sglang/srt/managers/scheduler.py: Scheduler.retire_unadmitted_request",
}
EXPLAINED = " (its other fields are explained by a path like the base)"
PATHS = list(WHERE)


def fork(fix: Fix, side_of: Callable[[str, str], str], **overrides: dict) -> dict[str, Observation]:
    """Observations of every probe of ``fix``: ``side_of(probe, field)`` picks the declared base or head value."""
    out = {}
    for spec in fix.probes:
        fields = dict(spec.controls)
        for name, (base, head) in spec.expect.items():
            fields[name] = base if side_of(spec.name, name) == "base" else head
        fields.update(overrides.get(spec.name, {}))
        out[spec.name] = Observation(fix=fix.id, probe=spec.name, side="fork", source={}, status="ok", fields=fields)
    return out


def head_everywhere(_probe: str, _field: str) -> str:
    return "head"


def base_everywhere(_probe: str, _field: str) -> str:
    return "base"


def paths_of(verdict: BackportVerdict) -> list[tuple[str, str, str]]:
    return [(p.hunk, p.like, p.where) for p in verdict.paths]


def test_the_backport_verdicts() -> None:
    assert VERDICTS == ("present", "absent", "partial", "not-applicable", "not-judged", "error")


def test_a_fix_older_than_every_pin_without_probes_is_not_judged_and_does_not_fail_the_fork() -> None:
    """Base unavailable (the oldest pin carries it) and no probe: the fork is not judged on it, and told why."""
    import dataclasses

    from difflab.report.backport import _cases

    older = dataclasses.replace(DOOR, base=SidePin(unavailable="0.5.19 already carries it"), probes=(), hunks=())
    v = judge_backport(older, {})
    assert (v.verdict, v.passed) == ("not-judged", True)
    assert v.reason == "no probe judges it; base unavailable (0.5.19 already carries it)"
    (case,) = _cases([v])
    assert (case.outcome, case.message) == ("skipped", v.reason)
    bare = judge_backport(dataclasses.replace(DOOR, probes=(), hunks=()), {})
    assert (bare.verdict, bare.passed) == ("error", False)  # an available base still needs a probe


def test_every_path_like_head_is_present() -> None:
    v = judge_backport(DOOR, fork(DOOR, head_everywhere))
    assert (v.verdict, v.passed) == ("present", True)
    assert v.reason == "every path the fix changes behaves like its head (7: " + ", ".join(PATHS) + "); controls hold"
    assert paths_of(v) == [(h, "head", WHERE[h]) for h in PATHS]
    assert [p.like for p in v.probes] == ["head", "head"]


def test_every_path_like_base_is_absent() -> None:
    v = judge_backport(DOOR, fork(DOOR, base_everywhere))
    assert (v.verdict, v.passed) == ("absent", False)
    assert v.reason == "every path the fix changes behaves like its base, the bug (7: " + ", ".join(PATHS) + ")"
    assert paths_of(v) == [(h, "base", WHERE[h]) for h in PATHS]


def test_a_fork_without_the_decode_door_is_partial_and_says_which_path() -> None:
    v = judge_backport(DOOR, fork(DOOR, lambda probe, _f: "base" if probe == DECODE else "head"))
    assert v.verdict == "partial"
    assert paths_of(v) == [
        ("prefill-door", "head", WHERE["prefill-door"]),
        ("decode-door", "base", WHERE["decode-door"]),
        # its decode fields are the decode door's: judged by its prefill fields, which are head-like
        ("unadmitted-predicate", "head", WHERE["unadmitted-predicate"] + EXPLAINED),
        ("retire-session", "head", WHERE["retire-session"]),
        ("retire-group", "head", WHERE["retire-group"]),
        ("retire-cache-finish", "head", WHERE["retire-cache-finish"] + EXPLAINED),
        ("retire-finish-state", "head", WHERE["retire-finish-state"] + EXPLAINED),
    ]
    assert v.reason == (
        "like head: "
        f"prefill-door ({WHERE['prefill-door']}), "
        f"unadmitted-predicate ({WHERE['unadmitted-predicate']}{EXPLAINED}), "
        f"retire-session ({WHERE['retire-session']}), "
        f"retire-group ({WHERE['retire-group']}), "
        f"retire-cache-finish ({WHERE['retire-cache-finish']}{EXPLAINED}), "
        f"retire-finish-state ({WHERE['retire-finish-state']}{EXPLAINED}); "
        f"like base: decode-door ({WHERE['decode-door']})"
    )
    assert v.to_dict()["head_like"] == [PREFILL] and v.to_dict()["base_like"] == [DECODE]


def test_a_fork_that_skipped_the_beam_group_retirement() -> None:
    group = {"rejected_group.group_retired", "rejected_group.live_groups"}
    v = judge_backport(DOOR, fork(DOOR, lambda _p, f: "base" if f in group else "head"))
    assert v.verdict == "partial"
    likes = {hunk: like for hunk, like, _ in paths_of(v)}
    assert likes == {
        "prefill-door": "head",
        "decode-door": "head",
        "unadmitted-predicate": "head",
        "retire-session": "head",
        "retire-group": "base",
        "retire-cache-finish": "head",
        "retire-finish-state": "head",
    }
    assert v.reason.endswith(f"; like base: retire-group ({WHERE['retire-group']})")
    assert f"prefill-door ({WHERE['prefill-door']}{EXPLAINED})" in v.reason
    assert [p.like for p in v.probes] == ["mixed", "head"]


def test_a_path_mixed_within_itself() -> None:
    """One field of the prefill door reverted: no path is wholly base-like, so nothing explains it."""
    v = judge_backport(DOOR, fork(DOOR, lambda p, f: "base" if (p, f) == (PREFILL, "rejected.enqueued") else "head"))
    assert v.verdict == "partial"
    likes = {hunk: like for hunk, like, _ in paths_of(v)}
    assert likes["prefill-door"] == likes["unadmitted-predicate"] == "mixed"
    assert {h for h, like in likes.items() if like == "head"} == set(PATHS) - {"prefill-door", "unadmitted-predicate"}
    assert v.reason == (
        f"like head: decode-door ({WHERE['decode-door']}), retire-session ({WHERE['retire-session']}), "
        f"retire-group ({WHERE['retire-group']}), retire-cache-finish ({WHERE['retire-cache-finish']}), "
        f"retire-finish-state ({WHERE['retire-finish-state']}); "
        f"mixed within the path: prefill-door ({WHERE['prefill-door']}), "
        f"unadmitted-predicate ({WHERE['unadmitted-predicate']})"
    )


def test_a_mixed_path_with_a_base_field_no_other_path_explains_stays_mixed() -> None:
    """The session fields are base (retire-session wholly base) and so is rejected.enqueued, which only the
    door paths observe: the door is still mixed."""
    session = {"rejected_session.session_busy", "rejected_session.session_detached", "rejected.enqueued"}
    v = judge_backport(DOOR, fork(DOOR, lambda _p, f: "base" if f in session else "head"))
    likes = {hunk: like for hunk, like, _ in paths_of(v)}
    assert likes["retire-session"] == "base"
    assert likes["prefill-door"] == likes["unadmitted-predicate"] == "mixed"
    assert v.verdict == "partial" and "like base: retire-session" in v.reason


# -- untrustworthy observations: error, never a verdict --------------------------------------------------


def test_a_field_matching_neither_side_is_an_error() -> None:
    v = judge_backport(DOOR, fork(DOOR, head_everywhere, **{PREFILL: {"rejected.enqueued": "maybe"}}))
    assert (v.verdict, v.paths) == ("error", [])
    assert v.reason == f"{PREFILL}: matches neither side: rejected.enqueued='maybe'"


def test_a_missing_expect_field_on_the_fork_is_an_error() -> None:
    seen = fork(DOOR, head_everywhere)
    del seen[DECODE].fields["rejected.pending"]
    v = judge_backport(DOOR, seen)
    assert (v.verdict, v.reason) == (
        "error",
        f"{DECODE}: probe error: field(s) the matrix declares that {DECODE} did not return: "
        "expect 'rejected.pending' (closest: 'rejected.retired')",
    )
    checks = {c.field: c.like for c in v.probes[1].fields}
    assert checks["rejected.pending"] == "missing" and checks["rejected.retired"] == "head"


def test_a_missing_control_field_on_the_fork_is_drift() -> None:
    seen = fork(DOOR, head_everywhere)
    del seen[DECODE].fields["valid.pending"]
    v = judge_backport(DOOR, seen)
    assert (v.verdict, v.reason) == ("error", f"{DECODE}: control field(s) off their declared value: valid.pending")
    assert v.probes[1].like == "control-drift"
    assert {c.field: c.like for c in v.probes[1].fields if c.kind == "control"}["valid.pending"] == "missing"


def test_a_control_off_its_value_is_drift_even_when_every_path_looks_fixed() -> None:
    v = judge_backport(DOOR, fork(DOOR, head_everywhere, **{PREFILL: {"valid.enqueued": False, "valid.retired": True}}))
    assert (v.verdict, v.reason) == (
        "error",
        f"{PREFILL}: control field(s) off their declared value: valid.enqueued, valid.retired",
    )


def test_an_error_observation_that_carries_head_fields_is_an_error() -> None:
    seen = fork(DOOR, head_everywhere)
    seen[PREFILL].status = "error"
    seen[PREFILL].error = "Traceback (most recent call last):\nFakeMissing: prefill fake lacks .bootstrap_room"
    v = judge_backport(DOOR, seen)
    assert (v.verdict, v.reason) == (
        "error",
        f"{PREFILL}: probe error: FakeMissing: prefill fake lacks .bootstrap_room",
    )
    assert {c.like for c in v.probes[0].fields} == {"missing"}  # nothing read from an error observation
    assert all(c.observed is None for c in v.probes[0].fields)


def test_a_probe_with_no_observation_is_an_error() -> None:
    seen = fork(DOOR, head_everywhere)
    del seen[DECODE]
    v = judge_backport(DOOR, seen)
    assert (v.verdict, v.reason) == ("error", f"{DECODE}: probe error: no observation")


def test_every_untrusted_probe_is_named() -> None:
    seen = fork(DOOR, head_everywhere, **{DECODE: {"valid.pending": False}})
    seen[PREFILL].status = "error"
    seen[PREFILL].error = None
    v = judge_backport(DOOR, seen)
    assert v.reason == (
        f"{PREFILL}: probe error: an expected field is missing; "
        f"{DECODE}: control field(s) off their declared value: valid.pending"
    )


def test_no_probes_declared() -> None:
    fix = Fix(id="1", pr=1, title="t", base=SidePin(release="a"), head=SidePin(release="b"), probes=())
    v = judge_backport(fix, {})
    assert (v.verdict, v.reason, v.probes, v.paths) == (
        "error",
        "no probes declared for this fix in the matrix",
        [],
        [],
    )


# -- fixes without hunks: judged per probe ---------------------------------------------------------------

SPECS = (
    ProbeSpec(
        "prefill", {"rejected.enqueued": (True, False), "rejected.retired": (False, True)}, {"valid.enqueued": True}
    ),
    ProbeSpec("decode", {"rejected.pending": (True, False)}, {"valid.pending": True}),
)
PLAIN = Fix(id="9", pr=9, title="plain", part="b", base=SidePin(release="a"), head=SidePin(release="b"), probes=SPECS)


def plain(prefill: str, decode: str, **overrides: dict) -> BackportVerdict:
    sides = {"prefill": prefill, "decode": decode}
    return judge_backport(
        PLAIN,
        fork(
            PLAIN,
            lambda p, f: sides[p] if sides[p] != "mixed" else ("base" if f == "rejected.retired" else "head"),
            **overrides,
        ),
    )


def test_probe_verdicts_without_hunks() -> None:
    assert (plain("head", "head").verdict, plain("head", "head").reason) == (
        "present",
        "all 2 probe(s) behave like the fix's head; controls hold",
    )
    assert (plain("base", "base").verdict, plain("base", "base").reason) == (
        "absent",
        "all 2 probe(s) behave like the fix's base (the bug)",
    )
    assert plain("base", "head").reason == "like head: decode; like base: prefill"
    assert plain("head", "base").reason == "like head: prefill; like base: decode"
    assert plain("mixed", "head").reason == "like head: decode; mixed within the probe: prefill"
    assert plain("mixed", "base").reason == "like base: decode; mixed within the probe: prefill"
    assert plain("mixed", "base").verdict == "partial" and plain("mixed", "base").paths == []


# -- one probe against the fork ----------------------------------------------------------------------------


def observed(fields: dict, status: str = "ok", error: str | None = None) -> Observation:
    return Observation(fix="9", probe="prefill", side="fork", source={}, status=status, fields=fields, error=error)


def test_compare_probe_reasons() -> None:
    spec = SPECS[0]
    head = {"rejected.enqueued": False, "rejected.retired": True, "valid.enqueued": True}
    base = {"rejected.enqueued": True, "rejected.retired": False, "valid.enqueued": True}
    assert (compare_probe(spec, observed(head)).like, compare_probe(spec, observed(head)).reason) == (
        "head",
        "every expected field has its head (fixed) value",
    )
    assert compare_probe(spec, observed(base)).reason == "every expected field has its base (bug) value"
    mixed = compare_probe(spec, observed(dict(head, **{"rejected.retired": False})))
    assert (mixed.like, mixed.reason) == ("mixed", "head-like: rejected.enqueued; base-like: rejected.retired")
    other = compare_probe(spec, observed(dict(head, **{"rejected.retired": 1, "rejected.enqueued": None})))
    assert (other.like, other.reason) == ("other", "matches neither side: rejected.enqueued=None, rejected.retired=1")
    assert compare_probe(spec, None).reason == "probe error: no observation"
    assert compare_probe(spec, observed(head, "error", "a\nb\n")).reason == "probe error: b"


def test_field_checks_record_the_fork_beside_both_declarations() -> None:
    spec = SPECS[0]
    got = compare_probe(spec, observed({"rejected.enqueued": False, "rejected.retired": 3, "valid.enqueued": False}))
    assert [(c.field, c.kind, c.observed, c.declared_base, c.declared_head, c.like) for c in got.fields] == [
        ("rejected.enqueued", "expect", False, True, False, "head"),
        ("rejected.retired", "expect", 3, False, True, "other"),
        ("valid.enqueued", "control", False, True, True, "off"),
    ]
    assert got.like == "control-drift"  # drift is reported before "matches neither side"


def test_probe_comparison_record() -> None:
    obs = observed({"rejected.enqueued": False, "rejected.retired": True, "valid.enqueued": True})
    doc = compare_probe(SPECS[0], obs).to_dict()
    assert doc["probe"] == "prefill" and doc["like"] == "head" and doc["observation"] == obs.to_dict()
    assert doc["fields"][2] == {
        "field": "valid.enqueued",
        "kind": "control",
        "observed": True,
        "declared_base": True,
        "declared_head": True,
        "like": "ok",
    }
    assert compare_probe(SPECS[0], None).to_dict()["observation"] is None


def test_backport_verdict_record() -> None:
    v = plain("base", "head")
    v.evidence = {"ancestor": False}
    v.disagreements = ["the version string claims the fix"]
    doc = v.to_dict()
    assert {k: doc[k] for k in ("fix", "id", "part", "title", "verdict", "reason", "passed")} == {
        "fix": 9,
        "id": "9",
        "part": "b",
        "title": "plain",
        "verdict": "partial",
        "reason": "like head: decode; like base: prefill",
        "passed": False,
    }
    assert (doc["head_like"], doc["base_like"], doc["paths"], doc["forced"]) == (["decode"], ["prefill"], [], [])
    assert (doc["evidence"], doc["disagreements"]) == ({"ancestor": False}, ["the version string claims the fix"])
    assert [p["probe"] for p in doc["probes"]] == ["prefill", "decode"]
    hunked = judge_backport(DOOR, fork(DOOR, head_everywhere)).to_dict()
    assert hunked["paths"][0] == {
        "hunk": "prefill-door",
        "where": WHERE["prefill-door"],
        "like": "head",
        "fields": list(DOOR.hunk("prefill-door").fields[PREFILL]),
        "backend": None,
    }


# -- the path judgment on its own -------------------------------------------------------------------------


def comparison(probe: str, likes: dict[str, str]) -> ProbeComparison:
    return ProbeComparison(probe, "head", "", [FieldCheck(f, "expect", None, 0, 1, like) for f, like in likes.items()])


def hunk(hunk_id: str, fields: dict[str, tuple[str, ...]]) -> Hunk:
    return Hunk(id=hunk_id, file="sglang/x.py", function="f", change="c", fields=fields)


def test_path_checks_name_paths_a_field_of_which_matches_neither_side_or_is_missing() -> None:
    fix = Fix(
        id="1",
        pr=1,
        title="t",
        base=SidePin(release="a"),
        head=SidePin(release="b"),
        probes=(),
        hunks=(
            hunk("odd", {"p": ("a", "b")}),
            hunk("gone", {"p": ("b", "c")}),
            hunk("absent-probe", {"q": ("a",)}),
            hunk("fine", {"p": ("b",)}),
        ),
    )
    paths = _path_checks(fix, [comparison("p", {"a": "other", "b": "head", "c": "missing"})])
    assert [(p.hunk, p.like, p.fields) for p in paths] == [
        ("odd", "other", ["a", "b"]),
        ("gone", "missing", ["b", "c"]),
        ("absent-probe", "missing", ["a"]),
        ("fine", "head", ["b"]),
    ]
    assert paths[0].describe() == "odd (sglang/x.py: f)"
    assert PathCheck("h", "w", "base", []).describe() == "h (w)"


# -- switches a probe forced ----------------------------------------------------------------------------


def forced(*entries: dict) -> dict[str, Observation]:
    obs = observed({})
    obs.forced = list(entries)
    return {"prefill": obs}


ATTR = "prefill_kv_mgr.enable_deferred_decode_kv_release"
ENV = "SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE"


@pytest.mark.parametrize(
    ("entry", "note"),
    [
        (
            {"attribute": ATTR, "value": True, "build_default": False, "from": "server_args.py:12", "env": [ENV]},
            f"deferred decode KV release is off by default in this build (server_args.py:12): "
            f"the fix is inactive unless {ENV}=1",
        ),
        (
            {"attribute": ATTR, "value": True, "build_default": False, "from": "server_args.py:12", "env": []},
            "deferred decode KV release is off by default in this build (server_args.py:12)",
        ),
        (
            {"attribute": ATTR, "value": False, "build_default": True, "from": "server_args.py:12", "env": [ENV]},
            "deferred decode KV release is on by default in this build (server_args.py:12); a scenario forces off",
        ),
        (
            {"attribute": ATTR, "value": 4, "build_default": 2, "env": [ENV]},
            f"deferred decode KV release is 2 by default in this build ({ATTR}); a scenario forces 4",
        ),
        (
            {"attribute": ATTR, "value": True, "build_default": True, "from": "x"},
            f"deferred decode KV release is on by default in this build ({ATTR})",
        ),
        (
            {"attribute": "m.page_size", "value": 16, "build_default": 16, "from": "x"},
            "page size is 16 by default in this build (m.page_size)",
        ),
        (
            {"attribute": "m.old_switch", "value": True, "build_default": None, "from": "the build does not set it"},
            "old switch (m.old_switch) is forced to True by the probe; the build does not set it",
        ),
        ({"value": "x", "build_default": None}, "? (?) is forced to 'x' by the probe; "),
    ],
)
def test_forced_switch_notes(entry: dict, note: str) -> None:
    assert forced_notes(forced(entry)) == [note]


def test_forced_notes_are_said_once_and_reach_the_verdict() -> None:
    entry = {"attribute": ATTR, "value": True, "build_default": True, "from": "x"}
    assert forced_notes(forced(entry, dict(entry))) == [
        f"deferred decode KV release is on by default in this build ({ATTR})"
    ]
    seen = fork(PLAIN, head_everywhere)
    seen["decode"].forced = [entry]
    assert judge_backport(PLAIN, seen).forced == [f"deferred decode KV release is on by default in this build ({ATTR})"]
    assert forced_notes({"a": observed({})}) == []


# -- reasons that list several probes, fields or paths --------------------------------------------------------

MANY = tuple(ProbeSpec(f"p{i}", {"a.x": (0, 1), "a.y": (0, 1)}, {"ok.x": 1}) for i in range(6))
SIX = Fix(id="6", pr=6, title="six", base=SidePin(release="a"), head=SidePin(release="b"), probes=MANY)


def test_partial_reasons_name_every_probe_of_each_kind() -> None:
    kinds = {"p0": "head", "p1": "base", "p2": "mixed", "p3": "head", "p4": "base", "p5": "mixed"}
    v = judge_backport(
        SIX, fork(SIX, lambda p, f: kinds[p] if kinds[p] != "mixed" else ("base" if f == "a.y" else "head"))
    )
    assert (v.verdict, v.reason) == (
        "partial",
        "like head: p0, p3; like base: p1, p4; mixed within the probe: p2, p5",
    )
    assert len(v.probes) == 6 and v.paths == []


def test_present_and_absent_keep_every_probe_comparison() -> None:
    for side_of, verdict in ((head_everywhere, "present"), (base_everywhere, "absent")):
        v = judge_backport(SIX, fork(SIX, side_of))
        assert v.verdict == verdict and [p.probe for p in v.probes] == [f"p{i}" for i in range(6)]
        assert v.paths == []
        v = judge_backport(DOOR, fork(DOOR, side_of))
        assert v.verdict == verdict and [p.probe for p in v.probes] == [PREFILL, DECODE] and len(v.paths) == 7


def test_a_mixed_probe_names_every_field_of_each_side() -> None:
    spec = ProbeSpec("p", {"a.w": (0, 1), "a.x": (0, 1), "a.y": (0, 1), "a.z": (0, 1)}, {})
    obs = Observation(
        fix="1", probe="p", side="fork", source={}, status="ok", fields={"a.w": 1, "a.x": 0, "a.y": 1, "a.z": 0}
    )
    assert compare_probe(spec, obs).reason == "head-like: a.w, a.y; base-like: a.x, a.z"


def test_untrusted_comparisons_keep_their_observation() -> None:
    spec = SPECS[0]
    crashed = observed({"rejected.enqueued": True}, "error", "boom")
    drifted = observed({"rejected.enqueued": False, "rejected.retired": True, "valid.enqueued": False})
    assert compare_probe(spec, crashed).observation is crashed
    assert compare_probe(spec, drifted).observation is drifted


def test_two_paths_like_the_base_are_both_named() -> None:
    group = {"rejected_group.group_retired", "rejected_group.live_groups"}
    v = judge_backport(DOOR, fork(DOOR, lambda p, f: "base" if p == DECODE or f in group else "head"))
    assert f"like base: decode-door ({WHERE['decode-door']}), retire-group ({WHERE['retire-group']})" in v.reason


def test_a_path_the_probes_cannot_speak_for_is_an_error() -> None:
    """Defensive: compare_probe already turns such fields into a probe error; the path judgment says so too."""
    fix = Fix(
        id="1",
        pr=1,
        title="t",
        base=SidePin(release="a"),
        head=SidePin(release="b"),
        probes=(),
        hunks=(hunk("odd", {"p": ("a",)}), hunk("gone", {"p": ("c",)}), hunk("fine", {"p": ("b",)})),
    )

    def verdict(v: str, reason: str, probes: list, paths: list) -> BackportVerdict:
        return BackportVerdict(1, "1", None, "t", v, reason, probes, paths=paths)

    probes = [comparison("p", {"a": "other", "b": "head", "c": "missing"})]
    v = _judge_paths(fix, probes, verdict)
    assert (v.verdict, v.reason) == ("error", "path(s) with no usable observation: odd, gone")
    assert v.probes is probes and [p.hunk for p in v.paths] == ["odd", "gone", "fine"]


def test_switch_words_take_the_last_attribute_name() -> None:
    entry = {
        "attribute": "scheduler.prefill_kv_mgr.enable_deferred_decode_kv_release",
        "value": True,
        "build_default": True,
    }
    assert forced_notes(forced(entry)) == [
        "deferred decode KV release is on by default in this build "
        "(scheduler.prefill_kv_mgr.enable_deferred_decode_kv_release)"
    ]


def test_a_backport_record_carries_sglangs_own_tests_only_when_they_were_replayed() -> None:
    v = plain("base", "head")
    assert "upstream_tests" not in v.to_dict()
    v.upstream_tests = {"text": "probe: partial; SGLang's tests: 2 passed, 1 failed — they agree", "agree": True}
    assert v.to_dict()["upstream_tests"] == {
        "text": "probe: partial; SGLang's tests: 2 passed, 1 failed — they agree",
        "agree": True,
    }
