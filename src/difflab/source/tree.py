"""A release's unpacked ``sglang/`` tree, checked before every use against the wheel it came from.

Unpacking hashes every file while it is written and compares it with the wheel's ``RECORD``
(whose own sha256 is the pinned wheel's), makes the tree read-only, and writes beside it
(never in it, so the tree holds exactly what the wheel holds):

- ``<tree>.SHA256SUMS``: the tree's own ``sha256sum`` listing (``<hex>  <path>`` lines, sorted
  bytewise); ``cd <tree> && sha256sum -c ../<tree>.SHA256SUMS`` checks it without difflab;
- ``<tree>.tree.json``: the wheel's sha256, the **tree digest** (the sha256 of that listing),
  the digest of every file's stat signature (path, type, inode, size, mtime, ctime) and
  ``verified_ns``: the filesystem's clock just before the files were last hashed.

Before a tree is used, every file is ``lstat``-ed and the signature digest recomputed: tens of
milliseconds, where hashing the ~130 MB tree takes ~0.6 s (``bench/bench_tree_check.py``).
When it moved (an edit, a touch, a hard-linked copy, which changes every ctime) every file is
hashed and compared with the listing. An edit that keeps the size and puts the mtime back
still moves the ctime, which nobody but the kernel sets; but the ctime is stamped from a clock
that ticks only every few milliseconds (seconds on some filesystems), so an edit in the same
tick as the signature was taken would leave it unchanged. So, as git does for its index, a
file whose ctime is not older than ``verified_ns`` is *racy*: its content is hashed at the next
check even when the signature agrees, and the manifest is rewritten only with a signature
taken before that hashing began. A fresh unpack is racy as a whole (it was made read-only
after it was hashed), so the first check after it hashes every file once. A changed, added or
removed file is named, and the caller unpacks the tree again from the verified wheel; the
manifest keeps the signature of the tree as it was last verified, never the changed one's.
Anyone can recompute the tree digest::

    cd <tree> && find sglang -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum

It is part of the source's identity: results and attestations name it, and the result cache
is keyed by it.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import os
import stat
import tempfile
import zipfile
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from difflab.errors import SourceError
from difflab.files.atomic import write_atomic

PACKAGE = "sglang/"
MANIFEST_SCHEMA = 1
READ_ONLY_FILE = 0o444
READ_ONLY_DIR = 0o555


def manifest_path(tree: Path) -> Path:
    """Beside the tree, not in it: the tree holds only what the wheel holds."""
    return tree.with_name(tree.name + ".tree.json")


def listing_path(tree: Path) -> Path:
    return tree.with_name(tree.name + ".SHA256SUMS")


def listing(hashes: Mapping[str, str]) -> bytes:
    """The ``sha256sum`` listing of a tree, sorted bytewise."""
    return "".join(f"{hashes[rel]}  {rel}\n" for rel in sorted(hashes, key=lambda r: r.encode("utf-8"))).encode()


def tree_digest(hashes: Mapping[str, str]) -> str:
    """sha256 of the ``sha256sum`` listing of the tree (see the module docstring)."""
    return hashlib.sha256(listing(hashes)).hexdigest()


def record_hashes(zf: zipfile.ZipFile, wheel: str) -> dict[str, str]:
    """``sglang/`` files and their sha256 (hex) as the wheel's RECORD lists them."""
    names = [n for n in zf.namelist() if n.endswith(".dist-info/RECORD") and n.count("/") == 1]
    if len(names) != 1:
        raise SourceError(f"{wheel}: no single .dist-info/RECORD; cannot verify what it unpacks")
    out: dict[str, str] = {}
    text = zf.read(names[0]).decode("utf-8")
    for row in csv.reader(io.StringIO(text)):
        if not row or not row[0].startswith(PACKAGE):
            continue
        algorithm, _, value = (row[1] if len(row) > 1 else "").partition("=")
        if algorithm != "sha256" or not value:
            raise SourceError(f"{wheel}: RECORD gives no sha256 for {row[0]}")
        out[row[0]] = base64.urlsafe_b64decode(value + "=" * (-len(value) % 4)).hex()
    return out


def walk(root: Path) -> Iterator[tuple[str, os.stat_result]]:
    """Every entry under ``root/sglang`` that is not a folder, without following links (plain strings: fast)."""
    cut = len(str(root)) + 1
    stack = [os.path.join(str(root), PACKAGE.rstrip("/"))]
    while stack:
        with os.scandir(stack.pop()) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                else:
                    yield entry.path[cut:], entry.stat(follow_symlinks=False)


