"""The layering stays true: read from the code's own imports with ``ast``, nothing is imported.

- no import cycle between difflab's top-level packages (``difflab.<unit>``);
- no ``difflab`` import inside a function, except in ``commands/`` (lazy imports there keep
  ``difflab --help`` fast and optional extras optional);
- step packages never import a workflow (``difflab.workflows``): only commands do;
- the in-environment package (``difflab.probe``) imports the standard library and itself only,
  because it runs inside the shared SGLang environment, whose Python has no lab dependencies.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Callable
from pathlib import Path

from difflab.runner import childlib

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "difflab"
IN_ENVIRONMENT = "probe"
LAZY_ALLOWED = ("commands",)
MAY_IMPORT_WORKFLOWS = ("commands", "workflows")


def modules() -> dict[str, Path]:
    """``difflab.x.y`` -> file, for every module of the package."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def imported(module: str, node: ast.Import | ast.ImportFrom) -> list[str]:
    """Absolute names an import statement brings in (``from x import y`` gives ``x.y`` and ``x``)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    base = node.module or ""
    if node.level:  # relative: from the module's package, one level up per extra dot
        package = module.split(".") if MODULES[module].name == "__init__.py" else module.split(".")[:-1]
        package = package[: len(package) - (node.level - 1)]
        base = ".".join([*package, base] if base else package)
    return [base, *(f"{base}.{a.name}" for a in node.names)]


MODULES = modules()


def imports(module: str) -> list[tuple[str, bool, int]]:
    """(imported name, inside a function?, line) for every import in ``module``."""
    tree = ast.parse(MODULES[module].read_text(), str(MODULES[module]))
    found: list[tuple[str, bool, int]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import | ast.ImportFrom):
                found.extend((name, in_function, child.lineno) for name in imported(module, child))
            visit(child, in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda))

    visit(tree, False)
    return found


def unit(name: str) -> str | None:
    """The top-level unit of a difflab module name (``difflab.runner.warm`` -> ``runner``)."""
    parts = name.split(".")
    if parts[0] != "difflab" or len(parts) < 2:
        return None
    return parts[1] if f"difflab.{parts[1]}" in MODULES else None


def unit_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for module in MODULES:
        own = unit(module)
        if own is None:
            continue
        targets = graph.setdefault(own, set())
        for name, _lazy, _line in imports(module):
            other = unit(name)
            if other is not None and other != own:
                targets.add(other)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component with more than one unit (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return found


def test_the_parser_sees_the_known_edges() -> None:
    graph = unit_graph()
    assert "workflows" in graph["commands"]
    assert "matrix" in graph["diff"]


def test_no_import_cycle_between_top_level_packages() -> None:
    assert cycles(unit_graph()) == []


def offending(units: Callable[[str | None], bool], bad: Callable[[str, bool], bool]) -> list[str]:
    """``file:line imports name`` for every import of a module in ``units`` that ``bad`` rejects."""
    return [
        f"{MODULES[m].relative_to(PACKAGE.parent)}:{line} imports {name}"
        for m in MODULES
        if units(unit(m))
        for name, in_function, line in imports(m)
        if bad(name, in_function)
    ]


def test_no_difflab_import_inside_a_function_outside_commands() -> None:
    lazy = offending(
        lambda u: u not in LAZY_ALLOWED, lambda name, in_function: in_function and name.split(".")[0] == "difflab"
    )
    assert lazy == []


def test_only_commands_import_workflows() -> None:
    assert offending(lambda u: u not in MAY_IMPORT_WORKFLOWS, lambda name, _: unit(name) == "workflows") == []


def test_the_in_environment_package_needs_the_standard_library_only() -> None:
    stdlib = set(sys.stdlib_module_names) | {"__future__"}

    def foreign(name: str, in_function: bool) -> bool:
        top = name.split(".")[0]
        if top in stdlib or name == "difflab" or unit(name) == IN_ENVIRONMENT:
            return False
        return not (top == "sglang" and in_function)  # the code under test, imported where it is probed

    assert offending(lambda u: u == IN_ENVIRONMENT, foreign) == []


def test_the_staged_child_package_is_the_whole_in_environment_package() -> None:
    staged = set(childlib.child_files())
    assert {f"{IN_ENVIRONMENT}/{p.name}" for p in (PACKAGE / IN_ENVIRONMENT).glob("*.py")} <= staged
    assert "__init__.py" in staged and all(rel.startswith(f"{IN_ENVIRONMENT}/") for rel in staged - {"__init__.py"})
