"""Which names an SGLang source defines, read from its files with ``ast`` (the lab never imports SGLang).

A test that fails because it needs a name its side lacks says something about the fix only
when the fix adds that name: present at the fix's head, absent at its base. Anything else
(a name added or removed by an unrelated change) means the test does not fit that code.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def _targets(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Tuple | ast.List):
        return [n for elt in node.elts for n in _targets(elt)]
    return []


def body_names(body: list[ast.stmt]) -> set[str]:
    """Names a module or class body binds: defs, classes, assignments, imports (one level of ``if``/``try``)."""
    names: set[str] = set()
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(n for t in node.targets for n in _targets(t))
        elif isinstance(node, ast.AnnAssign):
            names.update(_targets(node.target))
        elif isinstance(node, ast.Import):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            names.update(a.asname or a.name for a in node.names)
        elif isinstance(node, ast.If | ast.Try):
            nested = [*node.body, *node.orelse, *getattr(node, "finalbody", [])]
            for handler in getattr(node, "handlers", []):
                nested += handler.body
            names |= body_names(nested)
    return names


@dataclass
class SymbolIndex:
    """The modules and names under ``root`` (the folder holding ``sglang/``), parsed on demand."""

    root: Path
    _trees: dict[str, ast.Module | None] = field(default_factory=dict, repr=False)

    def _file(self, module: str) -> Path | None:
        base = self.root.joinpath(*module.split("."))
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if candidate.is_file():
                return candidate
        return None

    def tree(self, module: str) -> ast.Module | None:
        if module not in self._trees:
            path = self._file(module)
            try:
                self._trees[module] = ast.parse(path.read_text(errors="replace")) if path else None
            except SyntaxError:
                self._trees[module] = None
        return self._trees[module]

    def has_module(self, module: str) -> bool:
        return self._file(module) is not None

    def defines(self, module: str, name: str) -> bool:
        """``from module import name`` would find it: a top-level binding or a submodule."""
        tree = self.tree(module)
        return (tree is not None and name in body_names(tree.body)) or self.has_module(f"{module}.{name}")

    def class_defines(self, owner: str, name: str) -> bool:
        """The class ``module:Qual.Name`` binds ``name`` in its own body (a method or class attribute)."""
        module, _, qualname = owner.partition(":")
        tree = self.tree(module)
        body: list[ast.stmt] | None = tree.body if tree else None
        for part in qualname.split("."):
            node = next((n for n in body or [] if isinstance(n, ast.ClassDef) and n.name == part), None)
            if node is None:
                return False
            body = node.body
        return name in body_names(body or [])

    def has(self, missing: dict[str, Any]) -> bool:
        """Whether this source has what a test found missing (see ``upstream_facts.missing_symbol``)."""
        name = missing.get("name")
        if missing.get("owners"):
            return any(self.class_defines(o, str(name)) for o in missing["owners"])
        module = str(missing.get("module") or "")
        return self.has_module(module) if name is None else self.defines(module, str(name))


def symbol_name(missing: dict[str, Any]) -> str:
    """The missing name as a reader would write it: ``sglang.x.y.name`` or ``Class.attr``."""
    name = missing.get("name")
    if missing.get("owners"):
        return f"{str(missing['owners'][0]).partition(':')[2]}.{name}"
    return str(missing.get("module")) + (f".{name}" if name else "")
