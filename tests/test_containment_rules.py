"""The release table's rules, cell by cell: what each fix x release cell says and carries into
``contains.json``, which later release lost a fix, and in which order releases are read.

Observations are shaped like the ones a release run writes (one per probe, ``source`` naming
the release); fixes come from the real matrix ``matrices/upstream.toml``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from difflab.diff.containment import (
    Cell,
    ProbeCell,
    Regression,
    expected_cell,
    find_regressions,
    judge_cell,
    release_order,
)
from difflab.matrix.model import Fix, ProbeSpec, SidePin
from difflab.observation import Observation

PREFILL, DECODE = "pr38935_prefill_door", "pr38935_decode_door"
DEFERRED = "pr41404_deferred_release"
SWITCH = "prefill_kv_mgr.enable_deferred_decode_kv_release"
SWITCH_ENV = "SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE"


def _obs(fix: str, release: str, probe: str, status: str = "ok", **kw: Any) -> Observation:
    """One probe's observation on one release wheel."""
    source = {"kind": "release", "version": release}
    return Observation(fix=fix, probe=probe, side=release, source=source, status=status, **kw)


def _head_fields(spec: ProbeSpec) -> dict[str, Any]:
    """Every expected field at its head (fixed) value, every control at its declared value."""
    return {name: pair[1] for name, pair in spec.expect.items()} | dict(spec.controls)


def _spec(fix: Fix, name: str) -> ProbeSpec:
    return next(s for s in fix.probes if s.name == name)


# -- expectations from the matrix's pins ----------------------------------------------------
def test_a_head_pinned_to_a_commit_implies_nothing_about_releases(machinery_matrix) -> None:
    """Only a head release (present from it) or a head no release carries (absent) implies a cell."""
    unavailable = machinery_matrix.fix("43719b")
    assert expected_cell(unavailable, "0.5.22") == "absent"
    at_commit = dataclasses.replace(unavailable, head=SidePin(commit="8f3d6944b76c428d884582cb6c82a39db1465360"))
    assert expected_cell(at_commit, "0.5.22") is None
    assert expected_cell(at_commit, "0.5.20") is None


# -- one cell ---------------------------------------------------------------------------------
def test_a_fix_without_probes_is_an_error_cell_that_keeps_its_expectation(machinery_matrix) -> None:
    fix = dataclasses.replace(machinery_matrix.fix("38935"), probes=())
    cell = judge_cell(fix, "0.5.22", {}, {})
    assert cell == Cell("38935", "0.5.22", "error", "present", "no probes declared for this fix in the matrix")
    assert cell.probes == {} and cell.notes == []


def test_a_fix_older_than_every_pin_without_probes_is_not_judged_with_its_reason(machinery_matrix) -> None:
    """Base unavailable (the oldest pin already carries it): implied present from its head, never an error."""
    older = SidePin(unavailable="0.5.19 already carries it")
    fix = dataclasses.replace(machinery_matrix.fix("38935"), base=older, head=SidePin(release="0.5.19"), probes=())
    assert [expected_cell(fix, r) for r in ("0.5.19", "0.5.23")] == ["present", "present"]
    cell = judge_cell(fix, "0.5.22", {}, {})
    reason = "no probe judges it; base unavailable (0.5.19 already carries it)"
    assert cell == Cell("38935", "0.5.22", "not-judged", None, reason)
    assert cell.agrees
    with_probes = dataclasses.replace(fix, probes=machinery_matrix.fix("38935").probes)
    assert judge_cell(with_probes, "0.5.22", {}, {}).verdict == "error"  # a probe that did not run is not skipped


def test_not_applicable_names_each_probe_s_missing_machinery_and_where_it_was_observed(machinery_matrix) -> None:
    """Every probe n/a: the reason lists each probe's own words, ``not applicable: `` cut off."""
    fix = machinery_matrix.fix("38935")
    obs = {
        PREFILL: _obs(
            "38935", "0.5.20", PREFILL, "n/a", error="not applicable: no PD intake verdict: Req.intake is missing"
        ),
        DECODE: _obs("38935", "0.5.20", DECODE, "n/a"),
    }
    paths = {PREFILL: "observations/38935/0.5.20/pr38935_prefill_door.json"}
    cell = judge_cell(fix, "0.5.20", obs, paths)
    assert cell == Cell(
        "38935",
        "0.5.20",
        "not-applicable",
        "absent",
        "pr38935_prefill_door: no PD intake verdict: Req.intake is missing; pr38935_decode_door: not applicable",
        {
            PREFILL: ProbeCell("n/a", "observations/38935/0.5.20/pr38935_prefill_door.json", "n/a"),
            DECODE: ProbeCell("n/a", "", "n/a"),
        },
    )
    assert cell.agrees  # a release lacking the machinery lacks the fix, as the pins say