def _signature_line(rel: str, st: os.stat_result) -> str:
    return f"{rel}\0{st.st_mode}\0{st.st_ino}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ctime_ns}\n"


def scan(tree: Path, since_ns: int) -> tuple[str, list[tuple[str, os.stat_result]]]:
    """The signature digest, and the entries whose ctime is not older than ``since_ns`` (racy)."""
    lines: list[str] = []
    racy: list[tuple[str, os.stat_result]] = []
    for rel, st in walk(tree):
        lines.append(_signature_line(rel, st))
        if st.st_ctime_ns >= since_ns:
            racy.append((rel, st))
    digest = hashlib.sha256("".join(sorted(lines)).encode("utf-8", "surrogateescape")).hexdigest()
    return digest, racy


def signature_digest(tree: Path) -> str:
    """One digest over every entry's path, type, inode, size, mtime and ctime: moves if anything does."""
    return scan(tree, 1 << 62)[0]


def filesystem_now(folder: Path) -> int:
    """The time the filesystem of ``folder`` stamps on a change now (its own clock and granularity)."""
    fd, name = tempfile.mkstemp(dir=folder, prefix=".clock-")
    try:
        return os.fstat(fd).st_ctime_ns
    finally:
        os.close(fd)
        os.unlink(name)


def hash_file(path: Path) -> str:
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


@dataclass(frozen=True)
class TreeCheck:
    """The outcome of checking a tree: its digest, and every file that is not as unpacked."""

    digest: str
    changed: tuple[str, ...]

    @property
    def intact(self) -> bool:
        return not self.changed


@dataclass(frozen=True)
class Manifest:
    """``<tree>.tree.json``: what the tree was when its files were last hashed and found intact."""

    digest: str
    wheel_sha256: str
    signature: str
    verified_ns: int
    """Files whose ctime is not older than this may have changed after they were hashed."""


def _differs(tree: Path, rel: str, st: os.stat_result, expected: Mapping[str, str]) -> str | None:
    if rel not in expected:
        return f"{rel} (added)"
    if not stat.S_ISREG(st.st_mode):
        return f"{rel} (not a regular file)"
    if hash_file(tree / rel) != expected[rel]:
        return f"{rel} (content differs from the wheel)"
    return None


def compare(
    tree: Path, expected: Mapping[str, str], only: Iterable[tuple[str, os.stat_result]] | None = None
) -> list[str]:
    """Hash every file of the tree (or ``only`` these); name each that differs, is added or is missing."""
    changed: list[str] = []
    seen: set[str] = set()
    try:
        for rel, st in walk(tree) if only is None else only:
            seen.add(rel)
            if (why := _differs(tree, rel, st, expected)) is not None:
                changed.append(why)
    except OSError as exc:
        changed.append(f"{exc.filename or tree} (unreadable: {exc.strerror})")
    if only is None:
        changed += [f"{rel} (removed)" for rel in set(expected) - seen]
    return sorted(changed)


def record(tree: Path, hashes: Mapping[str, str], wheel_sha256: str) -> str:
    """Make the tree read-only and write its listing and manifest beside it; returns the tree digest.

    ``hashes`` were taken before this call, so the clock is read before the tree is made
    read-only: every file is then racy, and the first check hashes them again.
    """
    verified_ns = filesystem_now(tree.parent)
    make_read_only(tree)
    data = listing(hashes)
    digest = hashlib.sha256(data).hexdigest()
    write_atomic(listing_path(tree), data)
    _write_manifest(tree, Manifest(digest, wheel_sha256, signature_digest(tree), verified_ns))
    return digest


def _write_manifest(tree: Path, manifest: Manifest) -> None:
    document = {
        "schema": MANIFEST_SCHEMA,
        "wheel_sha256": manifest.wheel_sha256,
        "tree_sha256": manifest.digest,
        "signature_sha256": manifest.signature,
        "verified_ns": manifest.verified_ns,
    }
    write_atomic(manifest_path(tree), json.dumps(document, sort_keys=True) + "\n")


def read_manifest(tree: Path, wheel_sha256: str) -> Manifest | None:
    """The tree's manifest if it is there, readable and of ``wheel_sha256``.

    One written before ``verified_ns`` existed says nothing of when its files were hashed:
    every file is racy.
    """
    try:
        doc = json.loads(manifest_path(tree).read_text(encoding="utf-8"))
        if doc.get("schema") != MANIFEST_SCHEMA or doc.get("wheel_sha256") != wheel_sha256:
            return None
        verified_ns = doc.get("verified_ns", 0)
        if not isinstance(verified_ns, int) or isinstance(verified_ns, bool):
            return None
        return Manifest(str(doc["tree_sha256"]), wheel_sha256, str(doc["signature_sha256"]), verified_ns)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _unreadable(tree: Path, exc: OSError) -> str:
    return f"{exc.filename or tree} (unreadable: {exc.strerror})"


