"""The layering stays true: read from the code's own imports with ``ast``, nothing is imported.

- no import cycle between difflab's top-level packages (``difflab.<unit>``);
- no ``difflab`` import inside a function, except in ``commands/`` (lazy imports there keep
  ``difflab --help`` fast and optional extras optional);
- step packages never import a workflow (``difflab.workflows``): only commands do;
- the in-environment package (``difflab.probe``) imports the standard library and itself only,
  because it runs inside the shared SGLang environment, whose Python has no lab dependencies;
- every workflow that writes a run folder goes through the session (``workflows/session.py``),
  which alone does the shared steps, and every command on it takes the shared options;
- every registry entry (``RUNNERS``, ``SOURCES``) implements its protocol, and no concrete source
  is built outside ``difflab.source``.
"""

from __future__ import annotations

import ast
import inspect
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from difflab.cli import build_parser
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


def _pop_component(stack: list[str], on_stack: set[str], root: str) -> list[str]:
    """Tarjan's pop: the units above ``root`` on the stack, ``root`` included, form one component."""
    component = []
    while True:
        w = stack.pop()
        on_stack.discard(w)
        component.append(w)
        if w == root:
            return component


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
            component = _pop_component(stack, on_stack, v)
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


# -- the session: every workflow that writes a run folder goes through it ------------------------------------
WORKFLOWS = PACKAGE / "workflows"
RUN_FOLDER_WORKFLOWS = ("backport", "contains", "fuzz", "gpu", "merge", "run", "selfcheck")
"""Workflows that write a run folder: each opens a :class:`~difflab.workflows.session.Session`."""
STEP_MODULES = ("bisect", "bisect_step", "observe", "reproduce", "session", "throughput")
"""Workflow modules that write no run folder of their own (a step, a re-run through ``run``, a bisect)."""
SHARED_STEPS = {
    "difflab.files.atomic.check_out",
    "difflab.files.atomic.results_folder",
    "difflab.report.record.RunRecord",
    "difflab.bundle.seal",
    "difflab.matrix.load_matrix",
    "difflab.runner.build_runner",
    "difflab.runner.jobs.check_probe_files",
}
"""What only the session does: check and create the folder, record, seal, load and select, build the runner."""


def test_every_workflow_module_is_either_a_run_folder_workflow_or_a_step() -> None:
    """A new workflow must be placed: a run folder workflow then has to go through the session."""
    found = {p.stem for p in WORKFLOWS.glob("*.py") if p.stem != "__init__"}
    assert found == set(RUN_FOLDER_WORKFLOWS) | set(STEP_MODULES)


def calls_session_open(module: str) -> bool:
    tree = ast.parse(MODULES[module].read_text())
    return any(
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "open"
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "Session"
        for node in ast.walk(tree)
    )


def test_every_run_folder_workflow_opens_a_session() -> None:
    assert [w for w in RUN_FOLDER_WORKFLOWS if not calls_session_open(f"difflab.workflows.{w}")] == []


def test_only_the_session_does_the_shared_steps() -> None:
    """The preamble is written once: no run folder workflow checks the folder, records, seals or builds a runner."""
    done_itself = [
        f"{w}:{line} imports {name}"
        for w in RUN_FOLDER_WORKFLOWS
        for name, _lazy, line in imports(f"difflab.workflows.{w}")
        if name in SHARED_STEPS
    ]
    assert done_itself == []
    assert any(name in SHARED_STEPS for name, _lazy, _line in imports("difflab.workflows.session"))


def parse(command: str, *argv: str) -> Any:
    return build_parser(command).parse_args([command, *argv])


@pytest.mark.parametrize("command", ["run", "observe", "selfcheck", "contains", "backport"])
def test_every_session_command_takes_the_shared_options(command: str, tmp_path: Path) -> None:
    required = {"backport": ["--repo", str(tmp_path), "--ref", "main"], "observe": ["--side", "head"]}
    fork = required.get(command, [])
    args = parse(command, *fork, "--timeout", "7", "--fix", "1")
    assert args.timeout == 7.0 and args.fixes == ["1"]
    if command != "observe":  # one side of a fan-out is merged, then sealed
        args = parse(command, *fork, "--no-bundle", "--key", str(tmp_path / "k.pem"))
        assert args.bundle is False and args.key == tmp_path / "k.pem"
    if command in ("run", "observe", "selfcheck"):
        args = parse(command, *fork, "--source", "git", "--repo", str(tmp_path))
        assert (args.source_kind, args.repo) == ("git", str(tmp_path))


# -- registries: every entry implements its protocol ----------------------------------------------------------
def protocol_members(protocol: type) -> set[str]:
    """The attributes and methods a protocol declares (its own, not ``Protocol``'s)."""
    own = set(getattr(protocol, "__annotations__", {})) | {
        name for name, value in vars(protocol).items() if callable(value) or isinstance(value, classmethod)
    }
    return {n for n in own if not n.startswith("_")}


def test_every_runner_implements_the_runner_protocol() -> None:
    from difflab.runner import RUNNERS
    from difflab.runner.base import Runner

    members = protocol_members(Runner)
    assert {"name", "result_cache", "local_environment", "hermetic", "describe", "run"} <= members
    for name, cls in RUNNERS.items():
        assert cls.name == name
        assert [m for m in members if not hasattr(cls, m)] == [], cls
        assert {f: type(getattr(cls, f)) for f in ("result_cache", "local_environment", "hermetic")} == dict.fromkeys(
            ("result_cache", "local_environment", "hermetic"), bool
        ), cls


def test_every_source_implements_the_source_protocol() -> None:
    from difflab.source import SOURCES
    from difflab.source.base import SourceBackend

    members = protocol_members(SourceBackend)
    assert {"kind", "for_matrix", "pin", "materialise"} <= members
    for kind, cls in SOURCES.items():
        assert cls.kind == kind
        assert [m for m in members if not hasattr(cls, m)] == [], cls
        assert isinstance(inspect.getattr_static(cls, "for_matrix"), classmethod), cls


def test_no_concrete_source_is_built_outside_the_source_package() -> None:
    from difflab.source import SOURCES

    classes = {cls.__name__ for cls in SOURCES.values()}
    built = [
        f"{path.relative_to(PACKAGE.parent)}:{node.lineno} builds {node.func.id}"
        for module, path in MODULES.items()
        if unit(module) != "source"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in classes
    ]
    assert built == []
