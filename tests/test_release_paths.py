"""Every path #36988 and #38935 change, observed on every pinned release (0.5.19-0.5.23).

#36988 (first shipped in 0.5.20): an aborted request's prefill result retires it -- on the final
result, on a grammar rejection, on an aborted middle chunk once no later chunk is in flight, and
before any optimistic re-queue -- exactly once, streaming the abort, even when the KV sender's abort
fails.

#38935 (first shipped in 0.5.21): a request rejected at intake is retired at the PD doors, and its
retirement lets go of what admission had already counted for it: its streaming session's turn and its
beam group. Re-entering requests that still hold KV or Mamba state are admitted as before.

Each expectation follows from whether the release carries the fix, so a probe that stops seeing a
path, or a release that behaves differently, fails here.
"""

from __future__ import annotations

import pytest

from difflab.environment.shared import SharedEnvironment
from difflab.observation import Observation
from difflab.paths import probes_dir
from difflab.progress import Reporter
from difflab.runner import ProbeJob
from difflab.source.release import ReleaseSource
from difflab.workflows.run import RunRequest, make_runner
from release_map import load_release_map

pytestmark = [pytest.mark.sglang, pytest.mark.xdist_group("release")]

RELEASES = ("0.5.19", "0.5.20", "0.5.21", "0.5.22", "0.5.23")
FIRST = {fix: load_release_map()[fix].first for fix in ("36988", "38935")}  # from matrices/release-map.toml
PROBES = {
    "pr36988_retire_aborted": "36988",
    "pr38935_prefill_door": "38935",
    "pr38935_decode_door": "38935",
}


def carries(fix: str, release: str) -> bool:
    def key(v: str) -> tuple[int, ...]:
        return tuple(int(x) for x in v.split("."))

    return key(release) >= key(FIRST[fix])


@pytest.fixture(scope="module")
def observed(tmp_path_factory: pytest.TempPathFactory, matrix) -> dict[tuple[str, str], Observation]:
    work = tmp_path_factory.mktemp("paths")
    backend = ReleaseSource(matrix.releases)
    jobs = [
        ProbeJob(
            fix_id=fix,
            probe=probe,
            side=release,
            source=backend.release(release),
            probe_file=probes_dir() / f"{probe}.py",
            log_path=work / release / f"{probe}.log",
            timeout_s=120,
        )
        for release in RELEASES
        for probe, fix in PROBES.items()
    ]
    env = SharedEnvironment().ensure()
    runs = Reporter().track(make_runner(RunRequest(), env), jobs)
    by = {(o.probe, o.side): o for o in runs}
    broken = {k: o.error for k, o in by.items() if not o.ok}
    assert not broken, broken
    assert len(by) == len(jobs)
    return by


def fields(observed: dict[tuple[str, str], Observation], probe: str, release: str) -> dict:
    obs = observed[(probe, release)]
    assert obs.sglang_version == release
    return obs.fields


DOOR_BACKENDS = ("mooncake", "nixl", "mori")  # the doors run every scenario on each back end the build ships


def door_fields(observed: dict[tuple[str, str], Observation], probe: str, release: str, backend: str) -> dict:
    """One back end's fields of a door probe (``<backend>:<field>``), named without the prefix."""
    prefix = f"{backend}:"
    own = {k[len(prefix) :]: v for k, v in fields(observed, probe, release).items() if k.startswith(prefix)}
    assert own, f"{probe} on {release} returned no {backend} fields"
    return own


# -- #36988 ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("release", RELEASES)
def test_an_aborted_middle_chunk_retires_the_request_when_no_chunk_is_left_in_flight(observed, release) -> None:
    f = fields(observed, "pr36988_retire_aborted", release)
    fixed = carries("36988", release)
    assert f["mid_last.retired"] is fixed
    assert f["mid_last.streamed"] == ([503] if fixed else [])
    for effect in ("release_kv_cache", "release_without_insert", "sender_abort", "metadata_freed", "cache_aborts"):
        assert f[f"mid_last.{effect}"] == int(fixed), effect
    # Neither side sends an aborted chunk on, and both forget its pending send.
    assert f["mid_last.send_kv_chunk"] == 0 and f["mid_last.inflight"] is False
    assert f["mid_last.pending_chunk_cleared"] is True


