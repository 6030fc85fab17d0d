"""Write a folder or a file under a temporary sibling and move it into place only when complete.

Every command that writes results (run, merge, contains, selfcheck, backport, gpu) and every
cache entry (unpacked releases, mutated sources, mirrors, the environment, the staged child
package, lock files, stored observations) goes through here: a crashed or interrupted writer
never replaces a good folder or file, and nothing half-written is left behind.
"""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from difflab.errors import ConfigError


@contextmanager
def atomic_folder(out: Path, *, keep_existing: bool = False) -> Iterator[Path]:
    """Yield a work folder; on success it becomes ``out``, on error it is removed.

    An existing ``out`` is replaced, unless ``keep_existing``: then whichever folder got there
    first stays and this one is discarded (content-addressed caches, which a concurrent process
    may be reading while this one finishes).
    """
    out = out.resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.partial-"))
    try:
        yield work
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    if out.exists() and keep_existing:
        shutil.rmtree(work, ignore_errors=True)
    elif out.exists():
        if not out.is_dir():
            shutil.rmtree(work, ignore_errors=True)
            raise ConfigError(f"--out {out} exists and is not a folder")
        old = out.with_name(f".{out.name}.old-{os.getpid()}")
        os.replace(out, old)
        os.replace(work, out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        try:
            os.replace(work, out)
        except OSError:  # another process put it there in the meantime
            shutil.rmtree(work, ignore_errors=True)
            if not (keep_existing and out.is_dir()):
                raise


def write_atomic(path: Path, data: str | bytes) -> Path:
    """Write ``data`` to a temporary sibling and rename it over ``path``: a reader sees all or nothing."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}.part")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the umask decides, as for any file
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data.encode() if isinstance(data, str) else data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
