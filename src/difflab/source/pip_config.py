"""pip's own configuration, as ``pip download`` applies it: where releases are listed and fetched from.

The release list must come from the same places the release download uses (an operator's
mirror, an air-gapped file index, a proxy, a private CA). pip itself reads its configuration
files and ``PIP_*`` variables here, through ``python -m pip config list``; this module only
applies pip's precedence to what it prints: ``PIP_*`` variables over the ``[download]``
section over ``[global]``.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass

from difflab.errors import SourceError

PYPI_SIMPLE = "https://pypi.org/simple/"
SECTIONS = (":env:", "download", "global")
"""Highest precedence first: pip's ``PIP_*`` variables, the command's own section, then ``[global]``."""


@dataclass(frozen=True)
class PipSettings:
    """The part of pip's configuration that decides which index answers and how it is reached."""

    index_url: str = PYPI_SIMPLE
    extra_index_urls: tuple[str, ...] = ()
    find_links: tuple[str, ...] = ()
    no_index: bool = False
    cert: str | None = None
    trusted_hosts: tuple[str, ...] = ()
    proxy: str | None = None
    timeout_s: float = 15.0

    @property
    def indexes(self) -> tuple[str, ...]:
        """Every simple index pip asks, in its order (none with ``no-index``)."""
        return () if self.no_index else (self.index_url, *self.extra_index_urls)


def parse_config_list(text: str) -> dict[str, dict[str, str]]:
    """``section.key='value'`` lines of ``pip config list`` -> {section: {key: value}}."""
    found: dict[str, dict[str, str]] = {}
    for line in text.splitlines():
        name, sep, raw = line.partition("=")
        section, dot, key = name.rpartition(".")
        if not sep or not dot:
            continue
        try:
            value = ast.literal_eval(raw.strip())
        except (ValueError, SyntaxError):
            value = raw.strip()
        found.setdefault(section, {})[key] = str(value)
    return found


def _truthy(value: str) -> bool:
    return value.strip().lower() in ("1", "true", "yes", "on", "y")


def settings_from(config: Mapping[str, Mapping[str, str]]) -> PipSettings:
    """Apply pip's precedence to the parsed configuration."""

    def get(key: str) -> str | None:
        for section in SECTIONS:
            value = config.get(section, {}).get(key)
            if value is not None:
                return value
        return None

    def words(key: str) -> tuple[str, ...]:
        return tuple((get(key) or "").split())

    timeout = get("timeout") or get("default-timeout")
    return PipSettings(
        index_url=get("index-url") or PYPI_SIMPLE,
        extra_index_urls=words("extra-index-url"),
        find_links=words("find-links"),
        no_index=_truthy(get("no-index") or ""),
        cert=get("cert") or None,
        trusted_hosts=words("trusted-host"),
        proxy=get("proxy") or None,
        timeout_s=float(timeout) if timeout else PipSettings.timeout_s,
    )


def pip_settings(python: str = sys.executable, environ: Mapping[str, str] | None = None) -> PipSettings:
    """pip's settings as the lab's own ``pip download`` sees them (same interpreter, same variables)."""
    env = dict(os.environ if environ is None else environ)
    proc = subprocess.run(
        [python, "-m", "pip", "config", "list", "--disable-pip-version-check"],
        capture_output=True,
        text=True,
        env=env,
    )
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise SourceError("could not read pip's configuration (pip config list): " + " | ".join(tail))
    return settings_from(parse_config_list(proc.stdout))
