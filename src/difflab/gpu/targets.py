"""A side the tier can run: bring it up, hand out its endpoints, benchmark it, take it down.

Two implementations of one small interface (nox's ProcessEnv idea): a Docker
deployment of a pinned image on GPUs, and an in-process test deployment.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any, Protocol

from difflab.gpu.bench import BenchResult, BenchSpec, bench_serving_argv, read_result, run_load
from difflab.gpu.deployment import DeploymentConfig, DockerDeployment
from difflab.gpu.scenarios.base import Endpoints
from difflab.testing.testserver import TestDeployment, TestServerConfig


class Target(Protocol):
    key: str  # sides with the same key are the same deployment (run once, shared by fixes)
    runner: str

    def label(self) -> dict[str, Any]: ...
    def session(self) -> contextlib.AbstractContextManager[Endpoints]: ...
    def engine_env(self) -> dict[str, dict[str, str]]: ...
    def bench(self, round_index: int, output_file: Path) -> BenchResult: ...
    def describe(self) -> dict[str, Any]: ...
    def close(self) -> None: ...


class TestServerTarget:
    """An in-process simulated deployment (loopback only); a fresh one per session and per round."""

    __test__ = False
    runner = "gpu-testserver"

    def __init__(self, side: str, config: TestServerConfig, bench: BenchSpec, seed: int) -> None:
        self.side, self.config, self.bench_spec, self.seed = side, config, bench, seed
        self.key = f"testserver-{side}"

    def label(self) -> dict[str, Any]:
        switches = [k for k in ("admit_rejected", "prefill_leaks_aborted") if getattr(self.config, k)]
        if not self.config.deferred_release:
            switches.append("no deferred release")
        shown = f"testserver {self.side} ({', '.join(switches) or 'pre-fix switches off'})"
        return {"label": shown, "kind": "testserver", "version": self.config.version}

    @contextlib.contextmanager
    def session(self) -> Iterator[Endpoints]:
        with TestDeployment(self.config) as dep:
            yield Endpoints.from_urls(dep.router_url, dep.prefill_url, dep.decode_url, timeout_s=10.0)

    def engine_env(self) -> dict[str, dict[str, str]]:
        return {role: dict(env) for role, env in self.config.env.items()}

    def bench(self, round_index: int, output_file: Path) -> BenchResult:
        with self.session() as ep:
            return run_load(ep.router, self.bench_spec, self.seed + round_index, output_file, timeout_s=10.0)

    def describe(self) -> dict[str, Any]:
        data = asdict(self.config)
        data["model_info_paths"] = list(self.config.model_info_paths)
        data["server_info_paths"] = list(self.config.server_info_paths)
        return {"kind": "testserver", "side": self.side, "config": data}

    def close(self) -> None:
        pass


class DockerTarget:
    """One side's containers; kept up between uses only when both sides fit on the host at once."""

    runner = "gpu-docker"

    def __init__(
        self, cfg: DeploymentConfig, bench: BenchSpec, seed: int, persistent: bool, client: Any = None
    ) -> None:
        self.cfg, self.bench_spec, self.seed, self.persistent = cfg, bench, seed, persistent
        self.deployment = DockerDeployment(cfg, client)
        # file-name safe (artifact uploads refuse ':'), unique per image
        self.key = f"docker-{cfg.image.version or cfg.side}-{cfg.image.digest.removeprefix('sha256:')[:12]}"
        self._ep: Endpoints | None = None

    def label(self) -> dict[str, Any]:
        return {
            "label": f"{self.cfg.image.version or self.cfg.side} ({self.cfg.image})",
            "kind": "docker",
            "image": str(self.cfg.image),
            "model": self.cfg.model,
            "load_format": self.cfg.load_format,
        }

    def _up(self) -> Endpoints:
        if self._ep is None:
            self._ep = self.deployment.up()
        return self._ep

    def _down(self) -> None:
        self.deployment.down()
        self._ep = None

    @contextlib.contextmanager
    def session(self) -> Iterator[Endpoints]:
        try:
            yield self._up()
        finally:
            if not self.persistent:
                self._down()

    def engine_env(self) -> dict[str, dict[str, str]]:
        return {role: dict(self.deployment.specs[role].environment) for role in ("prefill", "decode")}

    def bench(self, round_index: int, output_file: Path) -> BenchResult:
        with self.session() as ep:
            argv = bench_serving_argv(
                ep.router.base_url,
                f"/bench/{output_file.name}",
                self.cfg.model,
                self.bench_spec,
                self.seed + round_index,
            )
            self.deployment.run_bench(argv, output_file.parent)
        return read_result(output_file)

    def describe(self) -> dict[str, Any]:
        return {
            "kind": "docker",
            "side": self.cfg.side,
            "image": str(self.cfg.image),
            "containers": {
                role: {
                    "name": s.name,
                    "image": s.image,
                    "command": list(s.command),
                    "environment": s.environment,
                    "gpu_ids": list(s.gpu_ids),
                    "devices": list(s.devices),
                    "network_mode": s.network_mode,
                    "ipc_mode": s.ipc_mode,
                    "privileged": s.privileged,
                    "memlock": s.memlock,
                }
                for role, s in self.deployment.specs.items()
            },
        }

    def close(self) -> None:
        self._down()