def check(tree: Path, wheel_sha256: str) -> TreeCheck | None:
    """The tree's digest and what changed in it; None if it has no usable manifest (check it another way).

    Cheap when the signature agrees and no file is racy; otherwise the files are hashed
    (:func:`_rehash`).
    """
    manifest = read_manifest(tree, wheel_sha256)
    if manifest is None:
        return None
    try:
        signature, racy = scan(tree, manifest.verified_ns)
    except OSError as exc:
        return TreeCheck(manifest.digest, (_unreadable(tree, exc),))
    if signature == manifest.signature and not racy:
        return TreeCheck(manifest.digest, ())
    return _rehash(tree, manifest, racy if signature == manifest.signature else None)


def _rehash(tree: Path, manifest: Manifest, only: list[tuple[str, os.stat_result]] | None) -> TreeCheck | None:
    """Hash the tree's files (``only`` the racy ones, while the signature still agrees) against the listing.

    The clock and the signature are read before any file is hashed, and only those go into
    the manifest, and only if nothing changed: a file edited while it is being hashed, or
    after, moves the signature or is racy at the next check.
    """
    expected = read_listing(tree, manifest.digest)
    if expected is None:
        return None
    try:
        verified_ns: int | None = filesystem_now(tree.parent)
    except OSError:  # a cache this user may read but not write: checked by content, nothing recorded
        verified_ns = None
    try:
        signature = signature_digest(tree)
    except OSError as exc:
        return TreeCheck(manifest.digest, (_unreadable(tree, exc),))
    changed = compare(tree, expected, only if signature == manifest.signature else None)
    if not changed and verified_ns is not None:
        _write_manifest(tree, Manifest(manifest.digest, manifest.wheel_sha256, signature, verified_ns))
    return TreeCheck(manifest.digest, tuple(changed))


def read_listing(tree: Path, digest: str) -> dict[str, str] | None:
    """The tree's recorded listing (path -> sha256), if it is there and hashes to ``digest``."""
    try:
        data = listing_path(tree).read_bytes()
    except OSError:
        return None
    if hashlib.sha256(data).hexdigest() != digest:
        return None
    return {line[66:]: line[:64] for line in data.decode("utf-8").splitlines() if len(line) > 66}


def make_read_only(tree: Path) -> None:
    """Files 0444 and folders 0555: a slip of the editor cannot change them."""
    for rel, _st in list(walk(tree)):
        os.chmod(tree / rel, READ_ONLY_FILE)
    for folder, _dirs, _files in os.walk(tree / PACKAGE.rstrip("/"), topdown=False):
        os.chmod(folder, READ_ONLY_DIR)


def extract(zf: zipfile.ZipFile, wheel: str, into: Path) -> dict[str, str]:
    """Write every ``sglang/`` member of the wheel under ``into``, hashing as it streams; check RECORD.

    Returns the sha256 of every file written. A member whose content differs from RECORD, or a
    RECORD entry the wheel lacks, is refused, naming the file.
    """
    expected = record_hashes(zf, wheel)
    written: dict[str, str] = {}
    for info in zf.infolist():
        name = info.filename
        if not name.startswith(PACKAGE) or name.endswith("/"):
            continue
        if name.startswith("/") or ".." in Path(name).parts or "\\" in name:
            raise SourceError(f"{wheel}: unsafe member {name!r}")
        if name in written:  # which copy an installer keeps is its own choice: neither can be trusted
            raise SourceError(f"{wheel}: member {name!r} is in the wheel more than once; refusing to use it")
        try:
            written[name] = _write_member(zf, info, into / name)
        except OSError as exc:
            raise SourceError(f"{wheel}: cannot unpack member {name!r}: {exc.strerror}") from None
    bad = sorted(n for n in written if expected.get(n) != written[n])
    bad += sorted(f"{n} (listed in RECORD, not in the wheel)" for n in set(expected) - set(written))
    if bad:
        shown = ", ".join(bad[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
        raise SourceError(f"{wheel}: content does not match its RECORD: {shown}; refusing to use it")
    return written


def _write_member(zf: zipfile.ZipFile, info: zipfile.ZipInfo, target: Path) -> str:
    """Write one member to a new file, hashing as it streams; returns its sha256."""
    target.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    with zf.open(info) as src, open(target, "xb") as dst:
        for chunk in iter(lambda: src.read(1 << 20), b""):
            digest.update(chunk)
            dst.write(chunk)
    return digest.hexdigest()