@pytest.mark.parametrize("release", RELEASES)
def test_an_aborted_middle_chunk_waits_for_its_final_chunk_still_in_flight(observed, release) -> None:
    f = fields(observed, "pr36988_retire_aborted", release)
    fixed = carries("36988", release)
    # The fix keeps the final chunk's send owed and releases nothing yet ...
    assert f["mid_still.pending_chunk_cleared"] is not fixed
    assert f["mid_still.release_kv_cache"] == 0 and f["mid_still.retired"] is False
    # ... and retires the request on the final chunk's result.
    assert f["mid_still.final_retired"] is fixed


@pytest.mark.parametrize("release", RELEASES)
def test_an_aborted_middle_chunk_with_bootstrap_pending_is_retired_not_requeued(observed, release) -> None:
    f = fields(observed, "pr36988_retire_aborted", release)
    fixed = carries("36988", release)
    assert f["mid_pending.requeued"] is not fixed
    assert f["mid_pending.radix_insert"] == int(not fixed)
    assert f["mid_pending.release_without_insert"] == int(fixed) and f["mid_pending.sender_abort"] == int(fixed)
    assert f["mid_pending.retired"] is fixed and f["mid_pending.streamed"] == ([503] if fixed else [])
    # A live chunk with bootstrap pending still yields and is re-queued on every release.
    assert f["yielded.requeued"] is True and f["yielded.retired"] is False and f["yielded.streamed"] == []


@pytest.mark.parametrize("release", RELEASES)
def test_a_grammar_rejection_retires_the_request_before_its_kv_is_sent(observed, release) -> None:
    f = fields(observed, "pr36988_retire_aborted", release)
    fixed = carries("36988", release)
    assert f["grammar.inflight"] is not fixed
    assert f["grammar.send_kv_chunk"] == int(not fixed) and f["grammar.radix_insert"] == int(not fixed)
    assert f["grammar.release_without_insert"] == int(fixed)
    assert f["grammar.streamed"] == ([500] if fixed else [])
    # Both sides keep the sampled token and finish the request with the grammar's 500.
    assert f["grammar.output_tokens"] == 1 and f["grammar.retired"] is True


@pytest.mark.parametrize("release", RELEASES)
def test_a_failing_sender_abort_still_releases_locally(observed, release) -> None:
    f = fields(observed, "pr36988_retire_aborted", release)
    fixed = carries("36988", release)
    assert f["sender_fails.release_kv_cache"] == int(fixed) and f["sender_fails.release_without_insert"] == int(fixed)
    assert f["sender_fails.metadata_freed"] == int(fixed)
    assert f["sender_fails.retired"] is fixed and f["sender_fails.streamed"] == ([503] if fixed else [])
    assert f["sender_fails.escaped"] is False  # the transport's error never leaves the result loop
    staged = [e for e in observed[("pr36988_retire_aborted", release)].events if e["event"] == "intended_failure"]
    # Only a release that retires calls sender.abort() at all; the grammar rejection is staged everywhere.
    assert sorted(e["where"] for e in staged) == sorted(["grammar.accept_token"] + (["sender.abort"] if fixed else []))


@pytest.mark.parametrize("release", RELEASES)
def test_a_result_after_retirement_changes_nothing(observed, release) -> None:
    f = fields(observed, "pr36988_retire_aborted", release)
    fixed = carries("36988", release)
    assert f["delayed.ignored"] is fixed
    assert f["delayed.reenqueued"] is not fixed and f["delayed.send_kv_chunk"] == int(not fixed)
    # A live request's duplicate result is never ignored: the measurement sees changes.
    assert f["duplicate.ignored"] is False and f["duplicate.reenqueued"] is True


