"""A head source with one reverting mutation applied: a copy beside the pristine cache, never an edit of it.

The copy is hard links to the pristine tree with only the edited file a real copy, kept under
``$DIFFLAB_CACHE/mutated`` by a key of the source digest and the edit, so a second self-check
reuses it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from difflab.errors import ConfigError
from difflab.files.atomic import atomic_folder
from difflab.matrix.model import Mutation
from difflab.paths import cache_root
from difflab.source.base import MaterialisedSource


class StaleMutation(Exception):  # noqa: N818 - an outcome, reported as mutation-stale
    """The text a mutation expects is not in the head source (the code moved)."""


def _inside(path: Path, folder: Path) -> bool:
    return path.resolve().is_relative_to(folder.resolve())


def _checked_text(source: MaterialisedSource, mutation: Mutation) -> str:
    """The file's text, once its path and the mutation's unique anchor are checked."""
    target_file = source.root / mutation.file
    if not _inside(target_file, source.root / "sglang"):
        raise ConfigError(
            f"mutation {mutation.name!r}: file {mutation.file!r} is not inside the source's sglang/ tree; refused"
        )
    if not target_file.is_file():
        raise StaleMutation(f"{mutation.file} does not exist in {source.label}")
    text = target_file.read_text()
    hits = text.count(mutation.find)
    if hits != 1:
        where = "not found" if hits == 0 else f"found {hits} times (must be unique)"
        raise StaleMutation(f"expected text {where} in {mutation.file} of {source.label}")
    return text


def _write_copy(source: MaterialisedSource, mutation: Mutation, text: str, dest: Path) -> None:
    with atomic_folder(dest) as tmp:
        shutil.copytree(source.root / "sglang", tmp / "sglang", copy_function=os.link)
        edited = tmp / mutation.file
        if not _inside(edited, tmp):
            raise ConfigError(f"mutation {mutation.name!r}: {mutation.file!r} leaves the mutated copy; refused")
        edited.parent.chmod(0o755)  # the pristine tree's folders are read-only, and so are the copies
        edited.unlink()  # break the hard link before writing
        edited.write_text(text.replace(mutation.find, mutation.replace))


def mutated_copy(source: MaterialisedSource, mutation: Mutation, cache: Path | None = None) -> MaterialisedSource:
    """A copy of ``source`` with ``mutation`` applied; the pristine cache is never modified.

    The loader already refuses absolute and ``..`` paths; this is checked again here, after
    links are resolved, because the edit rewrites a file: it must be one inside the copied tree.
    Any source kind (a release's tree, a git worktree's ``python/``) is copied the same way.
    """
    text = _checked_text(source, mutation)
    key = hashlib.sha256(
        "\0".join([source.digest, mutation.file, mutation.find, mutation.replace]).encode()
    ).hexdigest()[:16]
    dest = (cache or cache_root()) / "mutated" / f"{source.label}-{mutation.name}-{key}"
    if not (dest / mutation.file).exists():
        _write_copy(source, mutation, text, dest)
    identity = dict(source.identity) | {"mutation": mutation.name, "mutated_file": mutation.file}
    return MaterialisedSource(
        label=f"{source.label}+{mutation.name}",
        kind="mutated",
        root=dest,
        identity=identity,
        digest=f"{source.digest}+mut:{key}",
    )
