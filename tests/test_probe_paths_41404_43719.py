"""Every path #41404 and #43719(a) change, on every pinned release: the scenarios' values per release.

The matrix says what base and head show; this says what each release shows,
scenario by scenario, so a path that silently stops discriminating (or starts
discriminating on the wrong release) is caught here and not only as a
verdict. It also checks what the probes must not do: force anything but the
deferred-release switches (and NIXL's settle deadline), or read a fix's own bookkeeping by name.
"""

from __future__ import annotations

import io
import json
import tokenize
from pathlib import Path

import pytest

from difflab.progress import Reporter
from difflab.workflows.contains import ContainsRequest, execute
from release_map import load_release_map

pytestmark = [pytest.mark.sglang, pytest.mark.xdist_group("release")]

PROBES = Path(__file__).resolve().parents[1] / "probes"
RELEASES = ("0.5.19", "0.5.20", "0.5.21", "0.5.22", "0.5.23")
# probe -> the fix it judges
PROBE = {
    "pr41404_deferred_release": "41404",
    "pr43719_failed_send_ack": "43719a",
    "pr43719_nixl_unsettled_ack": "43719a",
}
FIXES = sorted(set(PROBE.values()))
# from the release map: the first release carrying each fix, and per transport back end its scenarios run on
# the first release whose back end has the machinery
FIRST_FIXED = {fix: load_release_map()[fix].first for fix in FIXES}
BACKENDS = {fix: load_release_map()[fix].backends for fix in FIXES}

# probe -> field: (value before the fix, value with it)
CHANGES = {
    "pr41404_deferred_release": {
        # a partial publish: rank 1 refused the metadata, rank 0 holds the destination
        "partial.released_immediately": (True, False),
        "partial.abort_messages": (0, 2),
        "partial.outcome": ("immediate", "drained"),
        # a client abort whose first ack races back while decode still notifies rank 1
        "racing_ack.outcome": ("held", "drained"),
        "racing_ack.release_count": (0, 1),
        "racing_ack.still_held": (True, False),
        "failed.abort_messages": (0, 2),
        "timeout.outcome": ("immediate", "timeout"),
    },
    "pr43719_failed_send_ack": {
        "failed.acks": (1, 0),
        "second_abort.acks": (1, 0),
        "after_clear.acks": (1, 0),
        "aux_failed.acks": (1, 0),
        "aux_failed.late_acks": (1, 0),
        "aux_late.late_acks": (1, 0),
        "state_failed.acks": (1, 0),
        "state_failed.late_acks": (1, 0),
        "state_failed.session_alive": (False, True),
        "state_late.late_acks": (1, 0),
        "state_aborted.aux_sends": (1, 0),
        "state_aborted.status_reports": (1, 0),
    },
    "pr43719_nixl_unsettled_ack": {
        "next_chunk.acks": (1, 0),
        "late_abort.acks": (1, 0),
        "cleared.acks": (1, 0),
        "reused.acks": (0, 1),
    },
}
# fields every release shows alike
SAME = {
    "pr41404_deferred_release": {
        "partial.release_count": 1,
        "partial.still_held": False,
        "racing_ack.held": True,
        "racing_ack.abort_messages": 2,
        "client_abort.outcome": "drained",
        "client_abort.release_count": 1,
        "decode_initiated.held": True,
        "unnotifiable.outcome": "immediate",
    },
    "pr43719_failed_send_ack": {
        "reused.acks": 1,
        "succeeded.acks": 1,
        "succeeded.late_acks": 1,
        "succeeded.session_alive": True,
        "failed.session_alive": False,
        "failed.status_reports": 1,
        "aux_failed.aux_sends": 1,
        "aux_failed.decode_told_failed": True,
        "aux_late.acks": 0,
        "state_failed.aux_sends": 0,
        "state_late.acks": 0,
        "state_late.session_alive": False,
        "state_late.decode_told_failed": True,
        "state_aborted.acks": 1,
    },
    "pr43719_nixl_unsettled_ack": {
        "succeeded.acks": 1,
        "unsettled.acks": 0,
        "settle_timeout.acks": 0,
        "second_abort.acks": 0,
        "after_clear.acks": 0,
        "next_chunk.writes": 0,
    },
}
# a fix's own bookkeeping: the build's constructor makes it; no probe may name it
FIX_STATE = (
    "_deferred_ack_poisoned_rooms",
    "_deferred_ack_targets",
    "_deferred_ack_fanout_snapshots",
    "_deferred_releases",
    "_deferred_abort_ack_tracker",
    "_deferred_abort_generation",
    "_staging_outstanding",
    "failed_sessions",
    "session_failures",
)


