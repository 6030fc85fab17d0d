"""The kept hub: a later command forks from the hub an earlier one started, and only from a pristine one.

Driven like tests/test_warm_runner.py: the real hub, server and fork machinery on the host
interpreter with toy sources and probes. Each test keeps its hub in its own cache folder for a
few seconds at most and stops it at the end, so a killed test run leaves nothing for long.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from difflab.errors import ConfigError
from difflab.runner import kept_hub
from difflab.runner.kept_hub import Keeper, Pointer
from test_warm_runner import job, lab, runner, toy_source  # noqa: F401 - lab is a fixture

KEEP_S = 20.0


@pytest.fixture
def keeper(lab: Path) -> Iterator[Keeper]:  # noqa: F811 - the fixture, imported
    found = Keeper(lab / "cache" / "warm", "host-test")
    yield found
    found.stop()


def gone(pid: int, within_s: float = 15.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)  # a hub this test process started is its child: reap it
        time.sleep(0.05)
    return False


def test_a_later_command_forks_from_the_hub_an_earlier_one_kept(lab: Path, keeper: Keeper) -> None:  # noqa: F811
    src = toy_source(lab, "a")
    with runner(keep_s=KEEP_S) as first:
        (one,) = first.run([job(lab, "toy_patch", src)])
        pid = first._hub.pid  # type: ignore[union-attr]
    assert one.status == "ok" and one.runner == "warm"
    kept = keeper.pointer()
    assert kept is not None and kept.pid == pid and kept.alive
    assert first.stats["hubs"][0]["reused"] is False
    with runner(keep_s=KEEP_S) as second:
        (two,) = second.run([job(lab, "toy_patch", src, 1)])
        assert second._hub.pid == pid and second._hub.proc is None  # type: ignore[union-attr]
    assert second.stats["hubs"][0]["reused"] is True
    assert [h["reused"] for h in second.describe()["hubs"]] == [True]  # run.json says where probes forked from
    # The first command's probe patched the module and the standard library; the second sees neither.
    assert two.status == "ok" and two.fields == one.fields
    assert two.fields["toymod.value"] == "a" and two.fields["string.marker"] is None


def test_the_kept_hub_ends_every_server_and_probe_of_a_command_that_left(lab: Path, keeper: Keeper) -> None:  # noqa: F811
    src = toy_source(lab, "a")
    r = runner(keep_s=KEEP_S)
    r.start_early()
    hub = r._hub
    assert hub is not None
    hub.wait_ready()
    hub.send({"op": "open", "server": "s1", "root": str(src.root), "preload": ["toymod"], "log": str(lab / "s1.log")})
    assert hub.next_event(30)["event"] == "ready"
    hang = job(lab, "toy_hang", src)
    hang.log_path.parent.mkdir(parents=True, exist_ok=True)
    request = {"op": "run", "server": "s1", "job": 0, "probe": str(hang.probe_file), "timeout_s": 60}
    hub.send(request | {"out": str(lab / "out.json"), "log": str(lab / "probe.log")})
    started = hub.next_event(30)
    assert started["event"] == "started"
    probe = int(started["pid"])
    hub.sock.close()  # the command dies mid-probe: no close, no goodbye
    os.close(hub.claim)  # type: ignore[arg-type]
    hub.claim = None
    assert gone(probe), "the probe of a command that left is still running"
    with runner(keep_s=KEEP_S) as r2:
        (obs,) = r2.run([job(lab, "toy_patch", src, 1)])
        assert r2._hub.pid == hub.pid  # type: ignore[union-attr]
    assert obs.status == "ok"


def test_a_second_command_at_the_same_time_gets_a_hub_of_its_own(lab: Path, keeper: Keeper) -> None:  # noqa: F811
    src = toy_source(lab, "a")
    with runner(keep_s=KEEP_S) as holder:
        holder.run([job(lab, "toy_patch", src)])
        kept = holder._hub
        assert kept is not None and kept.kept
        with runner(keep_s=KEEP_S) as other:
            (obs,) = other.run([job(lab, "toy_patch", src, 1)])
            own = other._hub
            assert own is not None and own.pid != kept.pid and not own.kept
        assert obs.status == "ok"
        assert gone(own.pid), "a hub for one command outlived it"
    assert keeper.pointer() is not None and keeper.pointer().pid == kept.pid  # type: ignore[union-attr]


def test_a_hub_started_another_way_is_stopped_not_reused(lab: Path, keeper: Keeper) -> None:  # noqa: F811
    src = toy_source(lab, "a")
    with runner(keep_s=KEEP_S) as first:
        first.run([job(lab, "toy_patch", src)])
        old = first._hub.pid  # type: ignore[union-attr]
        old_folder = first._hub.folder  # type: ignore[union-attr]
    with runner(keep_s=KEEP_S, hub_preload=("difflib",)) as second:  # another preload: another hub
        (obs,) = second.run([job(lab, "toy_patch", src, 1)])
        new = second._hub.pid  # type: ignore[union-attr]
    assert obs.status == "ok" and new != old
    assert gone(old) and not old_folder.exists()
    assert keeper.pointer().pid == new  # type: ignore[union-attr]


def test_an_idle_hub_leaves_and_removes_its_socket_folder(lab: Path, keeper: Keeper) -> None:  # noqa: F811
    src = toy_source(lab, "a")
    with runner(keep_s=1.0) as r:
        r.run([job(lab, "toy_patch", src)])
        pid, folder = r._hub.pid, r._hub.folder  # type: ignore[union-attr]
    assert gone(pid) and not folder.exists()
    with runner(keep_s=1.0) as r2:  # the stale pointer is no obstacle
        (obs,) = r2.run([job(lab, "toy_patch", src, 1)])
        assert r2._hub.pid != pid  # type: ignore[union-attr]
    assert obs.status == "ok"


def test_an_idle_hub_waits_for_a_command_that_holds_the_lock(lab: Path, keeper: Keeper) -> None:  # noqa: F811
    src = toy_source(lab, "a")
    with runner(keep_s=1.0) as r:
        r.run([job(lab, "toy_patch", src)])
        pid = r._hub.pid  # type: ignore[union-attr]
    claim = keeper.lock()
    assert claim is not None
    time.sleep(2.5)  # past the idle time: the hub must not leave while a command is about to connect
    try:
        assert Pointer.read(keeper.pointer_path).alive  # type: ignore[union-attr]
    finally:
        os.close(claim)
    assert gone(pid)


def test_stop_ends_the_kept_hub(lab: Path, keeper: Keeper) -> None:  # noqa: F811
    src = toy_source(lab, "a")
    with runner(keep_s=KEEP_S) as r:
        r.run([job(lab, "toy_patch", src)])
        pid, folder = r._hub.pid, r._hub.folder  # type: ignore[union-attr]
    assert [k.status()["alive"] for k in kept_hub.keepers(lab / "cache")] == [True]  # type: ignore[index]
    assert keeper.stop() is True
    assert gone(pid) and not folder.exists() and keeper.pointer() is None
    assert keeper.stop() is False


def test_no_hub_is_kept_with_zero_seconds(lab: Path, keeper: Keeper) -> None:  # noqa: F811
    src = toy_source(lab, "a")
    with runner(keep_s=0.0) as r:
        r.run([job(lab, "toy_patch", src)])
        pid = r._hub.pid  # type: ignore[union-attr]
    assert gone(pid) and keeper.pointer() is None


@pytest.mark.parametrize("raw", ["soon", "-1", "nan"])
def test_a_bad_idle_setting_names_the_variable(raw: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(kept_hub.IDLE_ENV, raw)
    with pytest.raises(ConfigError, match=kept_hub.IDLE_ENV):
        kept_hub.idle_seconds()


def test_the_idle_setting_is_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(kept_hub.IDLE_ENV, "12.5")
    assert kept_hub.idle_seconds() == 12.5
    monkeypatch.delenv(kept_hub.IDLE_ENV)
    assert kept_hub.idle_seconds() == kept_hub.DEFAULT_IDLE_S


def test_a_half_written_pointer_reads_as_none(tmp_path: Path) -> None:
    k = Keeper(tmp_path, "env")
    tmp_path.mkdir(exist_ok=True)
    k.pointer_path.write_text('{"pid": 1, "socket": ')
    assert k.pointer() is None
    k.pointer_path.write_text(
        '{"pid": 1, "socket": "/nowhere", "folder": "/nowhere", "key": "k", "idle_s": 1, "started": 0, "listener": 1}'
    )
    found = k.pointer()
    assert found is not None and not found.alive  # pid 1 is no hub


def test_lock_is_exclusive_between_threads_and_processes(tmp_path: Path) -> None:
    k = Keeper(tmp_path / "warm", "env")
    first = k.lock()
    assert first is not None
    seen: list[int | None] = []
    t = threading.Thread(target=lambda: seen.append(k.lock()))
    t.start()
    t.join()
    assert seen == [None]
    os.close(first)
    again = k.lock()
    assert again is not None
    os.close(again)


def test_the_hub_command_lists_and_stops_kept_hubs(
    lab: Path,  # noqa: F811
    keeper: Keeper,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from difflab.cli import main

    assert main(["hub", "status"]) == 0
    assert capsys.readouterr().out.strip() == "no kept hub"
    src = toy_source(lab, "a")
    with runner(keep_s=KEEP_S) as r:
        r.run([job(lab, "toy_patch", src)])
        pid = r._hub.pid  # type: ignore[union-attr]
    assert main(["hub", "status"]) == 0
    out = capsys.readouterr().out
    assert f"pid {pid}" in out and "running" in out and "waits 20 s" in out
    assert main(["hub", "stop"]) == 0
    assert capsys.readouterr().out.strip() == "stopped 1 kept hub"
    assert gone(pid)
    assert main(["hub", "stop"]) == 0
    assert capsys.readouterr().out.strip() == "stopped 0 kept hubs"


def test_a_socket_put_in_the_hubs_place_is_not_trusted(lab: Path, keeper: Keeper) -> None:  # noqa: F811
    """A probe may write in the temporary folder: a listener of its own where the hub's socket was
    must not be taken for the hub (it could answer with any results it liked)."""
    import socket as socket_module

    src = toy_source(lab, "a")
    with runner(keep_s=KEEP_S) as first:
        first.run([job(lab, "toy_patch", src)])
        pid = first._hub.pid  # type: ignore[union-attr]
    kept = keeper.pointer()
    assert kept is not None
    Path(kept.socket).unlink()
    impostor = socket_module.socket(socket_module.AF_UNIX, socket_module.SOCK_STREAM)
    impostor.bind(kept.socket)
    impostor.listen(1)
    try:
        assert kept.alive  # same pid, a socket at the path: only the listener's pid tells them apart
        with runner(keep_s=KEEP_S) as second:
            (obs,) = second.run([job(lab, "toy_patch", src, 1)])
            assert second._hub.pid != pid and second._hub.proc is not None  # type: ignore[union-attr]
        assert obs.status == "ok" and second.stats["hubs"][0]["reused"] is False
        assert gone(pid), "the hub whose socket was replaced was not stopped"
    finally:
        impostor.close()


def test_a_probe_cannot_talk_to_the_kept_hub(lab: Path, keeper: Keeper) -> None:  # noqa: F811
    """Build code runs in the hub's probes. One that dials the hub waits behind its own lab (the hub
    serves one at a time), and the connection it leaves queued does not keep the next lab waiting."""
    src = toy_source(lab, "a")
    with runner(keep_s=KEEP_S) as first:
        first.run([job(lab, "toy_patch", src)])
    kept = keeper.pointer()
    assert kept is not None
    (lab / "probes" / "toy_dial.py").write_text(
        "import socket\n\ndef observe(kit):\n"
        "    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
        f"    s.connect({kept.socket!r})\n"
        "    s.settimeout(2)\n"
        "    try:\n        return {'answer': s.recv(4096).decode()}\n"
        "    except TimeoutError:\n        return {'answer': 'timeout'}\n"
    )
    with runner(keep_s=KEEP_S) as dialer:
        (obs,) = dialer.run([job(lab, "toy_dial", src)])
        assert dialer._hub.pid == kept.pid  # type: ignore[union-attr]
    assert obs.status == "ok" and obs.fields == {"answer": "timeout"}
    with runner(keep_s=KEEP_S) as again:
        (ok,) = again.run([job(lab, "toy_patch", src, 2)])
        assert again._hub.pid == kept.pid  # type: ignore[union-attr]
    assert ok.status == "ok" and again.stats["hubs"][0]["reused"] is True  # greeted: not held by the dead probe


def test_a_kept_hub_held_by_someone_else_is_replaced_not_waited_for(
    lab: Path,  # noqa: F811
    keeper: Keeper,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A connection that is not a lab's (any process of this user can dial the socket) holds the hub:
    the next command waits only for the greeting's few seconds, then stops that hub and starts its own."""
    import socket as socket_module

    from difflab.runner import warm

    src = toy_source(lab, "a")
    with runner(keep_s=KEEP_S) as first:
        first.run([job(lab, "toy_patch", src)])
    kept = keeper.pointer()
    assert kept is not None
    squatter = socket_module.socket(socket_module.AF_UNIX, socket_module.SOCK_STREAM)
    squatter.connect(kept.socket)
    squatter.settimeout(10)
    assert b"hub-ready" in squatter.recv(4096)  # the hub is now this connection's
    monkeypatch.setattr(warm, "KEPT_GREETING_S", 1.0)
    try:
        with runner(keep_s=KEEP_S) as second:
            (obs,) = second.run([job(lab, "toy_patch", src, 1)])
            assert second._hub.pid != kept.pid  # type: ignore[union-attr]
        assert obs.status == "ok" and second.stats["hubs"][0]["reused"] is False
        assert gone(kept.pid)
    finally:
        squatter.close()


def test_a_socket_path_longer_than_an_address_holds_still_serves(tmp_path: Path) -> None:
    """A long ``$TMPDIR`` gives the hub's socket a path past the 107 bytes an address holds."""
    import socket as socket_module

    folder = tmp_path / ("d" * 120)
    folder.mkdir()
    path = folder / "hub.sock"
    assert len(str(path)) > kept_hub.SUN_PATH_MAX
    listener = socket_module.socket(socket_module.AF_UNIX, socket_module.SOCK_STREAM)
    client = socket_module.socket(socket_module.AF_UNIX, socket_module.SOCK_STREAM)
    try:
        kept_hub.unix_call(listener, "bind", path)
        listener.listen(1)
        assert path.exists()
        kept_hub.unix_call(client, "connect", path)
        conn, _ = listener.accept()
        client.sendall(b"x")
        assert conn.recv(1) == b"x"
        conn.close()
    finally:
        client.close()
        listener.close()
