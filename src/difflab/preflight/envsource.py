"""An engine's environment, for the flags SGLang reads from environment variables only.

Engines do not report their environment over HTTP, so the preflight takes it from
where the engine runs: ``docker:CONTAINER`` (its configured environment),
``pid:N`` (``/proc/N/environ`` of the engine process), or a file of ``KEY=VALUE``
lines (e.g. written by the deployment tooling).
"""

from __future__ import annotations

from pathlib import Path

from difflab.errors import ConfigError


def parse_lines(text: str) -> dict[str, str]:
    """``KEY=VALUE`` lines; blank lines and ``#`` comments are skipped, ``export`` is allowed."""
    env: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        line = line.removeprefix("export ").strip()
        key, sep, value = line.partition("=")
        if not sep or not key:
            continue
        env[key.strip()] = value.strip().strip('"').strip("'")
    return env


def from_docker(container: str) -> dict[str, str]:
    import docker
    from docker.errors import DockerException

    try:
        attrs = docker.from_env().containers.get(container).attrs
    except DockerException as exc:
        raise ConfigError(f"docker:{container}: cannot inspect the container: {exc}") from None
    return parse_lines("\n".join(attrs.get("Config", {}).get("Env") or []))


def from_pid(pid: str) -> dict[str, str]:
    path = Path(f"/proc/{pid}/environ")
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"pid:{pid}: cannot read {path}: {exc.strerror}") from None
    return parse_lines("\n".join(part.decode("utf-8", "replace") for part in raw.split(b"\0") if part))


def read_env(source: str) -> dict[str, str]:
    """Read one environment source (see the module docstring for the forms)."""
    kind, _, rest = source.partition(":")
    if kind == "docker" and rest:
        return from_docker(rest)
    if kind == "pid" and rest.isdigit():
        return from_pid(rest)
    path = Path(source)
    try:
        return parse_lines(path.read_text())
    except OSError as exc:
        raise ConfigError(f"{source}: not docker:NAME, pid:N or a readable KEY=VALUE file ({exc.strerror})") from None