def test_a_probe_with_no_observation_is_listed_as_missing_without_a_file(machinery_matrix) -> None:
    fix = machinery_matrix.fix("38935")
    obs = {PREFILL: _obs("38935", "0.5.22", PREFILL, fields=_head_fields(_spec(fix, PREFILL)))}
    paths = {PREFILL: "observations/38935/0.5.22/pr38935_prefill_door.json"}
    cell = judge_cell(fix, "0.5.22", obs, paths)
    assert (cell.verdict, cell.expected, cell.reason) == (
        "error",
        "present",
        "pr38935_decode_door: probe error: no observation",
    )
    assert cell.probes == {
        PREFILL: ProbeCell("head", "observations/38935/0.5.22/pr38935_prefill_door.json", "ok"),
        DECODE: ProbeCell("error", "", "missing"),
    }
    assert cell.notes == []


def test_a_present_cell_carries_the_switches_the_probe_forced(machinery_matrix) -> None:
    fix = machinery_matrix.fix("41404")
    forced = [
        {"attribute": SWITCH, "value": True, "build_default": False, "from": "server_args.py:12", "env": [SWITCH_ENV]}
    ]
    obs = {DEFERRED: _obs("41404", "0.5.21", DEFERRED, fields=_head_fields(fix.probes[0]), forced=forced)}
    cell = judge_cell(fix, "0.5.21", obs, {DEFERRED: "observations/41404/0.5.21/pr41404_deferred_release.json"})
    assert cell == Cell(
        "41404",
        "0.5.21",
        "present",
        "present",
        "every path the fix changes behaves like its head (12: failure-notify, failure-hold-after-notify, "
        "failure-force-arm, arm-before-abort on mooncake, nixl, mori); controls hold",
        {DEFERRED: ProbeCell("head", "observations/41404/0.5.21/pr41404_deferred_release.json", "ok")},
        backends={"mooncake": "present", "nixl": "present", "mori": "present"},
        notes=[
            "deferred decode KV release is off by default in this build (server_args.py:12): "
            f"the fix is inactive unless {SWITCH_ENV}=1"
        ],
    )


# -- a cell in contains.json ------------------------------------------------------------------
def test_a_cell_s_record_names_every_field_and_upstream_only_when_replayed() -> None:
    probe = ProbeCell("base", "observations/38935/0.5.22/pr38935_prefill_door.json", "ok")
    cell = Cell(
        "38935",
        "0.5.22",
        "partial",
        "present",
        "like head: pr38935_decode_door; like base: pr38935_prefill_door",
        {PREFILL: probe},
        regression=True,
        notes=["page size is 16 by default in this build (m.page_size)"],
    )
    record = {
        "fix": "38935",
        "release": "0.5.22",
        "verdict": "partial",
        "expected": "present",
        "agrees": False,
        "regression": True,
        "reason": "like head: pr38935_decode_door; like base: pr38935_prefill_door",
        "probes": {
            PREFILL: {
                "like": "base",
                "observation": "observations/38935/0.5.22/pr38935_prefill_door.json",
                "status": "ok",
            }
        },
        "notes": ["page size is 16 by default in this build (m.page_size)"],
        "backends": {},
    }
    assert cell.to_dict() == record
    upstream = {"probe": "partial", "text": "1 of 2 own test(s) pass", "agrees": True, "disagreements": []}
    cell.upstream = upstream
    assert cell.to_dict() == record | {
        "upstream": {"probe": "partial", "text": "1 of 2 own test(s) pass", "agrees": True, "disagreements": []}
    }


