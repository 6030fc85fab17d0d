"""The one shared CPU environment that serves every SGLang release.

SGLang is never installed into it: each probe process gets the materialised
source on ``PYTHONPATH``. So one ~1.4 GB venv, built once (~1-2 min), serves
every release and every fork instead of a 55 s, 1.6 GB venv per version.
The environment is identified by a digest of its pinned requirements and the
Python version; results record that digest and the installed package list.
A release that needs other pins (``release-needs.toml``, planned by
:mod:`difflab.environment.plan`) gets a sibling built the same way with those
pins applied, keyed by its own digest.
"""

from __future__ import annotations

import hashlib
import os
import platform
import subprocess
import sys
import tempfile
import venv
from dataclasses import dataclass, field
from functools import cached_property
from importlib import resources
from pathlib import Path
from typing import Any

from filelock import FileLock

from difflab.environment.plan import apply_pins, pin_versions
from difflab.errors import EnvironmentSetupError
from difflab.files.atomic import atomic_folder
from difflab.paths import cache_root
from difflab.probe import stubs

REQUIREMENTS = "cpu-requirements.txt"
NODEPS_REQUIREMENTS = "cpu-requirements-nodeps.txt"


def spec_text(name: str) -> str:
    return resources.files("difflab.environment").joinpath(name).read_text()


def pinned_texts(pins: tuple[str, ...] = ()) -> tuple[str, str]:
    """The two requirement files with ``pins`` applied (a pin lands in the file that lists its package)."""
    main, nodeps = spec_text(REQUIREMENTS), spec_text(NODEPS_REQUIREMENTS)
    if not pins:
        return main, nodeps
    in_nodeps = set(pin_versions(nodeps.splitlines()))
    to_nodeps = tuple(p for p in pins if next(iter(pin_versions([p]))) in in_nodeps)
    to_main = tuple(p for p in pins if p not in to_nodeps)
    return apply_pins(main, to_main), apply_pins(nodeps, to_nodeps)


def spec_digest(python_version: str | None = None, pins: tuple[str, ...] = ()) -> str:
    """Digest of what defines the environment: pinned requirements and Python X.Y."""
    py = python_version or f"{sys.version_info.major}.{sys.version_info.minor}"
    h = hashlib.sha256()
    for part in (py, *pinned_texts(pins)):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


@dataclass
class SharedEnvironment:
    """A virtualenv under ``$DIFFLAB_CACHE/envs/cpu-<digest>``, created on demand."""

    cache: Path | None = None
    pip_args: list[str] = field(default_factory=lambda: os.environ.get("DIFFLAB_PIP_ARGS", "").split())
    pins: tuple[str, ...] = ()
    """Pins replacing the shared ones (a release's needs); empty for the shared environment itself."""

    def __post_init__(self) -> None:
        self.cache = self.cache or cache_root()

    @cached_property
    def digest(self) -> str:
        return spec_digest(pins=self.pins)

    @property
    def path(self) -> Path:
        assert self.cache is not None
        return self.cache / "envs" / f"cpu-{self.digest[:16]}"

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"

    @property
    def ready(self) -> bool:
        return (self.path / ".difflab-complete").exists()

    def ensure(self, progress: Any = None) -> SharedEnvironment:
        """Create the environment unless it exists (safe across concurrent processes)."""
        if self.ready:
            return self
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(self.path) + ".lock"):
            if self.ready:
                return self
            if progress:
                what = "the shared CPU environment"
                if self.pins:
                    what = f"a CPU environment pinning {', '.join(self.pins)}"
                progress(f"creating {what} at {self.path} (once, ~2 min)")
            with atomic_folder(self.path) as tmp:
                self._build(tmp)
        return self

    def _build(self, into: Path) -> None:
        venv.EnvBuilder(with_pip=True, clear=True).create(into)
        py = str(into / "bin" / "python")
        main_text, nodeps_text = pinned_texts(self.pins)
        with tempfile.TemporaryDirectory() as tmp:
            req = Path(tmp) / REQUIREMENTS
            req.write_text(main_text)
            nodeps = Path(tmp) / NODEPS_REQUIREMENTS
            nodeps.write_text(nodeps_text)
            pip = [py, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *self.pip_args]
            self._run([*pip, "-r", str(req)], "install the pinned requirements")
            self._run([*pip, "--no-deps", "-r", str(nodeps)], "install the --no-deps requirements")
        freeze = self._run([py, "-m", "pip", "freeze", "--all"], "list installed packages")
        (into / "difflab-freeze.txt").write_text(freeze)
        (into / ".difflab-complete").write_text(self.digest + "\n")

    @staticmethod
    def _run(cmd: list[str], what: str) -> str:
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
            raise EnvironmentSetupError(f"shared environment: could not {what} (exit {proc.returncode}):\n{tail}")
        return proc.stdout

    def describe(self) -> dict[str, Any]:
        """What results record: Python version, package list, digest."""
        freeze_file = self.path / "difflab-freeze.txt"
        packages = (
            sorted(line.strip() for line in freeze_file.read_text().splitlines() if line.strip())
            if freeze_file.exists()
            else []
        )
        version = subprocess.run(
            [str(self.python), "-c", "import platform;print(platform.python_version())"],
            capture_output=True,
            text=True,
        ).stdout.strip()
        main_text, nodeps_text = pinned_texts(self.pins)
        return {
            "kind": "shared-cpu-venv",
            "digest": self.digest,
            "python_version": version,
            "platform": platform.platform(),
            "packages": packages,
            "requirements": main_text.splitlines(),
            "requirements_nodeps": nodeps_text.splitlines(),
            "pins": list(self.pins),
            "stubs": list(stubs.STUBBED),
        }

    def document(self) -> dict[str, Any]:
        """``environment.json``: :meth:`describe` where the environment is built here, else its digest."""
        if not self.ready:
            return {"digest": self.digest, "pins": list(self.pins), "note": "environment not built locally"}
        return self.describe()
