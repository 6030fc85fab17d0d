"""One side's 1-prefill/1-decode deployment plus router, as Docker containers.

The container specs are plain data (:class:`ContainerSpec`), built by pure
functions and turned into docker SDK calls only in :class:`DockerDeployment`, so
what would be started is testable on a machine without GPUs or an engine.
Commands follow SGLang's documented PD launch (see the facts file):
``python -m sglang.launch_server ... --disaggregation-mode prefill|decode
--disaggregation-transfer-backend mooncake --disaggregation-bootstrap-port 8998
--enable-metrics`` (decode on ``--base-gpu-id 1``) and ``python -m
sglang_router.launch_router --pd-disaggregation --mini-lb --prefill URL 8998
--decode URL``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from difflab.engine import names
from difflab.engine.client import EngineClient
from difflab.errors import DifflabError
from difflab.gpu.images import ImageRef
from difflab.gpu.scenarios.base import Endpoints

DEFAULT_MODEL = "Qwen/Qwen3-0.6B"
LOOPBACK = "127.0.0.1"
LABEL = "org.sglang-difflab.tier"
HF_CACHE_IN_CONTAINER = "/root/.cache/huggingface"
RDMA_PATH = "/dev/infiniband"


class DeploymentError(DifflabError):
    """A deployment did not come up; the message carries the containers' last log lines."""

    exit_code = 1


@dataclass(frozen=True)
class Ports:
    prefill: int = 30000
    decode: int = 30001
    router: int = 8000
    bootstrap: int = 8998

    def shifted(self, offset: int) -> Ports:
        return Ports(self.prefill + offset, self.decode + offset, self.router + offset, self.bootstrap + offset)


@dataclass(frozen=True)
class DeploymentConfig:
    """Everything that decides what one side runs."""

    side: str
    image: ImageRef
    model: str = DEFAULT_MODEL
    load_format: str = "dummy"  # "auto" when a scenario needs real weights (canary markers)
    gpus: tuple[str, ...] = ("0", "1")  # prefill on the first; decode on the second, or shares one GPU
    ports: Ports = field(default_factory=Ports)
    rdma: bool = False
    prefill_max_total_tokens: int | None = 16384  # below Qwen3-0.6B's 40960 context: the #38935 door exists
    deferred_release: bool | None = True  # explicit on both sides (the default flips in 0.5.21)
    deferred_timeout_s: float = 10.0
    extra_env: dict[str, str] = field(default_factory=dict)
    hf_cache: Path | None = None
    shm_size: str = "16g"

    @property
    def shared_gpu(self) -> bool:
        return len(self.gpus) == 1


