"""``--backend docker``: every probe in a fresh container of the shared environment's image.

What the container adds over the subprocess runner: no network at all
(``network_mode="none"``), the SGLang source, the probe folder and the child
modules mounted read-only, a read-only root filesystem (only ``/tmp``, a
tmpfs, and the result folder are writable), CPU and memory limits, and an
image whose id is recorded in run.json. The probe process itself is the same
``python -m difflab.probe.child PROBE OUT`` as in the subprocess runner, so
observations carry the same fields.

The image is found by the environment digest label and built on first use
if the engine lacks it (``difflab image build`` does the same ahead of time);
see :mod:`difflab.image`. A crash, a hang (the container is
killed at the timeout), an out-of-memory kill or an engine error on one
probe becomes an ``error`` observation with the container's log; only an
unreachable engine or an unbuildable image stops the run.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from difflab.environment.shared import SharedEnvironment
from difflab.errors import EnvironmentSetupError
from difflab.image.build import ensure_image
from difflab.image.catalog import DifflabImage, find_image, resolve_image, tag_for
from difflab.image.client import connect
from difflab.observation import Observation
from difflab.probe.sandbox import SOURCE_ENV
from difflab.runner import box, childlib
from difflab.runner.base import ProbeJob, Progress, collect_result, error_observation, fan_out, tail, write_log
from difflab.runner.subprocess import default_workers

SOURCE = "/difflab/source"
CHILD = "/difflab/child"
PROBES = "/difflab/probes"
OUT = "/difflab/out"


def _stderr_say(message: str) -> None:
    print(f"difflab: {message}", file=sys.stderr, flush=True)


@dataclass
class DockerRunner:
    """One container per probe, from the image of the shared environment (built on first use)."""

    image: str | None = field(default_factory=lambda: os.environ.get("DIFFLAB_DOCKER_IMAGE") or None)
    """An image reference or id to use as is (e.g. built from ci/Dockerfile); default: found by the
    environment digest label. ``$DIFFLAB_DOCKER_IMAGE`` sets it for ``difflab run --backend docker``."""
    environment: SharedEnvironment = field(default_factory=SharedEnvironment)
    workers: int = field(default_factory=default_workers)
    nano_cpus: int = 1_000_000_000
    """CPU limit per probe container (1 CPU: a probe is single-threaded, OMP_NUM_THREADS=1)."""
    mem_limit: str = "2g"
    """Memory limit per probe container (a probe peaks at ~500 MB RSS with SGLang imported)."""
    build: bool = True
    """Build the image when the engine lacks it; ``False`` asks for ``difflab image build`` instead."""
    docker_host: str | None = None
    say: Callable[[str], None] = _stderr_say
    cache: Path | None = None
    """Where the staged child package goes (default ``$DIFFLAB_CACHE``)."""
    name: str = "docker"
    result_cache: ClassVar[bool] = False
    """Every container run is fresh evidence: no result is replayed from the cache."""
    local_environment: ClassVar[bool] = False
    """Probes run in the image; the image build makes the environment itself when it needs one."""
    hermetic: ClassVar[bool] = True
    """No network, the source read-only, the probe's processes gone with its container: fit for untrusted code."""

    def __post_init__(self) -> None:
        self._client: Any = None
        self._image: DifflabImage | None = None
        self._lock = threading.Lock()

    # -- engine and image ------------------------------------------------------------------
    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = connect(self.docker_host)
        return self._client

    def ensure(self) -> DifflabImage:
        """The image probes run in (looked up, or built once); raises if there is none."""
        with self._lock:
            if self._image is None:
                self._image = self._resolve()
                if self.client.info().get("Driver") == "vfs":
                    self.say(
                        "this Docker engine stores images with 'vfs': every probe container copies the "
                        f"{self._image.size / 1e9:.1f} GB image first (~1 min per probe measured); "
                        "an engine with --storage-driver=overlay2 starts one in <1 s (docs/docker.md)"
                    )
            return self._image

    def _resolve(self) -> DifflabImage:
        if self.image:
            return resolve_image(self.client, self.image)
        found = find_image(self.client, self.environment.digest)
        if found is not None:
            return found
        if not self.build:
            raise EnvironmentSetupError(
                f"the Docker engine has no image for environment {self.environment.digest[:16]} "
                f"(expected {tag_for(self.environment.digest)}): run `difflab image build` first"
            )
        return ensure_image(self.client, self.environment, say=self.say).image

    def describe(self) -> dict[str, Any]:
        image = self.ensure()
        version = self.client.version()
        info = self.client.info()
        return {
            "name": self.name,
            **image.describe(),
            "environment": self.environment.digest,
            "engine": {
                "version": version.get("Version"),
                "api_version": version.get("ApiVersion"),
                "storage_driver": info.get("Driver"),
                "os": info.get("OperatingSystem"),
            },
            "network": "none",
            "limits": {"nano_cpus": self.nano_cpus, "mem_limit": self.mem_limit},
            "workers": self.workers,
        }

    # -- running ---------------------------------------------------------------------------
    def run(self, jobs: Sequence[ProbeJob], on_done: Progress | None = None) -> list[Observation]:
        if not jobs:
            return []
        image = self.ensure()
        child_root = childlib.stage(self.cache)
        return fan_out(jobs, lambda job: self.run_one(job, image, child_root), self.workers, on_done)

    def container_config(self, job: ProbeJob, image: DifflabImage, child_root: Path, out_dir: Path) -> dict[str, Any]:
        """Arguments for ``containers.create``: what isolates one probe (kept in one place for tests)."""
        from docker.types import Mount

        probe_dir = job.probe_file.resolve().parent
        return {
            "image": image.id,
            "command": box.command(
                Path(image.python), "difflab.probe.child", f"{PROBES}/{job.probe_file.name}", f"{OUT}/result.json"
            ),
            "environment": {
                "PYTHONPATH": CHILD,
                SOURCE_ENV: SOURCE,
                "PYTHONDONTWRITEBYTECODE": "1",
                "PYTHONHASHSEED": "0",
                "CUDA_VISIBLE_DEVICES": "",
                "TOKENIZERS_PARALLELISM": "false",
                "HF_HUB_OFFLINE": "1",
                "OMP_NUM_THREADS": "1",
                "HOME": "/tmp",
                "LANG": "C.UTF-8",
            },
            "mounts": [
                Mount(SOURCE, str(Path(job.source.root).resolve()), type="bind", read_only=True),
                Mount(CHILD, str(child_root.resolve()), type="bind", read_only=True),
                Mount(PROBES, str(probe_dir), type="bind", read_only=True),
                Mount(OUT, str(out_dir), type="bind", read_only=False),
            ],
            "working_dir": OUT,
            "user": f"{os.getuid()}:{os.getgid()}",
            "network_mode": "none",
            "read_only": True,
            "tmpfs": {"/tmp": "rw,nosuid,nodev,size=512m"},
            "nano_cpus": self.nano_cpus,
            "mem_limit": self.mem_limit,
            "memswap_limit": self.mem_limit,
            "pids_limit": 512,
            "labels": {
                "org.difflab.role": "probe",
                "org.difflab.fix": job.fix_id,
                "org.difflab.side": job.side,
                "org.difflab.probe": job.probe,
            },
            "detach": True,
        }

    def run_one(self, job: ProbeJob, image: DifflabImage, child_root: Path) -> Observation:
        import docker.errors
        import requests.exceptions

        started = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="difflab-docker-") as tmp:
            out_dir = Path(tmp)
            out = out_dir / "result.json"
            container = None
            try:
                config = self.container_config(job, image, child_root, out_dir)
                container = self.client.containers.create(**config)
                container.start()
                waited = time.perf_counter()
                try:
                    status = container.wait(timeout=job.timeout_s)
                except (requests.exceptions.ReadTimeout, requests.exceptions.ConnectionError) as exc:
                    with contextlib.suppress(Exception):
                        container.kill()
                    log = _logs(container)
                    write_log(job, log)
                    if time.perf_counter() - waited < 0.9 * job.timeout_s:  # not our timeout: the engine
                        why = f"lost the Docker engine while the probe ran: {exc}"
                    else:
                        why = f"probe hung: container killed after {job.timeout_s:.0f} s"
                    return error_observation(job, self.name, f"{why}\n{tail(log)}", time.perf_counter() - started)
                log = _logs(container)
                code = int(status.get("StatusCode", -1))
                container.reload()
                oom = bool(container.attrs.get("State", {}).get("OOMKilled"))
            except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
                return error_observation(job, self.name, f"docker engine error: {exc}", time.perf_counter() - started)
            finally:
                if container is not None:
                    _remove(container)
            write_log(job, log)
            why = f"out of memory (limit {self.mem_limit})" if oom else f"exit {code}"
            return collect_result(
                job, self.name, out, f"probe container died ({why})", log, time.perf_counter() - started
            )


def _remove(container: Any, attempts: int = 5) -> None:
    """Remove a probe's container, retrying while the engine is still busy with it (a kill in progress
    answers 409 under load): a container left behind would outlive the run it belongs to."""
    import docker.errors

    for attempt in range(attempts):
        try:
            container.remove(force=True)
            return
        except docker.errors.NotFound:
            return
        except Exception:  # a busy or slow engine: try again, then give up quietly
            time.sleep(0.5 * (attempt + 1))


def _logs(container: Any) -> str:
    try:
        data = container.logs(stdout=True, stderr=True)
    except Exception as exc:  # the log is evidence, not a reason to lose the observation
        return f"(container log unavailable: {exc})"
    return data.decode(errors="replace") if isinstance(data, bytes) else str(data)
