"""A docker SDK client, with a message that says where it looked when no engine answers."""

from __future__ import annotations

import os
from typing import Any

from difflab.errors import EnvironmentSetupError

API_TIMEOUT_S = 600
"""Engine calls other than ``wait``: creating a container copies the image on a ``vfs`` engine (~30 s/GB)."""


def connect(docker_host: str | None = None, timeout: int = API_TIMEOUT_S) -> Any:
    """A docker SDK client for ``docker_host``, else ``$DOCKER_HOST``, else the default socket."""
    try:
        import docker
    except ImportError as exc:  # a dependency of the lab, so only a broken install gets here
        raise EnvironmentSetupError(f"the docker backend needs the 'docker' package: {exc}") from None
    where = docker_host or os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock (default)"
    how = (
        "docker_host option"
        if docker_host
        else ("$DOCKER_HOST" if os.environ.get("DOCKER_HOST") else "docker.from_env(), DOCKER_HOST unset")
    )
    try:
        if docker_host:
            client = docker.DockerClient(base_url=docker_host, timeout=timeout)
        else:
            client = docker.from_env(timeout=timeout)
        client.ping()
    except Exception as exc:
        raise EnvironmentSetupError(
            f"no Docker engine reachable at {where} ({how}): {exc}\n"
            "start one (docs/docker.md: dockerd --host=unix:///tmp/d.sock ...; "
            "export DOCKER_HOST=unix:///tmp/d.sock) or use --backend subprocess"
        ) from None
    return client
