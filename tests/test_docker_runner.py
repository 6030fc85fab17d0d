"""The docker back end against a real Docker engine (tests/docker_engine.py starts one where it can).

- the image is built from the shared environment without a registry, labelled, reused, and its
  id is what describe() (so run.json) records;
- inside: no network but loopback, the source/probe/child mounts and the root filesystem are
  read-only, CPU and memory limits are set;
- a hang is killed at the timeout and a crash is an ``error`` observation, both with the log;
- a real SGLang probe gives the same observation in docker as in a subprocess, and a whole
  ``difflab run --backend docker`` confirms a fix and records the image;
- the per-probe overhead of docker over the subprocess runner is measured and printed.
"""

from __future__ import annotations

import json
import re
import statistics
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import docker_engine
from difflab.environment.shared import SharedEnvironment
from difflab.errors import EnvironmentSetupError
from difflab.image.build import ensure_image
from difflab.image.catalog import find_image
from difflab.observation import Observation
from difflab.runner import runner_for
from difflab.runner.base import ProbeJob
from difflab.runner.docker import DockerRunner
from difflab.runner.subprocess import SubprocessRunner
from difflab.source.base import MaterialisedSource

pytestmark = [pytest.mark.docker, pytest.mark.xdist_group("docker")]

PROBES = Path(__file__).parent / "probes_docker"
PINNED = re.compile(r"^difflab/cpu-env:[0-9a-f]{16}@sha256:[0-9a-f]{64}$")
COMPARED = ("status", "fields", "events", "problems", "sglang_version")


# -- fixtures -------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def engine() -> Iterator[docker_engine.Engine]:
    found, reason = docker_engine.acquire()
    if found is None:
        pytest.skip(f"no Docker engine: {reason}")
    yield found
    found.stop()


@pytest.fixture(scope="session")
def environment() -> SharedEnvironment:
    return SharedEnvironment().ensure()


@pytest.fixture(scope="session")
def runner(engine: docker_engine.Engine, environment: SharedEnvironment) -> DockerRunner:
    r = DockerRunner(environment=environment, docker_host=engine.host, workers=2, say=print)
    r.ensure()  # builds the image on a fresh engine (~1.5 min), a label lookup afterwards
    return r


@pytest.fixture(scope="session")
def fake_source(tmp_path_factory: pytest.TempPathFactory) -> MaterialisedSource:
    """A stand-in ``sglang`` package: the isolation tests need no real release."""
    root = tmp_path_factory.mktemp("fake-source")
    (root / "sglang").mkdir()
    (root / "sglang" / "__init__.py").write_text("")
    (root / "sglang" / "version.py").write_text('__version__ = "0.0.0+difflab-test"\n')
    return MaterialisedSource(label="fake", kind="test", root=root, identity={"kind": "test"}, digest="0" * 64)


def job(
    probe: str, source: MaterialisedSource, tmp: Path | None = None, timeout_s: float = 120.0, side: str = "head"
) -> ProbeJob:
    return ProbeJob(
        fix_id="t",
        probe=probe,
        side=side,
        source=source,
        probe_file=PROBES / f"{probe}.py",
        log_path=(tmp / f"{probe}-{side}.log") if tmp else None,
        timeout_s=timeout_s,
    )


def same(a: Observation, b: Observation) -> dict[str, tuple[object, object]]:
    """Fields that differ between two observations (errors compared by presence: paths differ)."""
    out = {k: (getattr(a, k), getattr(b, k)) for k in COMPARED if getattr(a, k) != getattr(b, k)}
    if (a.error is None) != (b.error is None):
        out["error"] = (a.error, b.error)
    return out


@pytest.fixture(scope="module")
def sandbox(
    runner: DockerRunner, fake_source: MaterialisedSource, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Observation]:
    tmp = tmp_path_factory.mktemp("sandbox")
    (docker_obs,) = runner.run([job("sandbox", fake_source, tmp)])
    (host_obs,) = SubprocessRunner(workers=1).run([job("sandbox", fake_source)])
    assert docker_obs.status == "ok", docker_obs.error
    assert host_obs.status == "ok", host_obs.error
    return {"docker": docker_obs, "subprocess": host_obs}


# -- the image ------------------------------------------------------------------------------


def test_image_digest_is_recorded(
    runner: DockerRunner, engine: docker_engine.Engine, environment: SharedEnvironment
) -> None:
    info = runner.describe()
    assert info["name"] == "docker"
    assert PINNED.match(info["image"]), info["image"]
    image = engine.client().images.get(info["image_id"])
    assert info["image"].endswith("@" + image.id)
    assert info["env_digest"] == environment.digest == image.labels["org.difflab.env-digest"]
    assert info["engine"]["storage_driver"] == engine.driver
    assert info["network"] == "none"
    json.dumps(info)  # goes into run.json as is


