"""Which releases the package index serves, asked where pip asks: every index and find-links location.

Each configured index's project page is read (PEP 691 JSON where served, PEP 503 HTML
otherwise, ``file://`` indexes too) and parsed by pypi-simple, which follows the Simple
Repository API (hashes, PEP 592 yanking, upload times); find-links folders are listed as
pip lists them. Per version the lab takes one wheel: this Python's CPython manylinux build
for this machine (the newest glibc tag), else a pure-Python wheel. The lab unpacks only
``sglang/``, so the wheel's other tags do not matter.
"""

from __future__ import annotations

import hashlib
import platform
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit, urlunsplit
from urllib.request import url2pathname

import requests
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from difflab.errors import SourceError
from difflab.source.pip_config import PipSettings

if TYPE_CHECKING:  # pypi_simple (with BeautifulSoup) is imported where an index is read: every command starts faster
    from pypi_simple import ProjectPage

_MANYLINUX = re.compile(r"^manylinux_(?P<major>\d+)_(?P<minor>\d+)_(?P<machine>\w+)$")
_LEGACY = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}


def redact(url: str) -> str:
    """A URL without its user and password, fit for output and results."""
    parts = urlsplit(url)
    if not parts.username and not parts.password:
        return url
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def sort_versions(versions: Iterable[str]) -> list[str]:
    return sorted(versions, key=Version)


@dataclass(frozen=True)
class WheelTarget:
    """The wheel the lab takes for a release: CPython of this interpreter, this machine, or pure Python."""

    python: str = f"cp{sys.version_info.major}{sys.version_info.minor}"
    machine: str = platform.machine() or "x86_64"

    def rank(self, filename: str) -> tuple[int, tuple[int, int]] | None:
        """Higher is preferred; ``None`` when the lab cannot use the file."""
        try:
            _name, _version, _build, tags = parse_wheel_filename(filename)
        except InvalidWheelFilename:
            return None
        best: tuple[int, tuple[int, int]] | None = None
        for tag in tags:
            score: tuple[int, tuple[int, int]] | None = None
            if tag.interpreter == self.python and tag.abi == self.python:
                glibc = _glibc(tag.platform, self.machine)
                if glibc is not None:
                    score = (2, glibc)
            elif tag.interpreter in ("py3", f"py{self.python[2:]}") and tag.abi == "none" and tag.platform == "any":
                score = (1, (0, 0))
            if score is not None and (best is None or score > best):
                best = score
        return best

    def describe(self) -> str:
        return f"{self.python} manylinux {self.machine} (or pure-Python)"


def _glibc(platform_tag: str, machine: str) -> tuple[int, int] | None:
    m = _MANYLINUX.match(platform_tag)
    if m:
        return (int(m["major"]), int(m["minor"])) if m["machine"] == machine else None
    legacy, _, arch = platform_tag.partition("_")
    return _LEGACY.get(legacy) if arch == machine else None


@dataclass(frozen=True)
class IndexFile:
    """One file of the project as one index serves it."""

    filename: str
    version: str
    url: str
    sha256: str | None
    yanked: str | None = None
    """The yank reason (``""`` when none is given); ``None`` when the file is not yanked."""
    upload_time: str | None = None
    source: str = ""


@dataclass(frozen=True)
class ReleaseFile:
    """The wheel the lab takes for one release."""

    version: str
    file: str
    sha256: str | None
    url: str
    yanked: str | None = None
    upload_time: str | None = None

    @property
    def prerelease(self) -> bool:
        return Version(self.version).is_prerelease


@dataclass
class Listing:
    """Every version the configured locations serve, and the wheel the lab takes for each."""

    package: str
    sources: list[str]
    releases: dict[str, ReleaseFile] = field(default_factory=dict)
    unusable: dict[str, str] = field(default_factory=dict)
    """Version -> why no file of it can be used (e.g. only a source distribution)."""
    served: dict[tuple[str, str], str | None] = field(default_factory=dict)
    """(version, file name) -> sha256, for every file of every version."""

    @property
    def versions(self) -> list[str]:
        return sort_versions({*self.releases, *self.unusable})


def build_listing(package: str, files: Iterable[IndexFile], sources: list[str], target: WheelTarget) -> Listing:
    """One listing from the files of every location; the same file with two hashes is refused."""
    listing = Listing(package=package, sources=sources)
    by_version: dict[str, list[IndexFile]] = {}
    seen: dict[tuple[str, str], IndexFile] = {}
    for f in files:
        key = (f.version, f.filename)
        first = seen.get(key)
        if first is not None and f.sha256 and first.sha256 and f.sha256 != first.sha256:
            raise SourceError(
                f"{package} {f.version}: {f.filename} has sha256 {first.sha256} on {first.source} "
                f"but {f.sha256} on {f.source}; refusing to choose"
            )
        if first is None or (not first.sha256 and f.sha256):
            seen[key] = f
            by_version.setdefault(f.version, []).append(f)
    for version, candidates in by_version.items():
        ranked = []
        for f in candidates:
            listing.served[(version, f.filename)] = seen[(version, f.filename)].sha256
            rank = target.rank(f.filename)
            if rank is not None:
                ranked.append((rank, f.filename, seen[(version, f.filename)]))
        if not ranked:
            kinds = sorted({"wheel" if c.filename.endswith(".whl") else "source distribution" for c in candidates})
            listing.unusable[version] = f"no {target.describe()} wheel ({' and '.join(kinds)} only)"
            continue
        _rank, _name, best = max(ranked)
        listing.releases[version] = ReleaseFile(
            version=version,
            file=best.filename,
            sha256=best.sha256,
            url=best.url,
            yanked=best.yanked,
            upload_time=best.upload_time,
        )
    return listing


