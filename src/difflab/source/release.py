"""Release back end: a hash-pinned wheel from the package registry, unpacked once.

Only ``sglang/`` is unpacked: the shared environment provides every
dependency, so the wheel's own metadata and requirements are never used.
Downloads go through ``pip download`` so an operator's index, proxy and
certificate settings apply unchanged.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock

from difflab.errors import ConfigError, SourceError
from difflab.files.atomic import atomic_folder
from difflab.matrix.model import Fix, Matrix, ReleasePin, SidePin
from difflab.paths import cache_root
from difflab.source.base import MaterialisedSource

_WHEEL = re.compile(r"^(?P<name>[^-]+)-(?P<version>[^-]+)-(?P<py>[^-]+)-(?P<abi>[^-]+)-(?P<platform>[^-]+)\.whl$")


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


@dataclass
class ReleaseSource:
    """Materialises ``[releases."X.Y.Z"]`` pins into ``$DIFFLAB_CACHE/sources/release``."""

    releases: dict[str, ReleasePin]
    cache: Path | None = None
    kind: str = "release"

    def __post_init__(self) -> None:
        self.cache = self.cache or cache_root()

    # -- public ---------------------------------------------------------------
    @classmethod
    def for_matrix(cls, matrix: Matrix, repo: str | None = None) -> ReleaseSource:
        """The back end ``difflab run --source release`` uses: the matrix's pinned wheels."""
        return cls(matrix.releases)

    @staticmethod
    def pin(fix: Fix, side: str, matrix_path: Path | None = None) -> SidePin:
        """The matrix's own pin for the side (a release, or why there is none)."""
        return getattr(fix, side)

    def materialise(self, fix: Fix, side: str, pin: SidePin) -> MaterialisedSource:
        if not pin.release:
            raise ConfigError(f"fix {fix.id!r}: {side} is not a release pin ({pin.label})")
        return self.release(pin.release)

    def release(self, version: str) -> MaterialisedSource:
        """The unpacked source of one pinned release (downloaded and checked on first use)."""
        pin = self.releases.get(version)
        if pin is None:
            raise ConfigError(f"release {version!r} is not pinned in the matrix [releases] table")
        assert self.cache is not None
        target = self.cache / "sources" / "release" / f"{pin.version}-{pin.sha256[:12]}"
        lock = FileLock(str(target) + ".lock")
        with lock:
            if not (target / "sglang" / "__init__.py").exists():
                wheel = self._wheel(pin)
                unpack_sglang(wheel, target)
        return MaterialisedSource(
            label=pin.version,
            kind="release",
            root=target,
            identity={"kind": "release", "version": pin.version, "file": pin.file, "sha256": pin.sha256},
            digest=f"sha256:{pin.sha256}",
        )

    def wheel(self, version: str) -> Path:
        """The pinned wheel file of one release in the cache (downloaded and checked if absent)."""
        pin = self.releases.get(version)
        if pin is None:
            raise ConfigError(f"release {version!r} is not pinned in the matrix [releases] table")
        return self._wheel(pin)

    # -- steps ------------------------------------------------------------------
    def _wheel(self, pin: ReleasePin) -> Path:
        assert self.cache is not None
        wheels = self.cache / "wheels"
        wheels.mkdir(parents=True, exist_ok=True)
        path = wheels / pin.file
        if path.exists() and sha256_file(path) == pin.sha256:
            return path
        with tempfile.TemporaryDirectory(dir=wheels, prefix=".download-") as tmp:
            downloaded = self._download(pin, Path(tmp))
            actual = sha256_file(downloaded)
            if actual != pin.sha256:
                raise SourceError(
                    f"release {pin.version}: {pin.file} has sha256 {actual}, "
                    f"but the matrix pins {pin.sha256}; refusing to use it"
                )
            os.replace(downloaded, path)
        return path

    def _download(self, pin: ReleasePin, into: Path) -> Path:
        m = _WHEEL.match(pin.file)
        if not m:
            raise ConfigError(f"release {pin.version}: {pin.file!r} is not a wheel file name")
        py = m["py"]
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--platform",
            m["platform"],
            "--implementation",
            py[:2],
            "--python-version",
            py[2:],
            "--abi",
            m["abi"],
            "--dest",
            str(into),
            "--quiet",
            "--disable-pip-version-check",
            f"{m['name']}=={pin.version}",
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        path = into / pin.file
        if proc.returncode != 0 or not path.exists():
            detail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            raise SourceError(
                f"release {pin.version}: could not download {pin.file} from the package registry: "
                + (" | ".join(detail) or f"pip exited {proc.returncode}")
            )
        return path


def unpack_sglang(wheel: Path, target: Path) -> None:
    """Extract ``sglang/`` only, into a temp sibling renamed into place (never half-written)."""
    with atomic_folder(target) as tmp, zipfile.ZipFile(wheel) as zf:
        members = [n for n in zf.namelist() if n.startswith("sglang/")]
        for name in members:
            if name.startswith("/") or ".." in Path(name).parts:
                raise SourceError(f"{wheel.name}: unsafe member {name!r}")
        zf.extractall(tmp, members=members)