@pytest.mark.parametrize("release", RELEASES)
def test_an_aborted_final_result_with_bootstrap_pending_is_retired(observed, release) -> None:
    f = fields(observed, "pr36988_retire_aborted", release)
    fixed = carries("36988", release)
    assert f["final_pending.inflight"] is not fixed and f["final_pending.radix_insert"] == int(not fixed)
    assert f["final_pending.release_without_insert"] == int(fixed)
    assert f["final_pending.streamed"] == ([503] if fixed else [])
    assert f["final_pending.send_kv_chunk"] == 0  # nothing is sent before bootstrap, on either side


@pytest.mark.parametrize("release", RELEASES)
def test_hicache_storage_is_forced_and_reported_with_the_builds_default(observed, release) -> None:
    """0.5.20 tells the cache about the abort only with hicache storage on; forced, on the built scheduler."""
    forced = observed[("pr36988_retire_aborted", release)].forced
    (flag,) = [f for f in forced if f["attribute"] == "scheduler.enable_hicache_storage"]
    assert flag["value"] is True and flag["build_default"] is False
    assert "hicache_storage_backend" in flag["from"]


# -- #38935 ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", DOOR_BACKENDS)
@pytest.mark.parametrize("release", RELEASES)
def test_a_rejected_request_lets_its_streaming_session_take_the_next_turn(observed, release, backend) -> None:
    f = door_fields(observed, "pr38935_prefill_door", release, backend)
    fixed = carries("38935", release)
    assert f["rejected_session.session_busy"] is not fixed
    assert f["rejected_session.session_detached"] is fixed
    assert f["rejected_session.retired"] is fixed and f["rejected_session.streamed"] == ([400] if fixed else [])
    # Admitted turns keep their session; a non-streaming session is never detached.
    assert f["session_valid.session_busy"] is True and f["session_valid.session_detached"] is False
    assert f["plain_session.session_detached"] is False and f["plain_session.session_busy"] is False


@pytest.mark.parametrize("backend", DOOR_BACKENDS)
@pytest.mark.parametrize("release", RELEASES)
def test_a_rejected_beam_leader_retires_its_group(observed, release, backend) -> None:
    f = door_fields(observed, "pr38935_prefill_door", release, backend)
    fixed = carries("38935", release)
    assert f["rejected_group.group_retired"] is fixed
    assert f["rejected_group.live_groups"] == (0 if fixed else 1)
    assert f["rejected_group.enqueued"] is not fixed
    assert f["group_valid.group_retired"] is False and f["group_valid.live_groups"] == 1


@pytest.mark.parametrize("backend", DOOR_BACKENDS)
@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("scenario", ["reentering_kv", "reentering_mamba"])
def test_a_reentering_request_holding_kv_or_mamba_state_is_admitted(observed, release, scenario, backend) -> None:
    f = door_fields(observed, "pr38935_prefill_door", release, backend)
    assert f[f"{scenario}.enqueued"] is True and f[f"{scenario}.sender_created"] is True
    assert f[f"{scenario}.retired"] is False and f[f"{scenario}.streamed"] == []


@pytest.mark.parametrize("backend", DOOR_BACKENDS)
@pytest.mark.parametrize("release", RELEASES)
def test_a_rejected_request_is_retired_at_both_doors_with_its_400(observed, release, backend) -> None:
    fixed = carries("38935", release)
    prefill = door_fields(observed, "pr38935_prefill_door", release, backend)
    decode = door_fields(observed, "pr38935_decode_door", release, backend)
    assert prefill["rejected.enqueued"] is not fixed and decode["rejected.receiver_created"] is not fixed
    for door in (prefill, decode):
        assert door["rejected.retired"] is fixed
        assert door["rejected.streamed"] == ([400] if fixed else [])
        assert door["rejected.cache_aborts"] == int(fixed)