@dataclass(frozen=True)
class ContainerSpec:
    """The arguments of one ``docker run``, as data."""

    name: str
    role: str
    image: str
    command: tuple[str, ...]
    environment: dict[str, str]
    gpu_ids: tuple[str, ...]
    devices: tuple[str, ...] = ()
    volumes: dict[str, dict[str, str]] = field(default_factory=dict)
    network_mode: str = "host"
    ipc_mode: str = "host"
    privileged: bool = True
    memlock: int = -1  # unlimited: RDMA registers (pins) the KV pool
    shm_size: str = "16g"
    labels: dict[str, str] = field(default_factory=dict)

    def run_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``docker.from_env().containers.run``."""
        from docker.types import DeviceRequest, Ulimit

        kwargs: dict[str, Any] = {
            "image": self.image,
            "command": list(self.command),
            "name": self.name,
            "detach": True,
            "environment": dict(self.environment),
            "network_mode": self.network_mode,
            "ipc_mode": self.ipc_mode,
            "privileged": self.privileged,
            "ulimits": [Ulimit(name="memlock", soft=self.memlock, hard=self.memlock)],
            "shm_size": self.shm_size,
            "labels": dict(self.labels),
            "volumes": dict(self.volumes),
        }
        if self.gpu_ids:
            kwargs["device_requests"] = [DeviceRequest(device_ids=list(self.gpu_ids), capabilities=[["gpu"]])]
        if self.devices:
            kwargs["devices"] = list(self.devices)
        return kwargs


def engine_env(cfg: DeploymentConfig) -> dict[str, str]:
    """The environment both engines get: explicit deferred release, and TCP when there is no RDMA."""
    env = {"PYTHONUNBUFFERED": "1"}
    if cfg.deferred_release is not None:
        env[names.DEFERRED_ENV] = "1" if cfg.deferred_release else "0"
        env[names.DEFERRED_TIMEOUT_ENV] = f"{cfg.deferred_timeout_s:g}"
    if not cfg.rdma:
        env["MC_FORCE_TCP"] = "1"  # Mooncake over TCP on a host without InfiniBand/RoCE devices (unverified)
    if cfg.hf_cache is not None:
        env["HF_HUB_OFFLINE"] = "1"
    env.update(cfg.extra_env)
    return env


def launch_server_argv(cfg: DeploymentConfig, role: str) -> list[str]:
    port = cfg.ports.prefill if role == "prefill" else cfg.ports.decode
    argv = [
        "python3",
        "-m",
        "sglang.launch_server",
        "--model-path",
        cfg.model,
        "--disaggregation-mode",
        role,
        "--disaggregation-transfer-backend",
        "mooncake",
        "--disaggregation-bootstrap-port",
        str(cfg.ports.bootstrap),
        "--enable-metrics",
        "--host",
        LOOPBACK,
        "--port",
        str(port),
        "--load-format",
        cfg.load_format,
    ]
    if role == "decode":
        argv += ["--base-gpu-id", "0" if cfg.shared_gpu else "1"]
    if role == "prefill" and cfg.prefill_max_total_tokens:
        argv += ["--max-total-tokens", str(cfg.prefill_max_total_tokens)]
    if cfg.shared_gpu:
        argv += ["--mem-fraction-static", "0.4"]  # two engines on one GPU
    return argv


def router_argv(cfg: DeploymentConfig) -> list[str]:
    return [
        "python3",
        "-m",
        "sglang_router.launch_router",
        "--pd-disaggregation",
        "--mini-lb",
        "--prefill",
        f"http://{LOOPBACK}:{cfg.ports.prefill}",
        str(cfg.ports.bootstrap),
        "--decode",
        f"http://{LOOPBACK}:{cfg.ports.decode}",
        "--host",
        LOOPBACK,
        "--port",
        str(cfg.ports.router),
    ]


def container_prefix(cfg: DeploymentConfig) -> str:
    """Unique per image, so two sides can be up at once and a crashed run's leftovers are found again."""
    return f"difflab-{cfg.side}-{cfg.image.digest.removeprefix('sha256:')[:12]}"


def build_specs(cfg: DeploymentConfig) -> dict[str, ContainerSpec]:
    """Prefill, decode and router containers for one side."""
    gpu_pair = tuple(cfg.gpus[:2])
    volumes = {str(cfg.hf_cache): {"bind": HF_CACHE_IN_CONTAINER, "mode": "ro"}} if cfg.hf_cache else {}
    devices = (f"{RDMA_PATH}:{RDMA_PATH}",) if cfg.rdma else ()
    labels = {LABEL: "gpu", f"{LABEL}.side": cfg.side, f"{LABEL}.image": str(cfg.image)}
    common = dict(image=cfg.image.pinned, volumes=volumes, shm_size=cfg.shm_size)
    env = engine_env(cfg)
    specs = {
        role: ContainerSpec(
            name=f"{container_prefix(cfg)}-{role}",
            role=role,
            command=tuple(launch_server_argv(cfg, role)),
            environment=env,
            gpu_ids=gpu_pair,
            devices=devices,
            labels={**labels, f"{LABEL}.role": role},
            **common,
        )
        for role in ("prefill", "decode")
    }
    specs["router"] = ContainerSpec(
        name=f"{container_prefix(cfg)}-router",
        role="router",
        command=tuple(router_argv(cfg)),
        environment={"PYTHONUNBUFFERED": "1"},
        gpu_ids=(),
        privileged=False,
        labels={**labels, f"{LABEL}.role": "router"},
        **common,
    )
    return specs


