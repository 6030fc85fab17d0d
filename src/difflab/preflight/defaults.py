"""The configuration-only defences of the KV-safety family, as a build ships them.

Three members of the family change no code path a probe can tell apart: they are switches an
operator sets. What a build can be judged on is its *default*: a deployment that sets nothing
gets it. This module reads each switch's default from the build's own tree, where the build
declares it: the ``envs`` table of ``sglang/srt/environ.py`` (``NAME = EnvBool(True)``) and the
server-argument dataclass fields (``name: A[...] = False``, in ``server_args.py`` up to 0.5.20
and ``arg_groups/fields/*.py`` from 0.5.21). The values are the build's literals, read with
``ast`` (nothing is imported, so a fork's tree is never executed); a default a start-up hook
rewrites at run time is not seen here, which is why ``difflab preflight --prefill/--decode``
reads the running engines as well.

Option names per release, from the release trees 0.5.19-0.5.23:

- deferred decode KV release (#37454, #41023): ``SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE``,
  ``EnvBool(False)`` in 0.5.19/0.5.20, ``EnvBool(True)`` from 0.5.21; read by ``decode.py`` (decode's
  queue) and ``disaggregation/common/conn.py`` (the KV manager of both roles), so both must have it;
- Mooncake transfer batch cap (#32758): ``SGLANG_MOONCAKE_MAX_TRANSFER_BATCH_INDICES``, from 0.5.20,
  ``EnvInt(0)`` (0 keeps one unbounded batch); absent in 0.5.19;
- PD KV checksum (#39500): server argument ``disaggregation_enable_kv_checksum``
  (``--disaggregation-enable-kv-checksum``), from 0.5.21, default ``False``; absent before.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from difflab.errors import ConfigError

ENVIRON = "sglang/srt/environ.py"
SERVER_ARGS = ("sglang/srt/server_args.py", "sglang/srt/arg_groups/fields")
READERS = "sglang/srt/disaggregation"


@dataclass(frozen=True)
class Defence:
    """A switch that defends against a family member; ``protects`` says whether a value does."""

    key: str
    title: str
    fixes: tuple[int, ...]
    kind: str  # "env" (an environment variable SGLang's envs table declares) | "server-arg"
    option: str
    protects: Callable[[Any], bool]
    flag: str | None = None
    """The command-line spelling of a server argument."""


DEFENCES = (
    Defence(
        "deferred-release",
        "deferred decode KV release",
        (37454, 41023),
        "env",
        "SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE",
        lambda v: v is True,
    ),
    Defence(
        "transfer-batch",
        "Mooncake transfer batch cap",
        (32758,),
        "env",
        "SGLANG_MOONCAKE_MAX_TRANSFER_BATCH_INDICES",
        lambda v: isinstance(v, int) and not isinstance(v, bool) and v > 0,
    ),
    Defence(
        "kv-checksum",
        "PD KV checksum",
        (39500,),
        "server-arg",
        "disaggregation_enable_kv_checksum",
        lambda v: v is True,
        flag="--disaggregation-enable-kv-checksum",
    ),
)


@dataclass(frozen=True)
class BuildDefault:
    """One defence's default in one build (``found`` False: the build has no such option)."""

    key: str
    title: str
    fixes: tuple[int, ...]
    option: str
    found: bool
    value: Any = None
    where: str | None = None
    """``file:line`` of the declaration in the build's tree."""
    protects: bool = False
    read_by: tuple[str, ...] = ()
    """Files under ``sglang/srt/disaggregation`` that read an environment switch (which roles need it)."""

    def describe(self) -> str:
        prs = ", ".join(f"#{n}" for n in self.fixes)
        if not self.found:
            return f"{self.title} ({prs}): this build has no {self.option}: not available"
        state = "protects by default" if self.protects else "does NOT protect unless set"
        read = f"; read by {', '.join(self.read_by)}" if self.read_by else ""
        return f"{self.title} ({prs}): {self.option} defaults to {self.value!r} ({self.where}): {state}{read}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "title": self.title,
            "fixes": list(self.fixes),
            "option": self.option,
            "found": self.found,
            "value": self.value,
            "where": self.where,
            "protects": self.protects,
            "read_by": list(self.read_by),
        }


def sglang_root(path: Path) -> Path:
    """The folder holding ``sglang/`` (a materialised source's root, or the package folder itself)."""
    for root in (path, path.parent):
        if (root / "sglang" / "srt").is_dir():
            return root
    raise ConfigError(f"{path}: not a build's tree (no sglang/srt under it)")


def _literal(node: ast.AST | None) -> tuple[bool, Any]:
    try:
        return True, ast.literal_eval(node) if node is not None else None
    except ValueError:
        return False, None


def _env_default(tree: ast.AST, name: str) -> tuple[int, Any] | None:
    """``NAME = EnvBool(default)`` anywhere in environ.py: its line and literal default."""
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)):
            continue
        if any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            ok, value = _literal(node.value.args[0] if node.value.args else None)
            return (node.lineno, value) if ok else None
    return None


def _field_default(tree: ast.AST, name: str) -> tuple[int, Any] | None:
    """``name: A[...] = default`` in a class body: its line and literal default."""
    for node in ast.walk(tree):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == name:
            ok, value = _literal(node.value)
            return (node.lineno, value) if ok else None
    return None


def _parsed(path: Path) -> ast.AST | None:
    try:
        return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return None


def _files(root: Path, defence: Defence) -> list[Path]:
    if defence.kind == "env":
        return [root / ENVIRON]
    found = []
    for rel in SERVER_ARGS:
        path = root / rel
        found += sorted(path.glob("*.py")) if path.is_dir() else [path]
    return found


def _readers(root: Path, option: str) -> tuple[str, ...]:
    folder = root / READERS
    hits = []
    for path in sorted(folder.rglob("*.py")):
        try:
            if option in path.read_text(encoding="utf-8"):
                hits.append(path.relative_to(root / "sglang" / "srt").as_posix())
        except (OSError, UnicodeDecodeError):
            continue
    return tuple(hits)


def read_default(root: Path, defence: Defence) -> BuildDefault:
    """One defence's default as ``root``'s tree declares it."""
    reader = _env_default if defence.kind == "env" else _field_default
    for path in _files(root, defence):
        tree = _parsed(path) if path.is_file() else None
        hit = reader(tree, defence.option) if tree is not None else None
        if hit is not None:
            line, value = hit
            return BuildDefault(
                defence.key,
                defence.title,
                defence.fixes,
                defence.option if defence.flag is None else f"{defence.option} ({defence.flag})",
                True,
                value,
                f"{path.relative_to(root).as_posix()}:{line}",
                defence.protects(value),
                _readers(root, defence.option) if defence.kind == "env" else (),
            )
    return BuildDefault(defence.key, defence.title, defence.fixes, defence.option, False)


def read_defaults(path: Path) -> list[BuildDefault]:
    """Every configuration-only defence's default in the build at ``path`` (a tree without one: not found)."""
    root = path if (path / "sglang").is_dir() or not (path.parent / "sglang").is_dir() else path.parent
    return [read_default(root, d) for d in DEFENCES]
