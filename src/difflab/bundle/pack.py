"""Deterministic ``.tar.gz`` of a sealed run folder, and safe unpacking of one.

Same folder → same bytes: entries sorted bytewise, one fixed mtime, uid/gid 0 with no names, mode
0644 for every file (a bundle holds data only), and a gzip header with no name and time 0.
Unpacking refuses anything that is not a plain file or folder inside the destination, naming it.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import gzip
import hashlib
import io
import json
import os
import tarfile
import tempfile
import zlib
from collections.abc import Iterator, Mapping
from pathlib import Path

from difflab.bundle import checksums, layout
from difflab.bundle.problems import Problem
from difflab.errors import ConfigError, VerificationFailed
from difflab.files.atomic import write_atomic
from difflab.files.names import printable
from difflab.files.tar import owned_by_root

FILE_MODE = 0o644
MAX_MEMBERS = 100_000
DEFAULT_MAX_UNPACKED = 512 * 1024**2
"""A bundle is observations, logs and JSON: a few MiB. ``--max-unpacked-mib`` lifts the cap for a genuine big one."""
MAX_CHECKSUMS_BYTES = 16 * 1024**2


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
    if member.issparse():
        return "sparse file; bundles hold plain files"
    if not (member.isreg() or member.isdir()):
        return "not a regular file or folder"
    clean = _clean(name)
    if (member.isreg() or clean) and not layout.safe_relpath(clean):
        return "unsafe name"
    if member.isreg() and clean in seen:
        return "appears twice in the archive"
    seen.add(clean)
    return None


def _clean(name: str) -> str:
    clean = name.rstrip("/")
    return clean[2:] if clean.startswith("./") else clean


def _members(archive: Path, tar: tarfile.TarFile, max_bytes: int) -> list[tarfile.TarInfo]:
    """Every header, read one by one: a declared size over the limit stops before its data is decompressed."""
    members: list[tarfile.TarInfo] = []
    total = 0
    while True:
        if len(members) >= MAX_MEMBERS:
            raise VerificationFailed(f"{archive}: more than {MAX_MEMBERS} members; too many to be a bundle")
        try:
            member = tar.next()
        except (tarfile.TarError, EOFError, OSError, zlib.error) as exc:
            raise VerificationFailed(f"{archive}: damaged archive ({exc})") from None
        if member is None:
            return members
        total += max(member.size, 0)
        if total > max_bytes:
            raise VerificationFailed(
                f"{archive}: unpacks to more than {max_bytes // 2**20} MiB (reached at {printable(member.name)}); "
                "refusing it. If the bundle is genuine, raise the limit with --max-unpacked-mib"
            )
        members.append(member)


def _listing(archive: Path, tar: tarfile.TarFile, members: list[tarfile.TarInfo]) -> tuple[str, dict[str, str]]:
    """The archive's top folder (``name/`` or ``""``) and what its SHA256SUMS lists, read before anything else."""
    found = [m for m in members if m.isreg() and _clean(m.name).split("/")[-1] == layout.CHECKSUMS]
    found = [m for m in found if _clean(m.name).count("/") <= 1]
    if len(found) != 1:
        raise VerificationFailed(f"{archive}: no SHA256SUMS at the top of the archive: not a sealed bundle")
    sums = found[0]
    if sums.size > MAX_CHECKSUMS_BYTES:
        raise VerificationFailed(f"{archive}: {printable(sums.name)} is larger than {MAX_CHECKSUMS_BYTES} bytes")
    handle = tar.extractfile(sums)
    assert handle is not None
    try:
        text = handle.read().decode("utf-8")
    except UnicodeDecodeError:
        raise VerificationFailed(f"{archive}: {printable(sums.name)} is not UTF-8 text") from None
    listed, problems = checksums.parse(text)
    if problems:
        shown = "\n".join(f"  {p}" for p in problems[:10])
        raise VerificationFailed(f"{archive}: {printable(sums.name)} is malformed, nothing extracted:\n{shown}")
    prefix = _clean(sums.name)[: -len(layout.CHECKSUMS)]
    return prefix, listed


def _unlisted(member: tarfile.TarInfo, prefix: str, listed: Mapping[str, str]) -> str | None:
    """Why a structurally sound member is still refused: it lies outside the bundle or SHA256SUMS does not list it."""
    clean = _clean(member.name)
    if member.isdir():
        return None if (clean + "/").startswith(prefix) or not clean else "folder outside the bundle's top folder"
    if not clean.startswith(prefix):
        return "outside the bundle's top folder"
    rel = clean[len(prefix) :]
    if rel in listed or rel in layout.OUTSIDE_CHECKSUMS:
        return None
    return f"not listed in {layout.CHECKSUMS}"


