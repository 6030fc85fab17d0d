"""The steps every workflow shares (:class:`difflab.workflows.session.Session`), each on its own.

The whole commands of test_workflow_exits.py pass through these steps too, but a step that quietly
did nothing there (a back end never closed, a hub never started early, the environment made ready
for a back end that never runs in it) would change no verdict. So each step is asked here what it
did: the record it started, the folder it refused, what it handed the registry, what it sealed.
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from difflab.environment.shared import SharedEnvironment
from difflab.errors import ConfigError
from difflab.matrix import Matrix
from difflab.progress import Reporter
from difflab.runner.docker import DockerRunner
from difflab.runner.subprocess import SubprocessRunner
from difflab.workflows import session as session_module
from difflab.workflows.session import ProbeOptions, Session, close_runner, started_early
from test_bundle_support import isolated_config, make_key  # noqa: F401 - isolated_config is an autouse fixture
from workflow_tree import fix_entry, matrix_text, write_probes


@pytest.fixture(autouse=True)
def tiny_probes(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DIFFLAB_PROBES", str(write_probes(tmp_path_factory.getbasetemp() / "tiny-probes")))


def matrix(tmp_path: Path, *probes: str) -> Path:
    path = tmp_path / "matrix" / "upstream.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    entries = [fix_entry(str(n), "a" * 40, "b" * 40, probe=p) for n, p in enumerate(probes or ("tiny_door",), 1)]
    path.write_text(matrix_text(*entries))
    return path


def options(tmp_path: Path, **changes: Any) -> ProbeOptions:
    return ProbeOptions(**{"matrix": matrix(tmp_path, "tiny_door", "tiny_door"), "argv": ["difflab", "x"], **changes})


def reporter() -> tuple[Reporter, io.StringIO]:
    text = io.StringIO()
    return Reporter(Console(file=text, width=400)), text


# -- open: bad input refused before anything runs, the record started -------------------------------------------
def test_open_starts_the_record_with_the_command_its_argv_and_the_selected_fixes(tmp_path: Path) -> None:
    said, _ = reporter()
    session = Session.open("run", options(tmp_path, fixes=["2"], out=tmp_path / "out"), said)
    assert (session.command, session.record.command, session.record.argv) == ("run", "run", ["difflab", "x"])
    assert [f.id for f in session.fixes] == ["2"] and session.record.fixes == ["2"]
    assert session.out == (tmp_path / "out").resolve() and session.reporter is said
    assert session.say == said.say and session.matrix.path == tmp_path / "matrix" / "upstream.toml"


def test_open_asks_the_workflows_own_selection_when_it_has_one(tmp_path: Path) -> None:
    def last(m: Matrix) -> list:
        return [m.fixes[-1]]

    session = Session.open("merge", options(tmp_path, fixes=["1"], out=tmp_path / "out"), select=last)
    assert [f.id for f in session.fixes] == ["2"] and session.record.fixes == ["2"]


def test_open_refuses_a_probe_without_its_file_unless_told_not_to_look(tmp_path: Path) -> None:
    path = matrix(tmp_path, "tiny_door", "no_such_probe")
    with pytest.raises(
        ConfigError, match=rf"^{re.escape(str(path))}: fix '2'\.probes\[0\]\.name: probe 'no_such_probe'"
    ):
        Session.open("run", ProbeOptions(matrix=path, out=tmp_path / "out"))
    session = Session.open("merge", ProbeOptions(matrix=path, out=tmp_path / "out"), probe_files=False)
    assert [f.id for f in session.fixes] == ["1", "2"]


def test_open_without_out_names_a_stamped_folder_under_the_results(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    session = Session.open("selfcheck", options(tmp_path), folder_prefix="selfcheck-")
    assert session.out.parent == (tmp_path / "results").resolve()
    assert re.fullmatch(r"selfcheck-\d{8}T\d{6}Z", session.out.name)
    assert not session.out.exists()  # named, not made: nothing is written before the workflow completes
    plain = Session.open("run", options(tmp_path / "plain"))
    assert re.fullmatch(r"\d{8}T\d{6}Z", plain.out.name)


def test_open_refuses_a_folder_it_did_not_write_and_replaces_its_own_only_with_force(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "notes.txt").write_text("keep me")
    with pytest.raises(ConfigError, match=re.escape(str(theirs.resolve()))):
        Session.open("run", options(tmp_path, out=theirs, force=True))
    ours = tmp_path / "ours"
    first = Session.open("run", options(tmp_path, out=ours))
    with first.folder() as work:
        first.finish(work, 0)
    with pytest.raises(ConfigError, match="--force"):
        Session.open("run", options(tmp_path, out=ours))
    again = Session.open("run", options(tmp_path, out=ours, force=True))
    with again.folder() as work:
        (work / "marker").write_text("new")
        again.finish(work, 1)
    assert (ours / "marker").read_text() == "new" and json.loads((ours / "run.json").read_text())["exit_code"] == 1


# -- the back end's steps ------------------------------------------------------------------------------------
def test_the_environment_is_made_ready_only_for_a_back_end_that_runs_in_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ensured: list[tuple[tuple[str, ...], Any]] = []

    def ensure(self: SharedEnvironment, progress: Any = None) -> SharedEnvironment:
        ensured.append((self.pins, progress))
        return self

    monkeypatch.setattr(SharedEnvironment, "ensure", ensure)
    said, _ = reporter()
    local = Session.open("run", options(tmp_path, out=tmp_path / "out", runner="subprocess"), said)
    assert local.runner_class is SubprocessRunner
    env = local.environment()
    assert env.pins == SharedEnvironment().pins and ensured == [(env.pins, said.say)]
    planned = local.environment(("torch==2.0",), ensure=False)
    assert planned.pins == ("torch==2.0",) and len(ensured) == 1  # ensure=False: the caller makes it ready
    assert local.environment(("torch==2.0",)).pins == ("torch==2.0",) and ensured[-1][0] == ("torch==2.0",)
    hermetic = Session.open("run", options(tmp_path, out=tmp_path / "out", runner="docker"))
    assert hermetic.runner_class is DockerRunner
    hermetic.environment()
    assert len(ensured) == 2  # docker builds its own image from the pins; the host's environment is left alone


def test_the_runner_and_the_sources_come_from_the_registries_with_the_options(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple] = []
    monkeypatch.setattr(session_module, "build_runner", lambda *a, **kw: calls.append((a, kw)) or "runner")
    monkeypatch.setattr(session_module, "for_matrix", lambda *a: calls.append(a) or "sources")
    said, _ = reporter()
    req = options(tmp_path, out=tmp_path / "out", runner="warm", use_cache=False, source_kind="git", repo="/r")
    session = Session.open("run", req, said)
    env = SharedEnvironment()
    assert session.runner(env, learn=False) == "runner" and session.sources() == "sources"
    assert calls == [(("warm", env, False, said.say), {"learn": False}), ("git", session.matrix, "/r")]


def test_finish_writes_the_record_beside_the_matrix_and_seals_with_the_key_given(tmp_path: Path) -> None:
    private, public = make_key(tmp_path / "keys")
    said, text = reporter()
    session = Session.open("run", options(tmp_path, out=tmp_path / "out", key=private), said)
    with session.folder() as work:
        assert session.finish(work, 1, environment={"python_version": "3.11.9"}) == 1
    out = session.out
    record = json.loads((out / "run.json").read_text())
    assert (record["command"], record["exit_code"], record["fixes"]) == ("run", 1, ["1", "2"])
    assert (out / "matrix.toml").read_bytes() == session.matrix.path.read_bytes()
    assert json.loads((out / "environment.json").read_text()) == {"python_version": "3.11.9"}
    assert "sealed: " in text.getvalue()  # the seal speaks through the session's reporter
    from difflab.cli import main

    assert main(["verify", str(out), "--key", str(public)]) == 0


def test_finish_without_bundle_writes_no_seal_and_no_environment_unless_given(tmp_path: Path) -> None:
    session = Session.open("run", options(tmp_path, out=tmp_path / "out", bundle=False))
    with session.folder() as work:
        session.finish(work, 0)
    assert sorted(p.name for p in session.out.iterdir()) == ["matrix.toml", "run.json"]


def test_a_failed_block_leaves_no_folder(tmp_path: Path) -> None:
    session = Session.open("run", options(tmp_path, out=tmp_path / "out", bundle=False))
    with pytest.raises(RuntimeError), session.folder() as work:
        (work / "half.json").write_text("{")
        raise RuntimeError("the workflow broke")
    assert not session.out.exists() and list(tmp_path.glob("*out*")) == []


class Closable:
    def __init__(self) -> None:
        self.closed = 0

    def close(self) -> None:
        self.closed += 1


class Cached:
    """Shaped like the result cache: the back end it wraps is ``inner``."""

    def __init__(self, inner: object) -> None:
        self.inner = inner


def test_close_runner_stops_the_back_end_also_behind_the_cache_and_leaves_others_alone() -> None:
    plain, wrapped = Closable(), Closable()
    close_runner(plain)
    close_runner(Cached(wrapped))
    assert (plain.closed, wrapped.closed) == (1, 1)
    close_runner(Cached(object()))  # nothing to stop: nothing done, no error
    close_runner(Cached(type("NotCallable", (), {"close": "no"})()))


class Warm:
    """Shaped like the warm back end: a hub started early, stopped when the ``with`` ends."""

    def __init__(self) -> None:
        self.events: list[str] = []

    def start_early(self) -> None:
        self.events.append("start")

    def __enter__(self) -> Warm:
        self.events.append("enter")
        return self

    def __exit__(self, *exc: object) -> None:
        self.events.append("exit")


def test_started_early_starts_a_warm_hub_first_and_stops_it_at_the_end() -> None:
    warm = Warm()
    with started_early(warm):
        warm.events.append("run")
    assert warm.events == ["start", "enter", "run", "exit"]
    with pytest.raises(KeyError), started_early(warm):
        raise KeyError("a failing run still stops the hub")
    assert warm.events[-1] == "exit"
    other = Closable()
    with started_early(other):  # no hub: nothing started, nothing entered
        pass
    assert other.closed == 0
