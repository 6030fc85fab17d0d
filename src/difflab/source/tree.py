"""A release's unpacked ``sglang/`` tree, checked before every use against the wheel it came from.

Unpacking hashes every file while it is written and compares it with the wheel's ``RECORD``
(whose own sha256 is the pinned wheel's), makes the tree read-only, and writes beside it
(never in it, so the tree holds exactly what the wheel holds):

- ``<tree>.SHA256SUMS``: the tree's own ``sha256sum`` listing (``<hex>  <path>`` lines, sorted
  bytewise); ``cd <tree> && sha256sum -c ../<tree>.SHA256SUMS`` checks it without difflab;
- ``<tree>.tree.json``: the wheel's sha256, the **tree digest** (the sha256 of that listing) and
  the digest of every file's stat signature (path, inode, size, mtime, ctime) taken after the
  tree was made read-only.

Before a tree is used, every file is ``lstat``-ed and the signature digest recomputed: tens of
milliseconds, where hashing the ~100 MB tree takes ~0.2 s. Only when it moved (an edit, a
touch, a hard-linked copy, which changes every ctime) is every file hashed and compared with the
listing; a changed, added or removed file is named, and the caller unpacks the tree again from
the verified wheel. Anyone can recompute the tree digest::

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
import zipfile
from collections.abc import Iterator, Mapping
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


def signature_digest(tree: Path) -> str:
    """One digest over every entry's path, type, inode, size, mtime and ctime: moves if anything does."""
    lines = sorted(
        f"{rel}\0{st.st_mode}\0{st.st_ino}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ctime_ns}\n"
        for rel, st in walk(tree)
    )
    return hashlib.sha256("".join(lines).encode("utf-8", "surrogateescape")).hexdigest()


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


def compare(tree: Path, expected: Mapping[str, str]) -> list[str]:
    """Hash every file of the tree; name each one that differs from ``expected``, is added or is missing."""
    changed: list[str] = []
    seen: set[str] = set()
    try:
        for rel, st in walk(tree):
            seen.add(rel)
            if rel not in expected:
                changed.append(f"{rel} (added)")
            elif not stat.S_ISREG(st.st_mode):
                changed.append(f"{rel} (not a regular file)")
            elif hash_file(tree / rel) != expected[rel]:
                changed.append(f"{rel} (content differs from the wheel)")
    except OSError as exc:
        changed.append(f"{exc.filename or tree} (unreadable: {exc.strerror})")
    changed += [f"{rel} (removed)" for rel in set(expected) - seen]
    return sorted(changed)


def record(tree: Path, hashes: Mapping[str, str], wheel_sha256: str) -> str:
    """Make the tree read-only and write its listing and manifest beside it; returns the tree digest."""
    make_read_only(tree)
    data = listing(hashes)
    digest = hashlib.sha256(data).hexdigest()
    write_atomic(listing_path(tree), data)
    _write_manifest(tree, digest, wheel_sha256)
    return digest


def _write_manifest(tree: Path, digest: str, wheel_sha256: str) -> None:
    document = {
        "schema": MANIFEST_SCHEMA,
        "wheel_sha256": wheel_sha256,
        "tree_sha256": digest,
        "signature_sha256": signature_digest(tree),
    }
    write_atomic(manifest_path(tree), json.dumps(document, sort_keys=True) + "\n")


def check(tree: Path, wheel_sha256: str) -> TreeCheck | None:
    """The tree's digest and what changed in it; None if it has no usable manifest (check it another way).

    When only signatures moved and every file still matches the listing, the manifest takes the
    new signatures, so the next check is cheap again.
    """
    try:
        manifest = json.loads(manifest_path(tree).read_text(encoding="utf-8"))
        digest, known = str(manifest["tree_sha256"]), str(manifest["signature_sha256"])
        if manifest.get("schema") != MANIFEST_SCHEMA or manifest.get("wheel_sha256") != wheel_sha256:
            return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    try:
        if signature_digest(tree) == known:
            return TreeCheck(digest, ())
    except OSError as exc:
        return TreeCheck(digest, (f"{exc.filename or tree} (unreadable: {exc.strerror})",))
    expected = read_listing(tree, digest)
    if expected is None:
        return None
    changed = compare(tree, expected)
    if not changed:
        _write_manifest(tree, digest, wheel_sha256)
    return TreeCheck(digest, tuple(changed))


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
        target = into / name
        target.parent.mkdir(parents=True, exist_ok=True)
        digest = hashlib.sha256()
        with zf.open(info) as src, open(target, "xb") as dst:
            for chunk in iter(lambda: src.read(1 << 20), b""):
                digest.update(chunk)
                dst.write(chunk)
        written[name] = digest.hexdigest()
    bad = sorted(n for n in written if expected.get(n) != written[n])
    bad += sorted(f"{n} (listed in RECORD, not in the wheel)" for n in set(expected) - set(written))
    if bad:
        shown = ", ".join(bad[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
        raise SourceError(f"{wheel}: content does not match its RECORD: {shown}; refusing to use it")
    return written
