"""Deterministic ``.tar.gz`` of a sealed run folder, and safe unpacking of one.

Same folder → same bytes: entries sorted bytewise, one fixed mtime, uid/gid 0 with no names, mode
0644 for every file (a bundle holds data only), and a gzip header with no name and time 0.
Unpacking refuses anything that is not a plain file or folder inside the destination, naming it.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import gzip
import io
import json
import os
import tarfile
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path

from difflab.bundle import checksums, layout
from difflab.bundle.problems import Problem
from difflab.errors import ConfigError, VerificationFailed
from difflab.files.atomic import write_atomic
from difflab.files.tar import owned_by_root

FILE_MODE = 0o644
MAX_MEMBERS = 100_000
MAX_TOTAL_BYTES = 4 * 1024**3


def default_output(run_dir: Path) -> Path:
    return run_dir.parent / f"{run_dir.name}.tar.gz"


def archive_epoch(run_dir: Path, environ: Mapping[str, str] | None = None) -> int:
    """SOURCE_DATE_EPOCH if set, else the run's recorded finish (or start) time from run.json, else 0."""
    environ = os.environ if environ is None else environ
    value = environ.get("SOURCE_DATE_EPOCH", "").strip()
    if value:
        try:
            return max(0, int(value))
        except ValueError:
            raise ConfigError(f"SOURCE_DATE_EPOCH is not an integer: {value!r}") from None
    try:
        run = json.loads((run_dir / layout.RUN_JSON).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{run_dir / layout.RUN_JSON}: cannot read the run's time ({exc})") from None
    for key in ("finished_at", "started_at"):
        stamp = run.get(key) if isinstance(run, dict) else None
        if isinstance(stamp, str):
            try:
                moment = _dt.datetime.fromisoformat(stamp)
            except ValueError:
                continue
            if moment.tzinfo is None:
                moment = moment.replace(tzinfo=_dt.UTC)
            return max(0, int(moment.timestamp()))
    return 0  # e.g. a merged run, which records no time: still deterministic


def pack(run_dir: Path, out: Path | None = None, environ: Mapping[str, str] | None = None) -> Path:
    """Pack a sealed folder; refuses an unsealed folder or one whose files no longer match SHA256SUMS."""
    if not run_dir.is_dir():
        raise ConfigError(f"{run_dir}: not a folder")
    run_dir = run_dir.resolve()  # so `difflab pack .` still has a name for the archive's top folder
    out = out or default_output(run_dir)
    if out.resolve().is_relative_to(run_dir.resolve()):
        raise ConfigError(f"{out}: the archive cannot be written inside the folder it packs")
    listing = layout.scan(run_dir)
    if layout.CHECKSUMS not in listing.files:
        raise ConfigError(f"{run_dir}: not sealed (no {layout.CHECKSUMS}); seal it before packing")
    listed, problems = checksums.parse((run_dir / layout.CHECKSUMS).read_text(encoding="utf-8"))
    files = [f for f in listing.files if f not in layout.OUTSIDE_CHECKSUMS]
    problems += checksums.compare(listed, checksums.digests(run_dir, files))
    problems += [Problem(rel, "links and special files cannot be packed") for rel in listing.odd]
    if problems:
        raise VerificationFailed(
            f"{run_dir} does not match its {layout.CHECKSUMS}; not packing:\n" + "\n".join(f"  {p}" for p in problems)
        )
    data = archive_bytes(run_dir, listing.files, archive_epoch(run_dir, environ))
    return write_atomic(out, data)


def archive_bytes(run_dir: Path, files: list[str], epoch: int) -> bytes:
    """The archive, built in memory; entries are ``<folder name>/<path>``."""
    raw = io.BytesIO()
    with (
        gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=9) as gz,
        tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        for rel in layout.bytewise(files):
            path = run_dir / rel
            info = tarfile.TarInfo(f"{run_dir.name}/{rel}")
            info.size = path.stat().st_size
            info.mtime = epoch
            info.mode = FILE_MODE
            owned_by_root(info)
            with path.open("rb") as handle:
                tar.addfile(info, handle)
    return raw.getvalue()


def _check_member(member: tarfile.TarInfo, seen: set[str]) -> str | None:
    """Why a member may not be extracted, or None. Stricter than needed: bundles hold no links at all."""
    name = member.name
    if name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        return "absolute path"
    if any(part == ".." for part in name.replace("\\", "/").split("/")):
        return "path leaves the folder ('..')"
    if member.issym() or member.islnk():
        kind = "symlink" if member.issym() else "hard link"
        return f"{kind} to {member.linkname!r}; bundles contain no links"
    if not (member.isreg() or member.isdir()):
        return "not a regular file or folder"
    clean = name.rstrip("/")
    if clean.startswith("./"):
        clean = clean[2:]
    if member.isreg() and not layout.safe_relpath(clean):
        return "unsafe name"
    if member.isreg() and clean in seen:
        return "appears twice in the archive"
    seen.add(clean)
    return None


def safe_extract(archive: Path, dest: Path) -> Path:
    """Extract into ``dest`` after checking every member; returns the bundle root inside ``dest``."""
    try:
        tar = tarfile.open(archive, mode="r:*")  # noqa: SIM115 - closed by the with below
    except (tarfile.TarError, OSError) as exc:
        raise VerificationFailed(f"{archive}: not a readable tar archive ({exc})") from None
    with tar:
        try:
            members = tar.getmembers()
        except (tarfile.TarError, EOFError, OSError) as exc:
            raise VerificationFailed(f"{archive}: damaged archive ({exc})") from None
        if len(members) > MAX_MEMBERS or sum(m.size for m in members) > MAX_TOTAL_BYTES:
            raise VerificationFailed(f"{archive}: too large to be a bundle")
        seen: set[str] = set()
        bad = [f"  {m.name}: {why}" for m in members if (why := _check_member(m, seen))]
        if bad:
            listing = "\n".join(bad)
            raise VerificationFailed(f"{archive}: unsafe archive members, nothing extracted:\n{listing}")
        if not hasattr(tarfile, "data_filter"):
            raise ConfigError("safe extraction needs tarfile extraction filters (Python 3.11.4 or newer)")
        try:
            tar.extractall(dest, members=members, filter="data")
        except tarfile.FilterError as exc:
            member = getattr(exc, "tarinfo", None)
            raise VerificationFailed(f"{archive}: {getattr(member, 'name', '?')}: {exc}") from None
    return bundle_root(dest)


def bundle_root(dest: Path) -> Path:
    """The single top folder of an archive (as ``pack`` writes it), or ``dest`` for a flat archive."""
    entries = list(dest.iterdir())
    if len(entries) == 1 and entries[0].is_dir() and not (dest / layout.CHECKSUMS).exists():
        return entries[0]
    return dest


@contextlib.contextmanager
def opened(path: Path) -> Iterator[Path]:
    """A run folder as is, or an archive unpacked safely into a temporary folder removed afterwards."""
    if path.is_dir():
        yield path
        return
    if not path.is_file():
        raise ConfigError(f"{path}: no such run folder or bundle archive")
    with tempfile.TemporaryDirectory(prefix="difflab-bundle-") as tmp:
        yield safe_extract(path, Path(tmp))
