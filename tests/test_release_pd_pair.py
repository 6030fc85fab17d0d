"""The leak itself on every pinned release: a prefill/decode pair of the real code, pages checked at read time.

0.5.19 (before #36988): the request prefill rejected at intake still completes the
handoff with its one-token placeholder, and decode reads the pages the earlier
request wrote (HTTP 200). From 0.5.20 the prefill result step retires it and decode
never reads those pages; from 0.5.21 the prefill door does not admit it.
"""

from __future__ import annotations

import json

import pytest

from difflab.environment.shared import SharedEnvironment
from difflab.observation import Observation
from difflab.paths import probes_dir
from difflab.progress import Reporter
from difflab.runner import ProbeJob
from difflab.source.release import ReleaseSource
from difflab.workflows.run import RunRequest, make_runner

pytestmark = [pytest.mark.sglang, pytest.mark.xdist_group("release")]

RELEASES = ("0.5.19", "0.5.20", "0.5.21", "0.5.22", "0.5.23")
PROBE = "pr36988_pd_incident"
RACE = "pr41404_pd_in_flight"
REUSE = "pr41404_pd_failed_room_reuse"
BACKENDS = ("mooncake", "nixl", "mori")


@pytest.fixture(scope="module")
def observed(tmp_path_factory: pytest.TempPathFactory, matrix) -> dict[str, Observation]:
    work = tmp_path_factory.mktemp("pair")
    backend = ReleaseSource(matrix.releases)
    jobs = [
        ProbeJob(
            fix_id="pair",
            probe=probe,
            side=release,
            source=backend.release(release),
            probe_file=probes_dir() / f"{probe}.py",
            log_path=work / release / f"{probe}.log",
            timeout_s=120,
        )
        for release in RELEASES
        for probe in (PROBE, RACE, REUSE)
    ]
    env = SharedEnvironment().ensure()
    runs = Reporter().track(make_runner(RunRequest(), env), jobs)
    by = {o.side if o.probe == PROBE else (o.probe, o.side): o for o in runs}
    broken = {k: o.error for k, o in by.items() if not o.ok}
    assert not broken, broken
    return by


@pytest.mark.parametrize("release", RELEASES)
def test_decode_reads_a_strangers_pages_only_before_the_fix(observed, release) -> None:
    obs = observed[release]
    assert obs.sglang_version == release
    f = obs.fields
    leaked = release == "0.5.19"
    assert f["incident.leaked"] is leaked
    assert f["incident.canary"] is leaked
    assert f["incident.foreign_pages"] == (5 if leaked else 0)
    assert f["incident.reserved_pages"] == 7  # decode reserves the full prompt on every release
    assert f["incident.client_status"] == (200 if leaked else 400)
    # the control: the first request reads only the pages it wrote
    assert (f["long.leaked"], f["long.pages"], f["long.decode_status"]) == (False, 6, 200)


def test_the_leak_names_its_victim_owner_and_pages(observed) -> None:
    events = {e["event"]: e for e in observed["0.5.19"].events}
    leaks = events["leaks"]["found"]
    assert leaks == [{"victim": "overlong", "owner": "long", "pages": [2, 3, 4, 5, 6], "canary": True}]
    assert any("prefill pages" in d and "-> decode pages [1]" in d for d in events["loopback"]["decisions"])


@pytest.mark.parametrize("release", RELEASES)
def test_a_late_write_lands_in_reused_pages_until_the_hold_covers_it(observed, release) -> None:
    f = {k.removeprefix("mooncake:"): v for k, v in observed[(RACE, release)].fields.items()}
    default_defers = release >= "0.5.21"  # deferred release on by default from 0.5.21
    failed_send_holds = release >= "0.5.22"  # #43719(a): a failed Mooncake send no longer acks
    assert (f["abort_in_flight.leaked"], f["abort_in_flight.reused"]) == (not default_defers, not default_defers)
    assert (f["failed_send.leaked"], f["failed_send.held"]) == (not failed_send_holds, failed_send_holds)
    assert f["failed_send.abort_sent"] is (release >= "0.5.21")  # #41404
    assert (f["abort_forced.leaked"], f["abort_forced.held"]) == (False, True)
    assert (f["clean.leaked"], f["clean.victim_decoding"]) == (False, True)


def _defers_by_default(backend: str, release: str) -> bool:
    """Deferred release on by default: Mooncake and NIXL from 0.5.21, Mori from 0.5.22 (its manager's own switch)."""
    return release >= ("0.5.22" if backend == "mori" else "0.5.21")


