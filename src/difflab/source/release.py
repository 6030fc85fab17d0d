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
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from filelock import FileLock

from difflab.errors import ConfigError, SourceError
from difflab.files.atomic import atomic_folder
from difflab.matrix.model import Fix, Matrix, ReleasePin, SidePin
from difflab.paths import cache_root
from difflab.source import tree
from difflab.source.base import MaterialisedSource

_WHEEL = re.compile(r"^(?P<name>[^-]+)-(?P<version>[^-]+)-(?P<py>[^-]+)-(?P<abi>[^-]+)-(?P<platform>[^-]+)\.whl$")


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _stderr(message: str) -> None:
    print(f"difflab: {message}", file=sys.stderr, flush=True)


@dataclass
class ReleaseSource:
    """Materialises ``[releases."X.Y.Z"]`` pins into ``$DIFFLAB_CACHE/sources/release``."""

    releases: dict[str, ReleasePin]
    cache: Path | None = None
    kind: str = "release"
    say: Callable[[str], None] = _stderr
    """Where a repaired tree is reported (the cache changed behind the lab's back)."""
    _checked: dict[str, str] = field(default_factory=dict, init=False, repr=False)
    """Tree digests already checked by this back end (one check per release per run)."""

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
        """The unpacked source of one pinned release, checked against its wheel before it is used.

        Downloaded, hash-checked and unpacked on first use; on every later use the tree is
        compared with what was unpacked (:mod:`difflab.source.tree`) and unpacked again from the
        verified wheel if anything changed.
        """
        pin = self.releases.get(version)
        if pin is None:
            raise ConfigError(f"release {version!r} is not pinned in the matrix [releases] table")
        assert self.cache is not None
        target = self.cache / "sources" / "release" / f"{pin.version}-{pin.sha256[:12]}"
        digest = self._checked.get(pin.version)
        if digest is None:
            with FileLock(str(target) + ".lock"):
                digest = self._verified_tree(pin, target)
            self._checked[pin.version] = digest
        return MaterialisedSource(
            label=pin.version,
            kind="release",
            root=target,
            identity={
                "kind": "release",
                "version": pin.version,
                "file": pin.file,
                "sha256": pin.sha256,
                "tree_sha256": digest,
            },
            digest=f"sha256:{pin.sha256}+tree:{digest}",
        )

    def wheel(self, version: str) -> Path:
        """The pinned wheel file of one release in the cache (downloaded and checked if absent)."""
        pin = self.releases.get(version)
        if pin is None:
            raise ConfigError(f"release {version!r} is not pinned in the matrix [releases] table")
        return self._wheel(pin)

    # -- the tree -------------------------------------------------------------------
    def _verified_tree(self, pin: ReleasePin, target: Path) -> str:
        """The digest of an intact tree of ``pin``: the cached one if unchanged, else a fresh unpack."""
        if (target / "sglang" / "__init__.py").exists():
            result = tree.check(target, pin.sha256)
            if result is None:  # unpacked before trees had manifests: check every file against the wheel once
                result = self._adopt(pin, target)
            if result.intact:
                return result.digest
            more = f" and {len(result.changed) - 5} more" if len(result.changed) > 5 else ""
            self.say(
                f"release {pin.version}: the cached source {target} no longer matches {pin.file} "
                f"({', '.join(result.changed[:5])}{more}); unpacking it again from the verified wheel"
            )
        return unpack_sglang(self._wheel(pin), target, pin.sha256)

    def _adopt(self, pin: ReleasePin, target: Path) -> tree.TreeCheck:
        """Check a tree without a manifest against the wheel's RECORD; if intact, give it one."""
        with zipfile.ZipFile(self._wheel(pin)) as zf:
            expected = tree.record_hashes(zf, pin.file)
        changed = tree.compare(target, expected)
        if changed:
            return tree.TreeCheck("", tuple(changed))
        return tree.TreeCheck(tree.record(target, expected, pin.sha256), ())

    # -- steps ------------------------------------------------------------------
    def _wheel(self, pin: ReleasePin) -> Path:
        assert self.cache is not None
        wheels = self.cache / "wheels"
        wheels.mkdir(parents=True, exist_ok=True)
        path = wheels / pin.file
        if path.exists():
            actual = sha256_file(path)
            if actual == pin.sha256:
                return path
            raise SourceError(
                f"release {pin.version}: the cached wheel {path} has sha256 {actual}, but the matrix pins "
                f"{pin.sha256}: it changed after it was downloaded and checked; delete it to download it again"
            )
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


def unpack_sglang(wheel: Path, target: Path, wheel_sha256: str) -> str:
    """Extract ``sglang/`` only, checked against RECORD, into a temp sibling renamed into place.

    The tree is then made read-only and recorded (:func:`difflab.source.tree.record`); returns its digest.
    """
    with atomic_folder(target) as tmp, zipfile.ZipFile(wheel) as zf:
        hashes = tree.extract(zf, wheel.name, tmp)
    return tree.record(target, hashes, wheel_sha256)