@pytest.fixture(scope="module")
def observed(tmp_path_factory: pytest.TempPathFactory, matrix_path: Path):
    out = tmp_path_factory.mktemp("paths") / "contains"
    req = ContainsRequest(matrix=matrix_path, fixes=FIXES, releases=list(RELEASES), out=out, bundle=False)
    outcome = execute(req, Reporter())
    cells = outcome.table.cells
    assert tuple(r.version for r in outcome.table.releases) == RELEASES
    obs = {
        (probe, release): json.loads((out / "observations" / fix / release / f"{probe}.json").read_text())
        for probe, fix in PROBE.items()
        for release in RELEASES
    }
    return obs, {(c.fix, c.release): c.verdict for c in cells}


@pytest.mark.parametrize("probe", list(PROBE))
def test_each_path_changes_on_the_release_that_carries_the_fix(observed, matrix, probe: str) -> None:
    obs, verdicts = observed
    fix = PROBE[probe]
    runs_on = next(p.backends for f in matrix.fixes if f.id == fix for p in f.probes if p.name == probe)
    backends = {b: first for b, first in BACKENDS[fix].items() if b in runs_on}
    for release in RELEASES:
        o = obs[(probe, release)]
        assert o["status"] == "ok" and not o["problems"], (probe, release, o["error"], o["problems"])
        fixed = release >= FIRST_FIXED[fix]
        assert verdicts[(fix, release)] == ("present" if fixed else "absent"), (fix, release)
        want = {f: pair[fixed] for f, pair in CHANGES[probe].items()} | SAME[probe]
        on = [b for b, first in backends.items() if release >= first]
        if backends:
            want = {f"{b}:{f}": v for b in on for f, v in want.items()}
            for b in set(backends) - set(on):
                assert f"{b}:not-applicable" in o["fields"], (probe, release, b)
        got = {f: o["fields"].get(f) for f in want}
        assert got == want, (probe, release, {f: (got[f], want[f]) for f in want if got[f] != want[f]})


def test_the_partial_publish_is_an_injected_fault_not_a_broken_fake(observed) -> None:
    obs, _ = observed
    for release in RELEASES:
        events = obs[("pr41404_deferred_release", release)]["events"]
        refused = {e["where"] for e in events if e["event"] == "intended_failure"}
        assert refused == {"send_multipart(tcp://192.0.2.10:17101)"}, (release, events)


def test_only_the_deferred_release_switches_and_timeout_are_forced_and_fix_state_comes_from_the_constructor(
    observed,
) -> None:
    obs, _ = observed
    for release in RELEASES:
        decode, prefill = obs[("pr41404_deferred_release", release)], obs[("pr43719_failed_send_ack", release)]
        # decode: the switch an operator sets, the timeout of one scenario, the capability of one control
        assert {f["attribute"] for f in decode["forced"]} == {
            "environ.enable_deferred_decode_kv_release",
            "transfer_queue.deferred_kv_release_timeout",
            "decode_kv_mgr.enable_deferred_decode_kv_release",
        }
        switch = {f["build_default"] for f in decode["forced"] if f["attribute"].startswith("environ.")}
        assert switch == {release >= FIRST_FIXED["41404"]}, (release, switch)
        timeouts = {f["build_default"] for f in decode["forced"] if f["attribute"].endswith("_timeout")}
        assert timeouts == {30.0}, (release, timeouts)
        # the decode side's queue and managers ran their own constructors: nothing read from source text
        assert not [d for d in decode["defaults"] if d["attribute"].startswith(("transfer_queue.", "decode_kv_mgr."))]
        # prefill: the same switch; its Mooncake manager ran its own constructor in the wired prefill server
        assert {f["attribute"] for f in prefill["forced"]} == {"environ.enable_deferred_decode_kv_release"}
        assert not [d for d in prefill["defaults"] if d["attribute"].startswith("prefill_kv_mgr.")]
        # NIXL's prefill rank: the same switch, and NIXL's settle deadline where the build has one (5 s, 0.5.20+)
        nixl = {f["attribute"]: f for f in obs[("pr43719_nixl_unsettled_ack", release)]["forced"]}
        settle = "nixl.NIXL_ERR_SETTLE_TIMEOUT_S"
        assert set(nixl) == {"environ.enable_deferred_decode_kv_release"} | ({settle} if release >= "0.5.20" else set())
        assert release < "0.5.20" or nixl[settle]["build_default"] == 5.0, (release, nixl)


def _names(path: Path) -> set[str]:
    """The identifiers a source file uses in code (not in strings or comments)."""
    tokens = tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
    return {t.string for t in tokens if t.type == tokenize.NAME}


def test_no_probe_names_a_fixs_own_bookkeeping() -> None:
    files = [*PROBES.glob("pr*.py"), *(PROBES / "harness").glob("*.py"), *(PROBES / "throughput").glob("*.py")]
    assert files
    named = {f.name: sorted(_names(f) & set(FIX_STATE)) for f in files}
    assert not {f: n for f, n in named.items() if n}, named