# -- regressions --------------------------------------------------------------------------------
def test_a_release_without_a_cell_does_not_end_the_search_for_a_regression(machinery_matrix) -> None:
    fix = machinery_matrix.fix("38935")
    lost = "all 2 probe(s) behave like the fix's base (the bug)"
    cells = [
        Cell("38935", "0.5.21", "present", "present", "ok"),
        Cell("38935", "0.5.23", "absent", "present", lost),
    ]
    found = find_regressions([fix], ["0.5.21", "0.5.22", "0.5.23"], cells)
    assert found == [Regression("38935", "#38935", "0.5.21", "0.5.23", "absent", lost)]
    assert [c.regression for c in cells] == [False, True]


def test_releases_are_read_in_version_order_not_text_order(machinery_matrix) -> None:
    assert release_order(["0.5.10", "0.5.9", "0.5.10", "0.5.9.post1"]) == ["0.5.9", "0.5.9.post1", "0.5.10"]
    fix = machinery_matrix.fix("38935")
    cells = [
        Cell("38935", "0.5.10", "partial", None, "like base: pr38935_prefill_door"),
        Cell("38935", "0.5.9", "present", None, "ok"),
    ]
    found = find_regressions([fix], ["0.5.10", "0.5.9"], cells)
    assert found == [Regression("38935", "#38935", "0.5.9", "0.5.10", "partial", "like base: pr38935_prefill_door")]


# -- transport back ends -----------------------------------------------------------------------
def _on(spec: ProbeSpec, backend: str, side: int) -> dict[str, Any]:
    """One back end's fields at the base (0) or head (1) value, its controls at their declared value."""
    mark = f"{backend}:"
    return {f: pair[side] for f, pair in spec.expect.items() if f.startswith(mark)} | {
        f: v for f, v in spec.controls.items() if f.startswith(mark)
    }


def test_a_fix_reverted_on_one_back_end_is_partial_naming_it(machinery_matrix) -> None:
    fix = machinery_matrix.fix("41404")
    spec = fix.probes[0]
    fields = _on(spec, "mooncake", 1) | _on(spec, "nixl", 0) | _on(spec, "mori", 1)
    cell = judge_cell(fix, "0.5.22", {DEFERRED: _obs("41404", "0.5.22", DEFERRED, fields=fields)}, {})
    assert cell.verdict == "partial"
    assert cell.reason.startswith("like head on mooncake; like base on nixl; like head on mori: ")
    assert "failure-notify@nixl" in cell.reason
    assert cell.backends == {"mooncake": "present", "nixl": "absent", "mori": "present"}
    assert cell.backend_note() == "present: mooncake, mori · absent: nixl"


def test_a_back_end_without_the_machinery_is_named_not_applicable_and_not_judged(machinery_matrix) -> None:
    fix = machinery_matrix.fix("41404")
    spec = fix.probes[0]
    fields = _on(spec, "mooncake", 1) | _on(spec, "nixl", 1) | {"mori:not-applicable": "MoriKVManager cannot defer"}
    cell = judge_cell(fix, "0.5.21", {DEFERRED: _obs("41404", "0.5.21", DEFERRED, fields=fields)}, {})
    assert cell.verdict == "present"
    assert cell.reason.endswith("; not applicable on mori (MoriKVManager cannot defer)")
    assert cell.backends["mori"] == "not-applicable: MoriKVManager cannot defer"
    only = {"mooncake:not-applicable": "none", "nixl:not-applicable": "none", "mori:not-applicable": "none"}
    cell = judge_cell(fix, "0.5.18", {DEFERRED: _obs("41404", "0.5.18", DEFERRED, fields=only)}, {})
    assert cell.verdict == "not-applicable"
    missing = _on(spec, "mooncake", 1) | {"mori:not-applicable": "none"}  # nixl neither observed nor excused
    cell = judge_cell(fix, "0.5.22", {DEFERRED: _obs("41404", "0.5.22", DEFERRED, fields=missing)}, {})
    assert cell.verdict == "error"


def test_every_cell_verdict_has_a_colour_in_the_terminal_grid() -> None:
    from difflab.commands.contains import COLOURS
    from difflab.diff.containment import VERDICTS

    assert sorted(COLOURS) == sorted(VERDICTS)
