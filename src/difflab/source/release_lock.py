"""``matrices/releases.lock``: every watched release's wheel, pinned on first sight (trust on first use).

The first time ``difflab releases --lock`` sees a release it records the wheel's file name and
sha256 with the date. Every later sight compares: a file whose sha256 changed is refused,
naming the old and the new hash, and nothing is written -- a re-uploaded wheel is exactly what
an operator must look at before any verdict is trusted. A release the matrix pins by hand must
be first seen with the matrix's hash. The lock is the release list ``difflab contains --all``
judges; its pins are checked again when each wheel is downloaded.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomli_w
from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from difflab.errors import ConfigError, SourceError
from difflab.files.atomic import write_atomic
from difflab.matrix.model import ReleasePin
from difflab.source.index import Listing, ReleaseFile, sort_versions

SCHEMA = 1
HEADER = (
    "# SGLang releases the lab watches: each release's wheel, pinned on first sight (trust on first use)\n"
    "# by `difflab releases --lock`. A later sight of another sha256 for a pinned file is refused;\n"
    "# change an entry only after reviewing why the registry's file changed.\n"
)


class HashChanged(SourceError):
    """The index now serves a pinned file with another sha256 (exit 2)."""


@dataclass(frozen=True)
class LockedRelease:
    """One pinned release wheel."""

    version: str
    file: str
    sha256: str
    first_seen: str
    prerelease: bool = False
    yanked: str | None = None

    def pin(self) -> ReleasePin:
        return ReleasePin(version=self.version, file=self.file, sha256=self.sha256)

    def to_toml(self) -> dict[str, Any]:
        entry: dict[str, Any] = {"file": self.file, "sha256": self.sha256, "first_seen": self.first_seen}
        if self.prerelease:
            entry["prerelease"] = True
        if self.yanked is not None:
            entry["yanked"] = self.yanked
        return entry


@dataclass
class ReleaseLock:
    """The lock file's content."""

    path: Path
    package: str = "sglang"
    releases: dict[str, LockedRelease] = field(default_factory=dict)

    @property
    def versions(self) -> list[str]:
        return sort_versions(self.releases)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.path.read_bytes()).hexdigest() if self.path.is_file() else ""

    def text(self) -> str:
        doc = {
            "schema": SCHEMA,
            "package": self.package,
            "releases": {v: self.releases[v].to_toml() for v in self.versions},
        }
        return HEADER + "\n" + tomli_w.dumps(doc)

    def save(self) -> Path:
        return write_atomic(self.path, self.text())


def load_lock(path: Path, *, missing_ok: bool = True) -> ReleaseLock:
    """Read the lock; a missing file is an empty lock unless ``missing_ok`` is false."""
    if not path.is_file():
        if missing_ok:
            return ReleaseLock(path=path)
        raise ConfigError(f"{path}: no release lock; run `difflab releases --lock` first")
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: not valid TOML ({exc})") from None
    if raw.get("schema") != SCHEMA:
        raise ConfigError(f"{path}: schema must be {SCHEMA}, got {raw.get('schema')!r}")
    package = raw.get("package", "sglang")
    table = raw.get("releases", {})
    if not isinstance(package, str) or not isinstance(table, dict):
        raise ConfigError(f"{path}: 'package' must be a string and 'releases' a table")
    releases = {version: _locked(f"{path}: releases.{version!r}", version, entry) for version, entry in table.items()}
    return ReleaseLock(path=path, package=package, releases=releases)


