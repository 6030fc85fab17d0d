"""What the GPU tier would start, checked without an engine; and the host check's reasons."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from difflab.engine import names
from difflab.gpu.deployment import DeploymentConfig, Ports, build_specs, place
from difflab.gpu.host import check_host
from difflab.gpu.images import ImageMap, parse_image

IMAGE = parse_image("lmsysorg/sglang:v0.5.21@sha256:" + "c" * 64)


def argv_pairs(command) -> dict[str, str]:
    args = list(command)
    return {a: args[i + 1] for i, a in enumerate(args[:-1]) if a.startswith("--")}


def test_one_prefill_one_decode_and_a_router():
    specs = build_specs(DeploymentConfig(side="head", image=IMAGE, hf_cache=Path("/srv/hf")))
    assert set(specs) == {"prefill", "decode", "router"}
    prefill, decode, router = specs["prefill"], specs["decode"], specs["router"]
    for spec, mode, port in ((prefill, "prefill", "30000"), (decode, "decode", "30001")):
        assert spec.command[:3] == ("python3", "-m", "sglang.launch_server")
        p = argv_pairs(spec.command)
        assert p["--disaggregation-mode"] == mode and p["--disaggregation-transfer-backend"] == "mooncake"
        assert p["--disaggregation-bootstrap-port"] == "8998" and "--enable-metrics" in spec.command
        assert p["--model-path"] == "Qwen/Qwen3-0.6B" and p["--load-format"] == "dummy" and p["--port"] == port
        assert spec.image == IMAGE.pinned and "@sha256:" in spec.image  # started by digest, never by tag
        assert (spec.network_mode, spec.ipc_mode, spec.privileged, spec.memlock) == ("host", "host", True, -1)
        assert spec.gpu_ids == ("0", "1")
        assert spec.environment[names.DEFERRED_ENV] == "1" and spec.environment["MC_FORCE_TCP"] == "1"
        assert spec.volumes == {"/srv/hf": {"bind": "/root/.cache/huggingface", "mode": "ro"}}
    assert argv_pairs(decode.command)["--base-gpu-id"] == "1"
    assert argv_pairs(prefill.command)["--max-total-tokens"] == "16384"  # pool below the 40960 context
    assert "--base-gpu-id" not in prefill.command
    assert router.command == (
        "python3",
        "-m",
        "sglang_router.launch_router",
        "--pd-disaggregation",
        "--mini-lb",
        "--prefill",
        "http://127.0.0.1:30000",
        "8998",
        "--decode",
        "http://127.0.0.1:30001",
        "--host",
        "127.0.0.1",
        "--port",
        "8000",
    )
    assert router.gpu_ids == () and not router.privileged


def test_rdma_devices_replace_tcp_when_present():
    spec = build_specs(DeploymentConfig(side="base", image=IMAGE, rdma=True))["decode"]
    assert spec.devices == ("/dev/infiniband:/dev/infiniband",) and "MC_FORCE_TCP" not in spec.environment


def test_docker_sdk_arguments():
    from docker.types import DeviceRequest, Ulimit

    kwargs = build_specs(DeploymentConfig(side="base", image=IMAGE, rdma=True))["prefill"].run_kwargs()
    assert kwargs["detach"] and kwargs["network_mode"] == "host" and kwargs["ipc_mode"] == "host"
    (request,) = kwargs["device_requests"]
    assert isinstance(request, DeviceRequest) and request["DeviceIDs"] == ["0", "1"]
    assert request["Capabilities"] == [["gpu"]]
    (ulimit,) = kwargs["ulimits"]
    assert isinstance(ulimit, Ulimit) and (ulimit.name, ulimit.soft, ulimit.hard) == ("memlock", -1, -1)
    assert kwargs["devices"] == ["/dev/infiniband:/dev/infiniband"]


def test_placement_on_one_two_and_four_gpus():
    cfg = DeploymentConfig(side="base", image=IMAGE)
    one = place(cfg, ["0"], None)
    assert one.gpus == ("0",) and one.shared_gpu
    shared = build_specs(one)["decode"].command
    assert argv_pairs(shared)["--base-gpu-id"] == "0" and argv_pairs(shared)["--mem-fraction-static"] == "0.4"
    assert place(cfg, ["0", "1", "2", "3"], None).gpus == ("0", "1")  # taking turns: the first pair
    second = place(cfg, ["0", "1", "2", "3"], 1)
    assert second.gpus == ("2", "3") and second.ports == Ports().shifted(1000)
    assert argv_pairs(build_specs(second)["router"].command)["--prefill"] == "http://127.0.0.1:31000"
    with pytest.raises(ValueError, match="slot 2 needs GPUs 4 and 5"):
        place(cfg, ["0", "1", "2", "3"], 2)
    names_ = {s.name for s in build_specs(cfg).values()}
    assert names_ == {f"difflab-base-cccccccccccc-{r}" for r in ("prefill", "decode", "router")}


class FakeDocker:
    def __init__(self, runtimes=None, error=None):
        self.runtimes, self.error = runtimes or {}, error

    def __call__(self):
        if self.error:
            raise self.error
        return self

    def ping(self):
        return True

    def info(self):
        return {"Runtimes": self.runtimes, "DefaultRuntime": "runc"}


def smi(stdout: str, code: int = 0):
    return lambda argv: subprocess.CompletedProcess(argv, code, stdout, "driver mismatch" if code else "")


def test_host_check_names_every_missing_prerequisite(tmp_path: Path):
    check = check_host(FakeDocker(error=RuntimeError("socket missing")), lambda name: None, smi(""), tmp_path / "none")
    assert not check.ok and len(check.missing) == 2
    assert "no Docker engine reachable" in check.missing[0] and "socket missing" in check.missing[0]
    assert check.missing[1] == "nvidia-smi not found on PATH (no NVIDIA driver on this host)"
    assert check.reason.startswith("GPU tier skipped: ")
    no_runtime = check_host(
        FakeDocker({"runc": {}}),
        lambda n: "/usr/bin/nvidia-smi",
        smi("GPU 0: H200 (UUID: x)\n"),
        tmp_path / "none",
    )
    assert no_runtime.missing == [
        "the Docker engine has no 'nvidia' runtime (runtimes: runc); install nvidia-container-toolkit"
    ]
    broken = check_host(FakeDocker({"nvidia": {}}), lambda n: "/x/nvidia-smi", smi("", 9), tmp_path / "none")
    assert broken.missing == ["nvidia-smi -L exited 9: driver mismatch"]


def test_host_check_ready(tmp_path: Path):
    (tmp_path / "infiniband").mkdir()
    listing = "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1)\nGPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-2)\n"
    check = check_host(
        FakeDocker({"nvidia": {}, "runc": {}}),
        lambda n: "/usr/bin/nvidia-smi",
        smi(listing),
        tmp_path / "infiniband",
    )
    assert check.ok and check.gpus == ["0", "1"] and check.rdma
    assert check.details["gpu_names"] == ["NVIDIA H100 80GB HBM3"] * 2


@pytest.mark.gpu
def test_real_deployment_comes_up_and_answers(tmp_path: Path, matrix):
    """Starts one side for real; skipped, with exactly what is missing, on a machine without GPUs."""
    host = check_host()
    if not host.ok:
        pytest.skip(host.reason)
    images = os.environ.get("DIFFLAB_GPU_IMAGES")
    if not images:
        pytest.skip("DIFFLAB_GPU_IMAGES is not set (a TOML [images] table of REF@sha256 digests)")
    table = tmp_path / "images.toml"
    table.write_text(images)
    from difflab.gpu.deployment import DockerDeployment

    image = ImageMap.from_args(None, table).resolve(matrix.fix("38935"), "head", single_fix=True)
    cfg = place(DeploymentConfig(side="head", image=image, rdma=host.rdma), host.gpus, None)
    deployment = DockerDeployment(cfg)
    try:
        ep = deployment.up()
        assert ep.router.generate("Hello", max_new_tokens=4).ok
        assert ep.decode.metrics().has("sglang:max_total_num_tokens")
    finally:
        deployment.down()


# -- the Docker code path without an engine: a fake SDK whose "containers" are a test deployment ----
class FakeContainer:
    def __init__(self, kwargs, status="running", log=b""):
        self.kwargs, self.status, self._log, self.attrs = kwargs, status, log, {"State": {"ExitCode": 1}}
        self.removed = False

    def reload(self):
        pass

    def logs(self, tail=200):
        return self._log

    def remove(self, force=False):
        self.removed = True


class FakeContainers:
    """Records every run; a bench container runs the built-in load against the URL it was given."""

    def __init__(self, status="running"):
        self.runs, self.live, self.status = [], {}, status

    def run(self, **kwargs):
        from difflab.engine.client import EngineClient
        from difflab.gpu.bench import BenchSpec, run_load

        self.runs.append(kwargs)
        if kwargs["labels"].get("org.sglang-difflab.tier") == "bench":
            argv = kwargs["command"]
            url, out = argv[argv.index("--base-url") + 1], argv[argv.index("--output-file") + 1]
            host_dir = next(h for h, m in kwargs["volumes"].items() if m["bind"] == "/bench")
            run_load(
                EngineClient(url),
                BenchSpec(num_prompts=2, input_len=8, output_len=4, max_concurrency=2),
                1,
                Path(host_dir) / Path(out).name,
                timeout_s=10,
            )
            return None
        container = FakeContainer(kwargs, self.status, b"CUDA error: no kernel image\n")
        self.live[kwargs["name"]] = container
        return container

    def get(self, name):
        from docker.errors import NotFound

        if name not in self.live:
            raise NotFound(f"No such container: {name}")
        return self.live.pop(name)


class FakeClient:
    def __init__(self, status="running"):
        self.containers = FakeContainers(status)


def test_docker_target_runs_scenarios_and_bench_through_the_docker_code(tmp_path: Path):
    from difflab.gpu.bench import BenchSpec
    from difflab.gpu.scenarios import Limits, OversizedPrompt
    from difflab.gpu.targets import DockerTarget
    from difflab.testing.testserver import TestDeployment, head_config

    with TestDeployment(head_config()) as dep:
        port = {r: int(dep.url(r).rsplit(":", 1)[1]) for r in ("prefill", "decode", "router")}
        cfg = DeploymentConfig(
            side="head", image=IMAGE, ports=Ports(port["prefill"], port["decode"], port["router"], 8998)
        )
        client = FakeClient()
        target = DockerTarget(cfg, BenchSpec(), seed=1, persistent=False, client=client)
        with target.session() as ep:
            out = OversizedPrompt().run(ep, Limits(request_timeout_s=10, at_once_s=1))
        assert out.fields["oversized.rejected_at_once"] is True
        started = [r["name"].rsplit("-", 1)[1] for r in client.containers.runs]
        assert started == ["prefill", "decode", "router"]
        assert client.containers.live == {}  # taken down after the session (not persistent)
        result = target.bench(0, tmp_path / "head-round0.jsonl")
        assert result.completed == 2 and (tmp_path / "head-round0.jsonl").exists()
        bench_run = client.containers.runs[-1]
        assert bench_run["image"] == IMAGE.pinned and bench_run["network_mode"] == "host"
        assert bench_run["command"][:3] == ["python3", "-m", "sglang.bench_serving"]
        assert target.engine_env()["decode"][names.DEFERRED_ENV] == "1"


def test_a_container_that_exits_fails_with_its_logs():
    from difflab.gpu.deployment import DeploymentError, DockerDeployment

    cfg = DeploymentConfig(side="base", image=IMAGE, ports=Ports(9, 9, 9, 8998))  # nothing answers on port 9
    client = FakeClient(status="exited")
    with pytest.raises(DeploymentError, match=r"(?s)prefill container exited \(1\).*CUDA error: no kernel image"):
        DockerDeployment(cfg, client).up(ready_timeout_s=5)
    assert client.containers.live == {}  # cleaned up after the failure
