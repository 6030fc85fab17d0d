"""Can this machine run the GPU tier? Every missing prerequisite is named, not just the first."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

GPUS_NEEDED = 1  # two GPUs give prefill and decode one each; one GPU is shared (see deployment)
SKIP_EXIT_CODE = 3
RDMA_DEVICE = Path("/dev/infiniband")


@dataclass
class HostCheck:
    """``missing`` empty = ready. ``gpus`` are the indices ``nvidia-smi -L`` listed."""

    missing: list[str] = field(default_factory=list)
    gpus: list[str] = field(default_factory=list)
    rdma: bool = False
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.missing

    @property
    def reason(self) -> str:
        return "GPU tier skipped: " + "; ".join(self.missing) if self.missing else "GPU host ready"

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "missing": self.missing,
            "gpus": self.gpus,
            "rdma": self.rdma,
            "reason": self.reason,
            **self.details,
        }


Runner = Callable[[list[str]], subprocess.CompletedProcess[str]]


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)


def _docker_client() -> Any:
    import docker

    return docker.from_env(timeout=10)


def check_host(
    docker_client: Callable[[], Any] = _docker_client,
    which: Callable[[str], str | None] = shutil.which,
    run: Runner = _run,
    rdma_device: Path = RDMA_DEVICE,
) -> HostCheck:
    """Docker engine, its NVIDIA runtime, the driver (``nvidia-smi``) and a GPU; RDMA is optional."""
    check = HostCheck(rdma=rdma_device.exists())
    try:
        client = docker_client()
        client.ping()
        info = client.info()
        runtimes = sorted((info.get("Runtimes") or {}).keys())
        check.details["docker_runtimes"] = runtimes
        if "nvidia" not in runtimes and info.get("DefaultRuntime") != "nvidia":
            check.missing.append(
                f"the Docker engine has no 'nvidia' runtime (runtimes: {', '.join(runtimes) or 'none'}"
                "); install nvidia-container-toolkit"
            )
    except Exception as exc:  # any failure to reach the engine means the same thing here
        where = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
        check.missing.append(f"no Docker engine reachable at {where} ({type(exc).__name__}: {str(exc)[:160]})")
    smi = which("nvidia-smi")
    if smi is None:
        check.missing.append("nvidia-smi not found on PATH (no NVIDIA driver on this host)")
    else:
        try:
            proc = run([smi, "-L"])
        except (OSError, subprocess.SubprocessError) as exc:
            check.missing.append(f"nvidia-smi -L failed to run: {exc}")
        else:
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("GPU ")]
            check.gpus = [ln.split(":")[0].removeprefix("GPU ").strip() for ln in lines]
            check.details["gpu_names"] = [ln.split(":", 1)[1].split("(")[0].strip() for ln in lines]
            if proc.returncode != 0:
                check.missing.append(f"nvidia-smi -L exited {proc.returncode}: {proc.stderr.strip()[:160]}")
            elif len(check.gpus) < GPUS_NEEDED:
                check.missing.append("nvidia-smi lists no GPU")
    return check
