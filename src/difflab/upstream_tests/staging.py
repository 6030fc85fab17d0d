"""Stage the lab's own pytest for the test child, the way :mod:`difflab.runner.childlib` stages ``difflab.probe``.

SGLang's pytest-style test files need pytest; the shared environment holds SGLang's
dependencies and no pytest. Installing it there would change the environment every result
is pinned to, so the lab copies its *own* installed pytest and the distributions pytest
requires on this Python into ``$DIFFLAB_CACHE/childlib-pytest/<digest>`` (keyed by their
names and versions). The child appends that folder to the end of ``sys.path``: whatever
the environment already has (``packaging``, ``pygments``) keeps its own version, and only
what it lacks comes from there.
"""

from __future__ import annotations

import hashlib
import importlib.metadata as metadata
import shutil
from pathlib import Path

from packaging.requirements import Requirement

from difflab.errors import EnvironmentSetupError
from difflab.files.atomic import atomic_folder
from difflab.paths import cache_root

ROOT = "pytest"
MARKER = ".difflab-staged"


def closure(name: str = ROOT) -> list[metadata.Distribution]:
    """``name`` and every distribution it requires on this interpreter (extras left out), each once."""
    seen: dict[str, metadata.Distribution] = {}
    todo = [name]
    while todo:
        wanted = todo.pop()
        key = wanted.lower().replace("_", "-")
        if key in seen:
            continue
        try:
            dist = metadata.distribution(wanted)
        except metadata.PackageNotFoundError:
            raise EnvironmentSetupError(
                f"{wanted} is not installed in the lab's environment; it is needed to run SGLang's "
                "pytest-style test files (pip install pytest)"
            ) from None
        seen[key] = dist
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return [seen[k] for k in sorted(seen)]


def digest(dists: list[metadata.Distribution]) -> str:
    h = hashlib.sha256()
    for d in dists:
        h.update(f"{d.metadata['Name']}=={d.version}\0".encode())
    return h.hexdigest()


def versions(dists: list[metadata.Distribution]) -> dict[str, str]:
    return {str(d.metadata["Name"]): d.version for d in dists}


def stage_pytest(cache: Path | None = None) -> Path:
    """A folder holding the lab's pytest and its requirements (``$DIFFLAB_CACHE/childlib-pytest/<digest>``)."""
    dists = closure()
    target = (cache or cache_root()) / "childlib-pytest" / digest(dists)[:16]
    if (target / MARKER).exists():
        return target
    with atomic_folder(target, keep_existing=True) as tmp:  # another process may have staged it first
        for dist in dists:
            for rel in dist.files or []:
                parts = Path(rel).parts
                if ".." in parts or "__pycache__" in parts:
                    continue  # console scripts live outside site-packages; bytecode is rebuilt
                source = Path(str(dist.locate_file(rel)))
                if source.is_file():
                    dest = tmp / rel
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(source, dest)
        (tmp / MARKER).write_text("".join(f"{n}=={v}\n" for n, v in versions(dists).items()))
    return target