def _locked(where: str, version: str, entry: Any) -> LockedRelease:
    """One ``[releases."X.Y.Z"]`` entry, every key checked; ``where`` names it in the message."""
    try:
        normal = str(Version(version))
    except InvalidVersion:
        raise ConfigError(f"{where}: not a version") from None
    if normal != version:
        raise ConfigError(f"{where}: write the version as {normal!r}")
    if not isinstance(entry, dict):
        raise ConfigError(f"{where}: must be a table")
    for key in ("file", "sha256", "first_seen"):
        if not isinstance(entry.get(key), str) or not entry[key]:
            raise ConfigError(f"{where}.{key}: missing or not a string")
    if len(entry["sha256"]) != 64 or any(c not in "0123456789abcdef" for c in entry["sha256"]):
        raise ConfigError(f"{where}.sha256: not a lower-case hex sha256")
    unknown = set(entry) - {"file", "sha256", "first_seen", "prerelease", "yanked"}
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {sorted(unknown)}")
    _check_names_release(entry["file"], version, f"{where}.file")
    return LockedRelease(
        version=version,
        file=entry["file"],
        sha256=entry["sha256"],
        first_seen=entry["first_seen"],
        prerelease=bool(entry.get("prerelease", False)),
        yanked=entry.get("yanked"),
    )


def _check_names_release(file: str, version: str, where: str) -> None:
    """A lock entry's wheel must be the wheel of the release it is listed under: a label is not trusted."""
    try:
        name, wheel_version, _build, _tags = parse_wheel_filename(file)
    except InvalidWheelFilename:
        raise ConfigError(f"{where}: {file!r} is not a wheel file name") from None
    if name != "sglang":
        raise ConfigError(f"{where}: {file!r} is a wheel of {name!r}, not of sglang")
    if wheel_version != Version(version):
        raise ConfigError(f"{where}: {file!r} is the wheel of release {wheel_version}, not of {version}")


# -- one sight of the index ---------------------------------------------------------------
@dataclass(frozen=True)
class Sighting:
    """What one listing says about one release, against the lock."""

    version: str
    state: str
    """``locked`` | ``new`` | ``skipped`` | ``changed`` | ``gone``."""
    release: ReleaseFile | None
    detail: str = ""
    locked: LockedRelease | None = None


@dataclass
class LockReport:
    """Every release from the floor on, as this sight saw it."""

    floor: str
    sightings: list[Sighting]

    def of(self, state: str) -> list[Sighting]:
        return [s for s in self.sightings if s.state == state]


def _selected(release: ReleaseFile, include_pre: bool, include_yanked: bool) -> str:
    """Why a listed release is skipped, or ``""`` when it is watched."""
    why = []
    if release.prerelease and not include_pre:
        why.append("pre-release (--pre to watch)")
    if release.yanked is not None and not include_yanked:
        why.append("yanked" + (f": {release.yanked}" if release.yanked else "") + " (--yanked to watch)")
    return "; ".join(why)


def _locked_sighting(listing: Listing, version: str, locked: LockedRelease) -> Sighting:
    """A locked release: still served with the locked hash, served with another (``changed``), or gone."""
    release = listing.releases.get(version)
    served = listing.served.get((version, locked.file), "missing")
    if served == "missing":
        return Sighting(version, "gone", release, f"{locked.file} is no longer served", locked)
    if served is not None and served != locked.sha256:
        detail = f"{locked.file}: locked sha256 {locked.sha256} (first seen {locked.first_seen}), now {served}"
        return Sighting(version, "changed", release, detail, locked)
    return Sighting(version, "locked", release, f"since {locked.first_seen}", locked)


def _unlocked_sighting(
    listing: Listing, version: str, pin: ReleasePin | None, include_pre: bool, include_yanked: bool
) -> Sighting:
    """A release not in the lock: new, skipped (unusable or not watched), or changed (no hash, or not the matrix's)."""
    release = listing.releases.get(version)
    if release is None:
        return Sighting(version, "skipped", None, listing.unusable.get(version, "no usable wheel"))
    why = _selected(release, include_pre, include_yanked)
    if why:
        return Sighting(version, "skipped", release, why)
    if release.sha256 is None:
        return Sighting(version, "changed", release, f"{release.file}: the index publishes no sha256")
    if pin is not None and (pin.file, pin.sha256) != (release.file, release.sha256):
        detail = f"the matrix pins {pin.file} sha256 {pin.sha256}, the index serves {release.file} {release.sha256}"
        return Sighting(version, "changed", release, detail)
    return Sighting(version, "new", release)