def _write_member(archive: Path, tar: tarfile.TarFile, member: tarfile.TarInfo, target: Path, want: str | None) -> None:
    """Stream one member to ``target``, never more than its declared size, hashing as it goes."""
    target.parent.mkdir(parents=True, exist_ok=True)
    handle = tar.extractfile(member)
    assert handle is not None
    digest, left = hashlib.sha256(), member.size
    partial = target.with_name(target.name + ".partial")
    with handle, open(partial, "xb") as out:
        while left > 0:
            chunk = handle.read(min(left, 1 << 20))
            if not chunk:
                raise VerificationFailed(f"{archive}: {printable(member.name)}: truncated")
            digest.update(chunk)
            out.write(chunk)
            left -= len(chunk)
    if want is not None and digest.hexdigest() != want:
        partial.unlink()
        raise VerificationFailed(
            f"{archive}: {printable(member.name)}: sha256 {digest.hexdigest()} does not match "
            f"{layout.CHECKSUMS} ({want}); extraction stopped"
        )
    os.chmod(partial, FILE_MODE)
    os.replace(partial, target)


def safe_extract(archive: Path, dest: Path, max_bytes: int = DEFAULT_MAX_UNPACKED) -> Path:
    """Extract into ``dest`` after checking every member; returns the bundle root inside ``dest``.

    SHA256SUMS is read first; a member it does not list (or that is unsafe: a link, a device, a
    sparse file, ``..``) is refused by name before anything is written; the sum of the declared
    sizes is capped at ``max_bytes``; each member is hashed as it streams and must match its line.
    """
    try:
        tar = tarfile.open(archive, mode="r:*")  # noqa: SIM115 - closed by the with below
    except (tarfile.TarError, OSError) as exc:
        raise VerificationFailed(f"{archive}: not a readable tar archive ({exc})") from None
    with tar:
        members = _members(archive, tar, max_bytes)
        seen: set[str] = set()
        bad = [f"  {printable(m.name)}: {why}" for m in members if (why := _check_member(m, seen))]
        if bad:
            listing = "\n".join(bad)
            raise VerificationFailed(f"{archive}: unsafe archive members, nothing extracted:\n{listing}")
        prefix, listed = _listing(archive, tar, members)
        bad = [f"  {printable(m.name)}: {why}" for m in members if (why := _unlisted(m, prefix, listed))]
        if bad:
            listing = "\n".join(bad)
            raise VerificationFailed(
                f"{archive}: archive members SHA256SUMS does not cover, nothing extracted:\n{listing}"
            )
        root = dest.resolve()
        try:
            for member in members:
                target = root / _clean(member.name)
                if not target.resolve().is_relative_to(root):
                    raise VerificationFailed(f"{archive}: {printable(member.name)}: leaves the folder")
                if member.isdir():
                    target.mkdir(parents=True, exist_ok=True)
                    continue
                rel = _clean(member.name)[len(prefix) :]
                _write_member(archive, tar, member, target, listed.get(rel))
        except (tarfile.TarError, EOFError, zlib.error) as exc:
            raise VerificationFailed(f"{archive}: damaged archive ({exc})") from None
        except OSError as exc:
            raise VerificationFailed(f"{archive}: cannot extract ({exc})") from None
    return bundle_root(dest)


def bundle_root(dest: Path) -> Path:
    """The single top folder of an archive (as ``pack`` writes it), or ``dest`` for a flat archive."""
    entries = list(dest.iterdir())
    if len(entries) == 1 and entries[0].is_dir() and not (dest / layout.CHECKSUMS).exists():
        return entries[0]
    return dest


@contextlib.contextmanager
def opened(path: Path, max_bytes: int = DEFAULT_MAX_UNPACKED) -> Iterator[Path]:
    """A run folder as is, or an archive unpacked safely into a temporary folder removed afterwards."""
    if path.is_dir():
        yield path
        return
    if not path.is_file():
        raise ConfigError(f"{path}: no such run folder or bundle archive")
    with tempfile.TemporaryDirectory(prefix="difflab-bundle-") as tmp:
        yield safe_extract(path, Path(tmp), max_bytes)