def place(cfg: DeploymentConfig, gpus: list[str], slot: int | None) -> DeploymentConfig:
    """GPUs and ports for a side. ``slot`` None: sides take turns on the first pair (or one shared GPU);
    an integer: this side stays up beside others on its own pair ``gpus[2*slot:2*slot+2]`` and ports."""
    if slot is None:
        return replace(cfg, gpus=tuple(gpus[:2]) if len(gpus) >= 2 else tuple(gpus[:1]), ports=Ports())
    pair = tuple(gpus[2 * slot : 2 * slot + 2])
    if len(pair) != 2:
        raise ValueError(f"slot {slot} needs GPUs {2 * slot} and {2 * slot + 1}; the host has {len(gpus)}")
    return replace(cfg, gpus=pair, ports=Ports().shifted(1000 * slot))


class DockerDeployment:
    """Start, wait for, and remove one side's containers."""

    def __init__(self, cfg: DeploymentConfig, client: Any = None) -> None:
        self.cfg = cfg
        self.specs = build_specs(cfg)
        self._client = client
        self._containers: dict[str, Any] = {}

    @property
    def client(self) -> Any:
        if self._client is None:
            import docker

            self._client = docker.from_env(timeout=120)
        return self._client

    def endpoints(self, timeout_s: float = 120.0) -> Endpoints:
        p = self.cfg.ports
        return Endpoints.from_urls(
            f"http://{LOOPBACK}:{p.router}",
            f"http://{LOOPBACK}:{p.prefill}",
            f"http://{LOOPBACK}:{p.decode}",
            timeout_s,
        )

    def up(self, ready_timeout_s: float = 900.0) -> Endpoints:
        """Start prefill and decode, then the router once both are healthy; raise with logs on failure."""
        from docker.errors import DockerException

        self.down()
        ep = self.endpoints()
        try:
            for role in ("prefill", "decode"):
                self._containers[role] = self.client.containers.run(**self.specs[role].run_kwargs())
            self._wait({"prefill": ep.prefill, "decode": ep.decode}, ready_timeout_s)
            self._containers["router"] = self.client.containers.run(**self.specs["router"].run_kwargs())
            self._wait({"router": ep.router}, 120.0)
        except (DockerException, DeploymentError) as exc:
            logs = self.logs(tail=30)
            self.down()
            detail = "\n".join(f"--- {r} ---\n{text}" for r, text in logs.items())
            raise DeploymentError(
                f"{self.cfg.side} deployment ({self.cfg.image}) did not come up: {exc}\n{detail}"
            ) from exc
        return ep

    def _wait(self, clients: dict[str, EngineClient], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        pending = dict(clients)
        while pending:
            for role, client in list(pending.items()):
                if client.health(timeout=5.0):
                    del pending[role]
                    continue
                container = self._containers.get(role)
                if container is not None:
                    container.reload()
                    if container.status in ("exited", "dead"):
                        raise DeploymentError(f"{role} container exited ({container.attrs['State'].get('ExitCode')})")
            if pending and time.monotonic() > deadline:
                raise DeploymentError(f"not healthy after {timeout_s:.0f}s: {', '.join(pending)}")
            if pending:
                time.sleep(2.0)

    def logs(self, tail: int = 200) -> dict[str, str]:
        out = {}
        for role, container in self._containers.items():
            try:
                out[role] = container.logs(tail=tail).decode("utf-8", "replace")
            except Exception as exc:  # a vanished container has no logs; say so instead
                out[role] = f"(no logs: {exc})"
        return out

    def down(self) -> None:
        """Remove this side's containers (also leftovers of an earlier, crashed run with the same names)."""
        from docker.errors import DockerException, NotFound

        for spec in self.specs.values():
            try:
                self.client.containers.get(spec.name).remove(force=True)
            except NotFound:
                pass
            except DockerException:
                pass  # removal is best effort; the next up() tries again and fails loudly if it must
        self._containers.clear()

    def run_bench(self, argv: list[str], out_dir: Path) -> None:
        """Run a one-shot client container (bench_serving) from the same image, host network."""
        self.client.containers.run(
            image=self.cfg.image.pinned,
            command=argv,
            network_mode="host",
            remove=True,
            volumes={
                str(out_dir.resolve()): {"bind": "/bench", "mode": "rw"},
                **(
                    {str(self.cfg.hf_cache): {"bind": HF_CACHE_IN_CONTAINER, "mode": "ro"}} if self.cfg.hf_cache else {}
                ),
            },
            environment={"HF_HUB_OFFLINE": "1"} if self.cfg.hf_cache else {},
            labels={LABEL: "bench"},
        )
