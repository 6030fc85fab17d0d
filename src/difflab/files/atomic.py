"""Write a run folder under a temporary sibling and move it into place only when complete.

Every command that writes results (run, merge, contains, selfcheck, backport, gpu) goes
through here: a crashed or interrupted run never replaces a good result folder, and
nothing half-written is left behind.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from difflab.errors import ConfigError


@contextmanager
def atomic_folder(out: Path) -> Iterator[Path]:
    """Yield a work folder; on success it becomes ``out`` (replacing an old one), on error it is removed."""
    out = out.resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.partial-"))
    try:
        yield work
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    if out.exists():
        if not out.is_dir():
            shutil.rmtree(work, ignore_errors=True)
            raise ConfigError(f"--out {out} exists and is not a folder")
        old = out.with_name(f".{out.name}.old-{os.getpid()}")
        os.replace(out, old)
        os.replace(work, out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(work, out)