# -- reading the locations ------------------------------------------------------------
@dataclass
class IndexClient:
    """Reads project pages with pip's settings (certificate, trusted hosts, proxy, timeout)."""

    settings: PipSettings
    session: requests.Session = field(default_factory=requests.Session)

    def __post_init__(self) -> None:
        if self.settings.proxy:
            self.session.proxies = {"http": self.settings.proxy, "https": self.settings.proxy}

    def list(self, package: str, target: WheelTarget | None = None) -> Listing:
        """Every release of ``package`` the configured indexes and find-links locations serve."""
        files: list[IndexFile] = []
        sources: list[str] = []
        for index in self.settings.indexes:
            sources.append(redact(index))
            files += self._index_files(index, package)
        for location in self.settings.find_links:
            sources.append(redact(location))
            files += self._find_links_files(location, package)
        return build_listing(package, files, sources, target or WheelTarget())

    def _index_files(self, index: str, package: str) -> list[IndexFile]:
        from pypi_simple import ProjectPage

        url = index.rstrip("/") + "/" + canonicalize_name(package) + "/"
        if urlsplit(url).scheme == "file":
            folder = Path(url2pathname(urlsplit(url).path))
            page = folder / "index.html"
            if not page.is_file():
                return []
            project = ProjectPage.from_html(package, page.read_bytes(), base_url=url)
        else:
            response = self._get(url, index)
            if response is None:
                return []
            project = ProjectPage.from_response(response, package)
        return _files(project, package, redact(index))

    def _find_links_files(self, location: str, package: str) -> list[IndexFile]:
        from pypi_simple import ProjectPage

        parts = urlsplit(location)
        if parts.scheme in ("http", "https"):
            response = self._get(location, location)
            if response is None:
                return []
            return _files(ProjectPage.from_html(package, response.content, base_url=response.url), package, location)
        path = Path(url2pathname(parts.path)) if parts.scheme == "file" else Path(location)
        if path.is_file() and path.suffix in (".html", ".htm"):
            page = ProjectPage.from_html(package, path.read_bytes(), base_url=path.resolve().as_uri())
            return _files(page, package, str(path))
        if not path.is_dir():
            return []
        found = []
        want = canonicalize_name(package)
        for item in sorted(path.iterdir()):
            version = _wheel_version(item.name, want)
            if version is not None and item.is_file():
                found.append(IndexFile(item.name, version, item.resolve().as_uri(), _sha256(item), source=str(path)))
        return found

    def _get(self, url: str, where: str) -> requests.Response | None:
        from pypi_simple import ACCEPT_JSON_PREFERRED

        host = urlsplit(url).hostname or ""
        verify: bool | str = False if host in self.settings.trusted_hosts else (self.settings.cert or True)
        try:
            response = self.session.get(
                url, headers={"Accept": ACCEPT_JSON_PREFERRED}, timeout=self.settings.timeout_s, verify=verify
            )
        except requests.RequestException as exc:
            raise SourceError(f"package index {redact(where)}: cannot be read ({type(exc).__name__}: {exc})") from None
        if response.status_code == 404:
            return None
        if response.status_code >= 400:
            raise SourceError(f"package index {redact(where)}: {url} answered HTTP {response.status_code}")
        return response


def _files(project: ProjectPage, package: str, source: str) -> list[IndexFile]:
    want = canonicalize_name(package)
    out = []
    for pkg in project.packages:
        version = _wheel_version(pkg.filename, want) if pkg.filename.endswith(".whl") else _sdist_version(pkg, want)
        if version is None:
            continue
        yanked = (pkg.yanked_reason or "") if pkg.is_yanked else None
        uploaded = pkg.upload_time.strftime("%Y-%m-%dT%H:%M:%SZ") if pkg.upload_time else None
        out.append(IndexFile(pkg.filename, version, pkg.url, pkg.digests.get("sha256"), yanked, uploaded, source))
    return out


def _wheel_version(filename: str, want: str) -> str | None:
    try:
        name, version, _build, _tags = parse_wheel_filename(filename)
    except InvalidWheelFilename:
        return None
    return str(version) if name == want else None


def _sdist_version(pkg: object, want: str) -> str | None:
    project, version = getattr(pkg, "project", None), getattr(pkg, "version", None)
    if not project or not version or canonicalize_name(project) != want:
        return None
    try:
        return str(Version(version))
    except InvalidVersion:
        return None


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
