"""Streaming a root filesystem as a hashed, reproducible tar: what passes is counted and hashed on the way.

Entries are owned by root and readable by anyone (the probe may run as the caller's uid);
the same tar-entry normalisation as the evidence bundle's (:mod:`difflab.files.tar`).
"""

from __future__ import annotations

import hashlib
import io
import tarfile
from pathlib import PurePosixPath
from typing import Any

from difflab.files.tar import owned_by_root


class HashingWriter(io.RawIOBase):
    """A write-only file object that forwards to ``sink`` and counts/hashes what passes."""

    def __init__(self, sink: Any) -> None:
        self.sink = sink
        self.sha256 = hashlib.sha256()
        self.count = 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self.sink.write(view)
        self.sha256.update(view)
        self.count += len(view)
        return len(view)


def add_parents(tar: tarfile.TarFile, dest: str, done: set[str]) -> None:
    """Folder entries for every parent of ``dest`` not written yet (fixed mode and time)."""
    parts = PurePosixPath(dest).parts if dest else ()
    for i in range(1, len(parts)):
        parent = "/".join(parts[:i])
        if parent in done:
            continue
        done.add(parent)
        info = tarfile.TarInfo(parent)
        info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, 0
        tar.addfile(info)


def normalise(info: tarfile.TarInfo) -> tarfile.TarInfo:
    """Owned by root and readable by anyone (the probe may run as the caller's uid).

    Modification times are kept: the ``.pyc`` files are validated against them, and
    without valid ``.pyc`` files every probe would recompile torch (seconds each).
    """
    owned_by_root(info)
    if info.isdir():
        info.mode = (info.mode | 0o755) & 0o7777
    elif info.isreg():
        info.mode = (info.mode | 0o444 | (0o111 if info.mode & 0o100 else 0)) & 0o7777
    return info
