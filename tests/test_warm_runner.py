"""The warm runner: one forking server per source, isolated probes, crashes and hangs as errors.

Most tests drive the real hub/server/fork machinery with the host interpreter
and toy probes against toy "sources" (a folder holding a module the server
preloads), so they run in about a second. One test (marked ``sglang``)
checks that a real probe on a real release observes exactly what a fresh
process observes.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from difflab.observation import Observation
from difflab.runner.base import ProbeJob
from difflab.runner.warm import WarmRunner
from difflab.source.base import MaterialisedSource


@dataclass
class HostEnvironment:
    """Stands in for the shared environment: this interpreter, which has nothing of SGLang."""

    python: Path = field(default_factory=lambda: Path(sys.executable))
    digest: str = "host-test"
    ready: bool = True


PROBES = {
    # Sees the source's module and patches it and the standard library; the next probe must not notice.
    "toy_patch": """
import string
import toymod

def observe(kit):
    seen = {"string.marker": getattr(string, "difflab_marker", None), "toymod.value": toymod.VALUE,
            "toymod.calls": list(toymod.CALLS), "capwords": string.capwords("a b")}
    string.difflab_marker = "patched"
    string.capwords = lambda *a, **k: "broken"
    toymod.VALUE = "patched"
    toymod.CALLS.append(1)
    print("toy_patch ran")
    return seen
""",
    "toy_crash": """
import os

def observe(kit):
    print("about to crash", flush=True)
    os.kill(os.getpid(), 9)
""",
    "toy_hang": """
import time

def observe(kit):
    print("hanging", flush=True)
    time.sleep(120)
""",
    "toy_raise": """
def observe(kit):
    raise ValueError("probe broke")
