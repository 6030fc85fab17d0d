"""Where a fix's upstream test files come from: a source's own ``test/`` tree, or a folder the user gives.

``--upstream-tests DIR`` (or ``$DIFFLAB_UPSTREAM_TESTS``) is a folder laid out like SGLang's
repository: the matrix names ``test/registered/unit/...`` paths, found under ``DIR``. A git
source checked out with its ``test/`` tree (``run --source git``, a fork's ref) is searched
first, so a fork's own copy of a test wins over the folder's. Each file used is recorded
with where it came from and its sha256; the files themselves are never copied into results.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from difflab.errors import ConfigError

ENV = "DIFFLAB_UPSTREAM_TESTS"
OPTION = "--upstream-tests"


def tests_dir(value: Path | str | None) -> Path | None:
    """The folder of SGLang test files from the option, else ``$DIFFLAB_UPSTREAM_TESTS``, checked; None if neither."""
    origin = OPTION
    if value is None or value == "":
        env = os.environ.get(ENV, "")
        if not env:
            return None
        value, origin = env, f"${ENV}"
    path = Path(value).expanduser()
    if not path.is_dir():
        raise ConfigError(f"{origin} {value}: not a folder")
    if not (path / "test").is_dir():
        raise ConfigError(
            f"{origin} {value}: has no test/ folder; give a folder laid out like SGLang's repository "
            "(test/registered/unit/...), e.g. a sparse checkout of SGLang's test/ tree"
        )
    return path.resolve()


@dataclass(frozen=True)
class Tree:
    """A folder holding ``test/`` and what to call it in results."""

    root: Path
    origin: str


@dataclass(frozen=True)
class TestFile:
    """One test file as used: its id (path under the root), the file, its root and origin, its sha256."""

    __test__ = False  # not a pytest class

    id: str
    path: Path
    root: Path
    origin: str
    sha256: str

    def to_dict(self) -> dict[str, Any]:
        return {"file": self.id, "from": self.origin, "path": str(self.path), "sha256": self.sha256}

    def request(self) -> dict[str, str]:
        return {"id": self.id, "path": str(self.path), "root": str(self.root)}


def locate(rel: str, trees: list[Tree]) -> TestFile | None:
    """The first tree holding ``rel``."""
    for tree in trees:
        path = tree.root / rel
        if path.is_file():
            return TestFile(rel, path, tree.root, tree.origin, hashlib.sha256(path.read_bytes()).hexdigest())
    return None


def folder_tree(folder: Path | None) -> list[Tree]:
    return [Tree(folder, f"{OPTION} {folder}")] if folder is not None else []