def compare(
    lock: ReleaseLock,
    listing: Listing,
    floor: str,
    matrix_pins: Mapping[str, ReleasePin],
    *,
    include_pre: bool = False,
    include_yanked: bool = False,
) -> LockReport:
    """Each release from ``floor`` on: already locked (hash checked), new, skipped, changed, or gone."""
    low = Version(floor)
    sightings: list[Sighting] = []
    for version in listing.versions:
        if Version(version) < low:
            continue
        locked = lock.releases.get(version)
        if locked is not None:
            sightings.append(_locked_sighting(listing, version, locked))
        else:
            sightings.append(
                _unlocked_sighting(listing, version, matrix_pins.get(version), include_pre, include_yanked)
            )
    for version in lock.versions:
        if Version(version) >= low and version not in listing.releases and version not in listing.unusable:
            gone = Sighting(version, "gone", None, "not listed by any index any more", lock.releases[version])
            sightings.append(gone)
    return LockReport(floor=floor, sightings=sorted(sightings, key=lambda s: Version(s.version)))


def refuse_changes(report: LockReport, lock: ReleaseLock) -> None:
    """Raise :class:`HashChanged` naming every changed release; nothing is written."""
    changed = report.of("changed")
    if changed:
        lines = "\n".join(f"  {s.version}: {s.detail}" for s in changed)
        raise HashChanged(f"{lock.path}: refusing {len(changed)} release(s) whose wheel cannot be trusted:\n{lines}")


def pin_new(lock: ReleaseLock, report: LockReport, today: dt.date | None = None) -> list[LockedRelease]:
    """Add every ``new`` release to the lock (the caller saves it); returns what was added."""
    refuse_changes(report, lock)
    day = (today or dt.datetime.now(dt.UTC).date()).isoformat()
    added = []
    for s in report.of("new"):
        assert s.release is not None and s.release.sha256 is not None
        entry = LockedRelease(
            version=s.version,
            file=s.release.file,
            sha256=s.release.sha256,
            first_seen=day,
            prerelease=s.release.prerelease,
            yanked=s.release.yanked,
        )
        lock.releases[s.version] = entry
        added.append(entry)
    return added


def agree_with_matrix(lock: ReleaseLock, matrix_pins: Mapping[str, ReleasePin], matrix_path: Path) -> None:
    """A release both pin must be pinned identically, or no verdict on it can be trusted.

    The lock is what ``contains --all`` downloads by; the matrix is what every other command
    and every expectation stands on. Each differing field is named, in both files.
    """
    for version, pin in matrix_pins.items():
        locked = lock.releases.get(version)
        if locked is None:
            continue
        differing = [key for key in ("file", "sha256") if getattr(locked, key) != getattr(pin, key)]
        if differing:
            shown = "; ".join(
                f"releases.{version!r}.{key} is {getattr(locked, key)} there, {getattr(pin, key)} in {matrix_path}"
                for key in differing
            )
            raise ConfigError(
                f"{lock.path}: release {version} is pinned differently from the matrix ({shown}); "
                "review which wheel is the right one before any verdict on it is trusted"
            )


def oldest(versions: Iterable[str]) -> str | None:
    ordered = sort_versions(versions)
    return ordered[0] if ordered else None


def matrix_floor(fixes: Iterable[Any], matrix_path: Path) -> str:
    """The default floor of the watch: the oldest release any fix's base is pinned to."""
    found = oldest(f.base.release for f in fixes if f.base.release)
    if found is None:
        raise ConfigError(f"{matrix_path}: no fix has a release base; give --since VERSION")
    return found


def parse_floor(value: str) -> str:
    """``--since VERSION`` as a normalised version (exit 2 on anything else)."""
    try:
        return str(Version(value))
    except InvalidVersion:
        raise ConfigError(f"--since {value!r}: not a version (e.g. 0.5.19)") from None