@pytest.mark.parametrize("release", RELEASES)
def test_each_back_ends_role_leaks_an_aborted_write_until_its_deferral_default(observed, release) -> None:
    f = observed[(RACE, release)].fields
    for backend in BACKENDS:
        protected = _defers_by_default(backend, release)
        leaked, reused = f[f"{backend}:abort_in_flight.leaked"], f[f"{backend}:abort_in_flight.reused"]
        assert (backend, leaked, reused) == (backend, not protected, not protected)
        assert f[f"{backend}:clean.leaked"] is False
    assert not any(k.startswith(("nixl:failed_send", "mori:failed_send")) for k in f)  # Mooncake's answer only
    # forcing a switch Mori's manager never reads is not run where it cannot defer
    assert ("mori:abort_forced.leaked" in f) is (release >= "0.5.22")


@pytest.mark.parametrize("release", RELEASES)
def test_a_failed_rooms_pages_take_a_late_write_until_41404_holds_them(observed, release) -> None:
    obs = observed[(REUSE, release)]
    f = obs.fields
    fixed = release >= "0.5.21"
    for backend in BACKENDS:
        if f"{backend}:not-applicable" in f:
            assert backend == "mori" and release < "0.5.22", f[f"{backend}:not-applicable"]
            continue
        got = {k: f[f"{backend}:failed_room_reuse.{k}"] for k in ("leaked", "reused", "held", "abort_sent")}
        assert got == {"leaked": not fixed, "reused": not fixed, "held": fixed, "abort_sent": fixed}, backend
        # controls: reuse with nothing in flight is safe; a decode-initiated abort is held on every release
        assert (f[f"{backend}:failed_room_settled.leaked"], f[f"{backend}:failed_room_settled.reused"]) == (False, True)
        assert (f[f"{backend}:aborted_room.held"], f[f"{backend}:aborted_room.leaked"]) == (True, False)
    events = [e for e in obs.events if e["event"] == "loopback"]
    assert any("posted writes stay in flight" in d for e in events for d in e["decisions"])
    memory = next(e for e in obs.events if e["event"] == "memory")
    assert memory["need_sort"] is False and memory["server_need_sort"] is True  # the lab's order, named


def test_the_schedule_search_finds_the_leak_on_0_5_19_and_repeats_itself(tmp_path) -> None:
    from difflab.workflows.fuzz import FuzzRequest
    from difflab.workflows.fuzz import execute as fuzz

    runs = [
        fuzz(FuzzRequest(release="0.5.19", schedules=25, seed=2, out=tmp_path / f"f{i}", argv=[]), Reporter())
        for i in range(2)
    ]
    assert [r.exit_code for r in runs] == [1, 1]
    assert runs[0].leaks and runs[0].leaks == runs[1].leaks
    doc = json.loads((tmp_path / "f0" / "fuzz.json").read_text())
    assert doc["schedules"] == 25 and doc["seed"] == 2 and doc["leaks"] == runs[0].leaks
    # the schedules ran on the servers the build's start-up built, its own senders and receivers
    decode, prefill = doc["servers"]["decode_server"], doc["servers"]["prefill_server"]
    assert decode["built_by"] == prefill["built_by"] == "run_scheduler_process"
    assert decode["kv_manager"] == prefill["kv_manager"] == "MooncakeKVManager"
    assert decode["receivers"] == ["MooncakeKVReceiver"] and prefill["senders"] == ["MooncakeKVSender"]
    leak = doc["leaks"][0]
    assert leak["victim"] != leak["owner"] and leak["pages"] and leak["schedule"]
    assert doc["runs"] >= 25 and doc["cpu_seconds"] > 0 and doc["schedules_per_second_per_core"] > 0


MANAGERS = {"mooncake": "MooncakeKVManager", "nixl": "NixlKVManager", "mori": "MoriKVManager"}
RECEIVERS = {"mooncake": "MooncakeKVReceiver", "nixl": "NixlKVReceiver", "mori": "MoriKVReceiver"}


@pytest.mark.parametrize("release", RELEASES)
def test_the_decode_side_is_the_server_the_builds_start_up_builds(observed, release) -> None:
    """Every pair scenario's decode side came out of the build's run_scheduler_process, on the back end's
    own manager and receiver classes (the loopback plays only the prefill rank)."""
    for probe in (PROBE, RACE, REUSE):
        obs = observed[release] if probe == PROBE else observed[(probe, release)]
        servers = [e for e in obs.events if e["event"] == "decode_server"]
        assert servers, probe
        for server in servers:
            backend = server["backend"]
            assert server["built_by"] == "run_scheduler_process"
            assert server["scheduler"] == "Scheduler"
            assert server["kv_manager"] == MANAGERS[backend], (probe, server)
            assert server["receivers"] == [RECEIVERS[backend]], (probe, server)
