"""``SHA256SUMS`` in the format ``sha256sum -c`` reads, so a bundle can be checked without difflab."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

from difflab.bundle import layout
from difflab.bundle.problems import Problem
from difflab.errors import ConfigError

_LINE = re.compile(r"^([0-9a-fA-F]{64}) [ *](.+)$")


def sha256_file(path: Path) -> str:
    """Hex digest, streamed so large logs do not sit in memory."""
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def digests(root: Path, files: Iterable[str]) -> dict[str, str]:
    """Digest of each listed regular file under ``root``."""
    return {rel: sha256_file(root / rel) for rel in files}


def render(entries: Mapping[str, str]) -> str:
    """One ``<hex>  <path>`` line per file, bytewise sorted by path.

    Names that GNU sha256sum would escape (newline, backslash) are refused rather than escaped,
    so the file reads the same in every implementation.
    """
    lines = []
    for rel in layout.bytewise(entries):
        if any(ch in rel for ch in "\n\r\\") or not layout.safe_relpath(rel):
            raise ConfigError(f"{rel!r}: file name cannot be listed in {layout.CHECKSUMS}")
        try:
            rel.encode("utf-8")
        except UnicodeEncodeError:
            raise ConfigError(f"{rel!r}: file name is not valid UTF-8") from None
        lines.append(f"{entries[rel]}  {rel}\n")
    return "".join(lines)


def write(root: Path, files: Iterable[str]) -> Path:
    """Write ``SHA256SUMS`` for ``files`` (everything except itself)."""
    entries = digests(root, (f for f in files if f != layout.CHECKSUMS))
    out = root / layout.CHECKSUMS
    out.write_bytes(render(entries).encode("utf-8"))
    return out


def parse(text: str) -> tuple[dict[str, str], list[Problem]]:
    """Entries and malformed lines; a path that would leave the folder is a problem, never opened."""
    entries: dict[str, str] = {}
    problems: list[Problem] = []
    for number, line in enumerate(text.splitlines(), start=1):
        where = f"{layout.CHECKSUMS} line {number}"
        match = _LINE.match(line)
        if not match:
            problems.append(Problem(where, "not a '<sha256>  <path>' line"))
            continue
        digest, rel = match.group(1).lower(), match.group(2)
        if not layout.safe_relpath(rel):
            problems.append(Problem(where, f"unsafe path {rel!r}"))
        elif rel in entries:
            problems.append(Problem(rel, f"listed twice in {layout.CHECKSUMS}"))
        else:
            entries[rel] = digest
    return entries, problems


def compare(listed: Mapping[str, str], actual: Mapping[str, str]) -> list[Problem]:
    """Missing, changed and unlisted files (``actual`` excludes ``SHA256SUMS`` itself)."""
    problems = []
    for rel, digest in listed.items():
        if rel not in actual:
            problems.append(Problem(rel, f"listed in {layout.CHECKSUMS} but missing"))
        elif actual[rel] != digest:
            message = f"sha256 {actual[rel]} does not match {layout.CHECKSUMS} ({digest})"
            problems.append(Problem(rel, message))
    for rel in actual:
        if rel not in listed:
            problems.append(Problem(rel, f"not listed in {layout.CHECKSUMS}"))
    return problems