def test_image_is_reused_by_label(
    runner: DockerRunner, engine: docker_engine.Engine, environment: SharedEnvironment
) -> None:
    client = engine.client()
    again = ensure_image(client, environment)
    assert not again.built
    assert again.image.id == runner.ensure().id == find_image(client, environment.digest).id


def test_runner_for_docker_needs_no_options(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DIFFLAB_DOCKER_IMAGE", raising=False)
    r = runner_for("docker")
    assert isinstance(r, DockerRunner) and r.build and r.image is None


def test_unreachable_engine_is_a_clear_setup_error(tmp_path: Path) -> None:
    sock = tmp_path / "nothing.sock"
    r = DockerRunner(docker_host=f"unix://{sock}")
    with pytest.raises(EnvironmentSetupError) as err:
        r.ensure()
    assert str(sock) in str(err.value) and "no Docker engine reachable" in str(err.value)
    assert err.value.exit_code == 2


def test_missing_image_without_build_names_the_command(engine: docker_engine.Engine) -> None:
    env = SharedEnvironment()
    env.__dict__["digest"] = "f" * 64  # an environment the engine has no image for
    r = DockerRunner(environment=env, docker_host=engine.host, build=False)
    with pytest.raises(EnvironmentSetupError, match="difflab image build"):
        r.ensure()


# -- isolation ------------------------------------------------------------------------------


def test_network_is_none(sandbox: dict[str, Observation]) -> None:
    f = sandbox["docker"].fields
    assert f["net.interfaces"] == ["lo"]
    assert f["net.external"] == "ENETUNREACH"  # no route at all, not a firewall timeout
    assert f["net.loopback_port_1"] == "ECONNREFUSED"


def test_mounts_and_root_are_read_only(sandbox: dict[str, Observation]) -> None:
    f = sandbox["docker"].fields
    for where in ("source", "probes", "child", "rootfs"):
        assert f[f"write.{where}"] == "EROFS", where
    assert f["write.tmp"] == f["write.cwd"] == "written"
    assert sandbox["subprocess"].fields["write.source"] == "written"  # the contrast: same probe, no container
    assert f["env.pythonpath"] == "/difflab/child:/difflab/source"  # the lab's package first, the build behind it
    assert f["python.prefix"] == "/opt/difflab/env"


def test_cpu_and_memory_limits(sandbox: dict[str, Observation], runner: DockerRunner) -> None:
    f = sandbox["docker"].fields
    assert f["limits.cpu_quota_us"].split()[0] == str(runner.nano_cpus // 10_000)  # 1 CPU = 100000/100000
    assert f["limits.memory_bytes"] == str(2 * 1024**3)


def test_hang_is_killed_with_the_log(
    runner: DockerRunner, engine: docker_engine.Engine, fake_source: MaterialisedSource, tmp_path: Path
) -> None:
    probes = {"label": "org.difflab.role=probe"}
    before = {c.id for c in engine.client().containers.list(all=True, filters=probes)}  # an earlier, killed run's
    started = time.perf_counter()
    (obs,) = runner.run([job("hang", fake_source, tmp_path, timeout_s=8)])
    assert obs.status == "error" and obs.runner == "docker"
    assert "probe hung: container killed after 8 s" in obs.error
    assert "hanging now" in obs.error
    assert "hanging now" in (tmp_path / "hang-head.log").read_text()
    assert time.perf_counter() - started < 8 + 30
    left = [c for c in engine.client().containers.list(all=True, filters=probes) if c.id not in before]
    assert left == []


def test_crash_is_an_error_observation(runner: DockerRunner, fake_source: MaterialisedSource, tmp_path: Path) -> None:
    obs_crash, obs_ok = runner.run([job("crash", fake_source, tmp_path), job("noop", fake_source, tmp_path)])
    assert obs_crash.status == "error"
    assert "probe container died (exit 3) without a result" in obs_crash.error
    assert "crashing now" in obs_crash.error
    assert obs_ok.status == "ok" and obs_ok.fields == {"noop": True}  # the run goes on


# -- same observations as the subprocess runner, real SGLang ---------------------------------


@pytest.fixture(scope="module")
def releases(matrix) -> dict[str, MaterialisedSource]:
    from difflab.source.release import ReleaseSource

    backend = ReleaseSource(releases=matrix.releases)
    return {v: backend.release(v) for v in ("0.5.20", "0.5.21")}


def _timed(r: object, jobs: list[ProbeJob]) -> tuple[list[Observation], list[float], list[float]]:
    """Observations, wall time per job, and the part of it spent outside the probe's own code."""
    out, wall, outside = [], [], []
    for j in jobs:
        t0 = time.perf_counter()
        (obs,) = r.run([j])  # type: ignore[attr-defined]
        wall.append(time.perf_counter() - t0)
        outside.append(wall[-1] - obs.duration_s)
        out.append(obs)
    return out, wall, outside


@pytest.mark.sglang
def test_same_observation_as_subprocess_on_real_sglang(
    runner: DockerRunner, releases: dict[str, MaterialisedSource], record_property, capsys
) -> None:
    jobs = [
        job("sglang_surface", src, side=side) for side, src in zip(("base", "head"), releases.values(), strict=True)
    ]
    host, host_wall, host_outside = _timed(SubprocessRunner(workers=1), jobs)
    boxed, boxed_wall, boxed_outside = _timed(runner, jobs)
    for h, d in zip(host, boxed, strict=True):
        assert h.status == "ok", h.error
        assert same(h, d) == {}, same(h, d)
        assert d.runner == "docker" and d.source == h.source
    base, head = boxed
    assert base.sglang_version == "0.5.20" and head.sglang_version == "0.5.21"
    assert base.fields["door.has_is_unadmitted_reject"] is False
    assert head.fields["door.has_is_unadmitted_reject"] is True
    # Wall time includes the SGLang import, which swings by seconds on a busy machine; the
    # part outside the probe's own code (process or container life cycle) is the runner's cost.
    overhead = statistics.mean(boxed_outside) - statistics.mean(host_outside)
    record_property("docker_overhead_real_probe_s", round(overhead, 2))
    with capsys.disabled():
        print(
            f"\n[docker overhead] real SGLang probe, wall: subprocess {statistics.mean(host_wall):.2f} s, "
            f"docker {statistics.mean(boxed_wall):.2f} s; outside the probe: subprocess "
            f"{statistics.mean(host_outside):.2f} s, docker {statistics.mean(boxed_outside):.2f} s "
            f"({overhead:+.2f} s per probe)"
        )


def test_overhead_per_probe(runner: DockerRunner, fake_source: MaterialisedSource, record_property, capsys) -> None:
    """The runner's own cost: a probe that does nothing, five times each, interleaved."""
    host_r = SubprocessRunner(workers=1)
    host_s, boxed_s = [], []
    for _ in range(5):
        host_s += _timed(host_r, [job("noop", fake_source)])[1]
        boxed_s += _timed(runner, [job("noop", fake_source)])[1]
    h, d = statistics.median(host_s), statistics.median(boxed_s)
    record_property("docker_overhead_noop_s", round(d - h, 3))
    with capsys.disabled():
        print(
            f"\n[docker overhead] empty probe, median of 5: subprocess {h:.2f} s, docker {d:.2f} s "
            f"(+{d - h:.2f} s per probe, storage driver {runner.describe()['engine']['storage_driver']})"
        )
    assert d < 30


@pytest.mark.sglang
def test_difflab_run_backend_docker(
    engine: docker_engine.Engine, runner: DockerRunner, releases, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The whole pipeline on the docker back end: a verdict from containers, the image in run.json."""
    from difflab.workflows.run import RunRequest, execute
    from matrix_samples import RELEASES

    matrix = tmp_path / "m.toml"
    matrix.write_text(
        RELEASES
        + """
[[fixes]]
id = "38935"
pr = 38935
title = "door check exists"
base = { release = "0.5.20" }
head = { release = "0.5.21" }
[[fixes.probes]]
name = "sglang_surface"
[fixes.probes.expect]
"door.has_is_unadmitted_reject" = [false, true]
[fixes.probes.controls]
"prefill.has_bootstrap_queue" = true
"""
    )
    monkeypatch.setenv("DIFFLAB_PROBES", str(PROBES))
    out = tmp_path / "out"
    outcome = execute(
        RunRequest(
            matrix=matrix,
            out=out,
            runner="docker",
            bundle=False,
            argv=["test"],
            runner_options={"docker_host": engine.host},
        )
    )
    diff = json.loads((out / "diff.json").read_text())
    assert [f["verdict"] for f in diff["fixes"]] == ["confirmed"], diff
    assert outcome.exit_code == 0
    run = json.loads((out / "run.json").read_text())
    assert run["runner"]["image"] == runner.describe()["image"]
    obs = json.loads((out / "observations" / "38935" / "head" / "sglang_surface.json").read_text())
    assert obs["runner"] == "docker"


def test_cli_image_build_reuses_and_show_prints(
    engine: docker_engine.Engine, runner: DockerRunner, capsys: pytest.CaptureFixture[str]
) -> None:
    from difflab.cli import main

    assert main(["image", "build", "--docker-host", engine.host]) == 0
    built = json.loads(capsys.readouterr().out)
    assert built["built"] is False and built["image"] == runner.describe()["image"]
    assert main(["image", "show", "--docker-host", engine.host]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["image_id"] == built["image_id"] and shown["labels"]["org.difflab.recipe"]


def test_out_of_memory_is_an_error_observation(
    runner: DockerRunner, fake_source: MaterialisedSource, tmp_path: Path
) -> None:
    small = DockerRunner(environment=runner.environment, docker_host=runner.docker_host, mem_limit="256m", workers=1)
    (obs,) = small.run([job("hog", fake_source, tmp_path)])
    assert obs.status == "error"
    assert "out of memory (limit 256m)" in obs.error and "allocating" in obs.error