""",
}


@pytest.fixture
def lab(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("DIFFLAB_CACHE", str(tmp_path / "cache"))
    probes = tmp_path / "probes"
    probes.mkdir()
    for name, text in PROBES.items():
        (probes / f"{name}.py").write_text(text)
    return tmp_path


def toy_source(lab: Path, name: str, module: str = "VALUE = {name!r}\nCALLS = []\n") -> MaterialisedSource:
    root = lab / "sources" / name
    root.mkdir(parents=True, exist_ok=True)
    (root / "toymod.py").write_text(module.format(name=name))
    return MaterialisedSource(
        label=name, kind="toy", root=root, identity={"kind": "toy", "name": name}, digest=f"toy:{name}"
    )


def job(lab: Path, probe: str, source: MaterialisedSource, n: int = 0, timeout_s: float = 30.0) -> ProbeJob:
    return ProbeJob(
        fix_id="f",
        probe=probe,
        side=f"{source.label}-{n}",
        source=source,
        probe_file=lab / "probes" / f"{probe}.py",
        log_path=lab / "logs" / source.label / f"{probe}-{n}.log",
        timeout_s=timeout_s,
    )


def runner(**options: Any) -> WarmRunner:
    options.setdefault("learn", False)
    options.setdefault("hub_preload", ())
    options.setdefault("keep_s", 0.0)  # a hub for this runner only (the kept hub has tests of its own)
    return WarmRunner(
        environment=HostEnvironment(),
        server_preload=("toymod",),  # type: ignore[arg-type]
        **options,
    )


def test_probes_in_one_server_never_see_each_others_patches(lab: Path) -> None:
    src = toy_source(lab, "a")
    jobs = [job(lab, "toy_patch", src, n) for n in range(4)]
    with runner(parallel=2) as r:
        obs = r.run(jobs)
    assert [o.status for o in obs] == ["ok"] * 4, [o.error for o in obs]
    for o in obs:
        assert o.fields == {"string.marker": None, "toymod.value": "a", "toymod.calls": [], "capwords": "A B"}
        assert o.runner == "warm"
    assert [s["server"] for s in r.stats["servers"]] == ["s1"]  # one import for the four probes
    assert "toy_patch ran" in jobs[0].log_path.read_text()  # type: ignore[union-attr]


def test_one_server_per_source_and_results_in_job_order(lab: Path) -> None:
    a, b = toy_source(lab, "a"), toy_source(lab, "b")
    jobs = [job(lab, "toy_patch", src, n) for n, src in enumerate([a, b, a, b, a])]
    seen: list[Observation] = []
    with runner(workers=1, parallel=2) as r:
        obs = r.run(jobs, on_done=seen.append)
    assert [o.fields["toymod.value"] for o in obs] == ["a", "b", "a", "b", "a"]
    assert [o.side for o in obs] == [j.side for j in jobs]
    assert len(seen) == 5 and len(r.stats["servers"]) == 2


def test_crash_and_hang_become_errors_with_their_logs(lab: Path) -> None:
    src = toy_source(lab, "a")
    jobs = [
        job(lab, "toy_crash", src),
        job(lab, "toy_hang", src, timeout_s=1.0),
        job(lab, "toy_raise", src),
        job(lab, "toy_patch", src),
    ]
    with runner() as r:
        crash, hang, raised, fine = r.run(jobs)
    assert crash.status == "error" and "died (killed by signal 9 (SIGKILL)) without a result" in (crash.error or "")
    assert "about to crash" in (crash.error or "")
    assert hang.status == "error" and "probe hung: killed after 1 s" in (hang.error or "")
    assert "hanging" in (hang.error or "") and hang.duration_s < 10
    assert raised.status == "error" and "ValueError: probe broke" in (raised.error or "")
    assert fine.status == "ok"  # the server survived all three


def test_a_server_that_cannot_fork_safely_falls_back_to_fresh_processes(lab: Path) -> None:
    threaded = (
        "import threading, time\nVALUE = 'threaded'\nCALLS = []\n"
        "threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"
    )
    src = toy_source(lab, "t", threaded)
    with runner() as r:
        (obs,) = r.run([job(lab, "toy_patch", src)])
    assert obs.status == "ok" and obs.runner == "subprocess", obs.error
    assert obs.fields["toymod.value"] == "threaded"
    assert "threads" in r.stats["fallbacks"][0]["reason"] and r.describe()["fallbacks"] == 1


def test_a_server_that_dies_while_importing_falls_back(lab: Path) -> None:
    src = toy_source(
        lab,
        "dies",
        "import os, sys\nif sys.argv[0].endswith('hub.py'): os._exit(3)\nVALUE = 'survived'\nCALLS = []\n",
    )
    with runner() as r:
        (obs,) = r.run([job(lab, "toy_patch", src)])
    assert obs.status == "ok" and obs.runner == "subprocess" and obs.fields["toymod.value"] == "survived"
    assert "server exited (exit 3)" in r.stats["fallbacks"][0]["reason"]


def test_the_hub_outlives_a_run_and_stops_on_close(lab: Path) -> None:
    src = toy_source(lab, "a")
    r = runner()
    r.run([job(lab, "toy_patch", src)])
    hub = r._hub
    assert hub is not None and hub.alive
    r.run([job(lab, "toy_patch", src, 1)])
    assert r._hub is hub
    r.close()
    assert not hub.alive


def test_a_hub_started_early_is_the_one_the_run_uses(lab: Path) -> None:
    src = toy_source(lab, "a")
    with runner() as r:
        r.start_early()
        early = r._hub
        assert early is not None and not early.ready  # started, not waited for
        (obs,) = r.run([job(lab, "toy_patch", src)])
        assert r._hub is early and obs.status == "ok" and obs.runner == "warm"
        assert len(r.stats["hubs"]) == 1


def test_no_early_start_without_a_ready_environment(lab: Path) -> None:
    r = WarmRunner(environment=HostEnvironment(ready=False), learn=False)  # type: ignore[arg-type]
    r.start_early()
    assert r._hub is None


def test_a_hub_still_importing_is_killed_at_once_on_close(lab: Path) -> None:
    from difflab.runner import childlib

    (childlib.stage() / "difflab_test_slow.py").write_text("import time\ntime.sleep(60)\n")
    r = runner(hub_preload=("difflab_test_slow",))
    r.start_early()
    hub = r._hub
    assert hub is not None
    started = time.monotonic()
    r.close()
    assert time.monotonic() - started < 5 and not hub.alive  # not the 10 s a serving hub is given


def test_the_hub_learns_what_servers_import_and_forgets_a_list_that_breaks_forking(lab: Path) -> None:
    from difflab.runner import childlib

    src = toy_source(lab, "a", "import difflib\nVALUE = {name!r}\nCALLS = []\n")
    with runner(learn=True) as r:
        r.run([job(lab, "toy_patch", src)])
        learned = r._learned_file()
    assert "difflib" in learned.read_text().split() and "toymod" not in learned.read_text().split()
    # A module on the hub's path that starts a thread: a hub that imports it cannot fork safely.
    (childlib.stage() / "difflab_test_threads.py").write_text(
        "import threading, time\nthreading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"
    )
    learned.write_text("difflab_test_threads\n")
    with runner(learn=True) as r:
        (obs,) = r.run([job(lab, "toy_patch", src, 1)])
    assert obs.status == "ok" and obs.runner == "warm" and not r.stats["fallbacks"]
    assert "difflab_test_threads" not in (learned.read_text() if learned.exists() else "")
    # A learned name the hub cannot import (made up by a library at run time) is dropped.
    learned.write_text("difflab_no_such_module\ndifflib\n")
    with runner(learn=True) as r:
        r.run([job(lab, "toy_patch", src, 2)])
    assert learned.read_text().split() == ["difflib"]


@pytest.mark.sglang
@pytest.mark.xdist_group("release")
def test_warm_observes_what_a_fresh_process_observes(tmp_path: Path, matrix) -> None:
    from difflab.environment.shared import SharedEnvironment
    from difflab.paths import probes_dir
    from difflab.runner.subprocess import SubprocessRunner
    from difflab.source.release import ReleaseSource

    env = SharedEnvironment().ensure()
    src = ReleaseSource(matrix.releases).release("0.5.21")

    def one(kind: str) -> ProbeJob:
        return ProbeJob(
            fix_id="38935",
            probe="pr38935_prefill_door",
            side="head",
            source=src,
            probe_file=probes_dir() / "pr38935_prefill_door.py",
            log_path=tmp_path / kind / "p.log",
        )

    with WarmRunner(environment=env) as warm:
        (w,) = warm.run([one("warm")])
    (s,) = SubprocessRunner(environment=env).run([one("subprocess")])
    assert w.status == s.status == "ok", (w.error, s.error)
    for name in ("fields", "events", "problems", "error", "sglang_version", "source", "fix", "probe", "side"):
        assert getattr(w, name) == getattr(s, name), name
    assert w.runner == "warm" and s.runner == "subprocess"
    assert (tmp_path / "warm" / "p.log").is_file()
