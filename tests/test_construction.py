"""The constructor reader answers from the build's code, or names what it cannot read; it never guesses.

Each class below is written in a module file of its own, the way SGLang writes
its constructors, so the reader parses real source as it does for a build:
the supported subset (literals, env defaults, the published ``server_args``,
locals, decidable ``if``) and each construct outside it (a loop, a ``try``,
conflicting constructors, an undecidable test, a reassigned local).
"""

from __future__ import annotations

import ast
import importlib.util
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

from difflab.paths import shipped_probes

PROBES = shipped_probes()  # the checkout's probes/ (under mutation, the mutated copy beside the copied package)
HARNESS = PROBES / "harness"

MODULE = """
import collections
import os
import threading
import time


class EnvFlag:
    def __init__(self, default):
        self.default = default

    def get(self):
        return self.default


class envs:
    FORK_SWITCH = EnvFlag({switch})
    FORK_TIMEOUT = EnvFlag(30)


POLICY = "prefill_complete"


def make_pool(size):
    return ["slot"] * size


class Base:
    def __init__(self, server_args, mode, size=2):
        self.mode = mode
        self.switch = envs.FORK_SWITCH.get()
        self.policy_matches = server_args.decode_policy == POLICY
        self.counts = collections.defaultdict(int)
        self.lock = threading.Lock()
        self.pool = make_pool(size)
        self.shared = 1
        if mode == "decode":
            self.side = "decode"
        else:
            self.side = "prefill"
        timeout = envs.FORK_TIMEOUT.get()
        self.deadline = timeout * 2 if self.switch else None
        for index in range(size):
            self.looped = index
        self.last_index = index
        try:
            self.tried = int("3")
        except ValueError:
            self.tried = 0
        if time.monotonic() > 0:
            self.undecidable = True
        retries = 1
        retries = 2
        self.retries = retries
        limit = server_args.limit
        limit = limit or 5
        self.limit = limit
        if mode == "decode":
            width = 4
        else:
            width = 8
        self.width = width
        self.with_text = f"{{mode}}"
        self.method_result = self.compute()
        self.lambda_value = (lambda: 1)()
        self.unknown_call = os.getcwd()

    def compute(self):
        return 5


class Child(Base):
    def __init__(self, server_args, mode):
        super().__init__(server_args, mode)
        self.shared = 2
        self.extra = envs.FORK_SWITCH.get() and self.supported

    supported = True
"""


def _load(tmp_path: Path, name: str, switch: bool = True) -> ModuleType:
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(MODULE.format(switch=switch)))
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def construction() -> Iterator[ModuleType]:
    sys.path.insert(0, str(PROBES))
    try:
        import harness.construction as construction

        yield construction
    finally:
        sys.path.remove(str(PROBES))


def _read(construction: ModuleType, module: ModuleType, attribute: str, cls: str = "Base", **state: Any) -> Any:
    obj = object.__new__(getattr(module, cls))
    vars(obj).update(state)
    server_args = SimpleNamespace(decode_policy="prefill_complete", opaque_mode=None, limit=0)
    reader = construction.ConstructorReader()
    value, _ = reader.build_default(obj, getattr(module, cls), attribute, {"server_args": server_args})
    return value


@pytest.mark.parametrize("switch", [True, False])
def test_the_subset_is_read_from_the_build_s_code(tmp_path: Path, construction: ModuleType, switch: bool) -> None:
    module = _load(tmp_path, f"subset_{switch}", switch)
    read = lambda attribute, **state: _read(construction, module, attribute, **state)  # noqa: E731
    assert read("switch", mode="prefill") is switch  # an env default, through a method of a module object
    assert read("policy_matches", mode="prefill") is True  # a published server_args field and a module constant
    assert type(read("counts", mode="prefill")) is module.collections.defaultdict
    assert read("lock", mode="prefill") is not None
    assert read("pool", mode="prefill") == ["slot", "slot"]  # the build's own function, a declared default
    assert read("side", mode="decode") == "decode" and read("side", mode="prefill") == "prefill"
    assert read("deadline", mode="prefill", switch=True) == 60  # a local bound once, in a conditional
    assert read("deadline", mode="prefill", switch=False) is None
    assert read("width", mode="decode") == 4  # bound twice, but only once on the path that runs


def test_a_parameter_comes_from_what_the_object_kept(tmp_path: Path, construction: ModuleType) -> None:
    module = _load(tmp_path, "subset_stored")
    assert _read(construction, module, "side", mode="decode") == "decode"
    with pytest.raises(construction.NotEvaluable, match=r"parameter `mode` of Base.__init__ has no value here"):
        _read(construction, module, "side")


@pytest.mark.parametrize(
    ("attribute", "named"),
    [
        ("looped", r"inside a `for` loop \(line \d+\)"),
        ("tried", r"inside a `try` \(line \d+\)"),
        ("last_index", r"local `index` of Base.__init__ is bound by a `for` target \(line \d+\)"),
        ("undecidable", r"cannot decide: `if time.monotonic\(\) > 0`"),
        ("retries", r"local `retries` of Base.__init__ is assigned 2 times \(lines \d+, \d+\)"),
        ("limit", r"local `limit` of Base.__init__ is assigned 2 times"),
        ("with_text", r"is an f-string, outside what the harness reads"),
        ("method_result", r"`self.compute\(\)` is a method call on the object under construction"),
        ("lambda_value", r"is a lambda, outside what the harness reads"),
        ("unknown_call", r"`os.getcwd\(\)` is neither the build's own code nor a call the harness knows"),
    ],
)
def test_a_construct_outside_the_subset_is_an_error_naming_it(
    tmp_path: Path, construction: ModuleType, attribute: str, named: str
) -> None:
    module = _load(tmp_path, f"outside_{attribute}")
    with pytest.raises(construction.NotEvaluable, match=named):
        _read(construction, module, attribute, mode="prefill")


def test_two_constructors_assigning_different_values_is_an_error(tmp_path: Path, construction: ModuleType) -> None:
    module = _load(tmp_path, "conflicting")
    with pytest.raises(construction.NotEvaluable, match=r"different values in several constructor functions"):
        _read(construction, module, "shared", cls="Child", mode="prefill")
    assert _read(construction, module, "switch", cls="Child", mode="prefill") is True  # the same value: fine
    assert _read(construction, module, "extra", cls="Child", mode="prefill") is True  # a class attribute read


def test_a_missing_server_args_is_named_not_guessed(tmp_path: Path, construction: ModuleType) -> None:
    module = _load(tmp_path, "unpublished")
    obj = object.__new__(module.Base)
    obj.mode = "prefill"
    with pytest.raises(construction.NotEvaluable, match=r"parameter `server_args` of Base.__init__ has no value"):
        construction.ConstructorReader().build_default(obj, module.Base, "policy_matches", {})


def test_the_index_is_kept_in_the_folder_it_is_given(tmp_path: Path, construction: ModuleType) -> None:
    module = _load(tmp_path, "cached")
    folder = tmp_path / "cache"
    first = construction.ConstructorReader(folder).index(module.Child)
    (written,) = folder.iterdir()
    second = construction.ConstructorReader(folder).index(module.Child)
    assert second == first
    assert construction.ClassIndex.from_json(written.read_text()) == first
    assert construction.ConstructorReader().index(module.Child) == first  # no folder: read again, same answer


def test_two_readers_share_no_state(tmp_path: Path, construction: ModuleType) -> None:
    """What a reader learned lives in the reader: a new one reads the class's source afresh."""
    module = _load(tmp_path, "separate")
    one = construction.ConstructorReader()
    one.index(module.Base)
    path = Path(module.__file__)
    path.write_text(path.read_text().replace("self.shared = 1", "self.shared = 7"))
    assert construction.ConstructorReader().lookup(module.Base, "shared").assignments[0].text == "7"
    assert one.lookup(module.Base, "shared").assignments[0].text == "1"


def test_the_reader_never_evaluates_source_text_and_keeps_no_module_state() -> None:
    tables = {
        "_OUTSIDE",
        "_FORMS",
        "_BUILTINS",
        "_BINARY",
        "_UNARY",
        "_COMPARE",
        "_OUTSIDE_NAMES",
    }  # constant lookup tables
    for name in ("construction.py", "subset.py"):
        tree = ast.parse((HARNESS / name).read_text())
        called = {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
        assert not called & {"eval", "exec", "compile"}, name
        assert not [n for n in ast.walk(tree) if isinstance(n, ast.Global | ast.Nonlocal)], name
        decorators = {
            ast.unparse(d) for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) for d in n.decorator_list
        }
        assert not {d for d in decorators if "cache" in d}, name
        containers = {
            target.id
            for node in tree.body
            if isinstance(node, ast.Assign | ast.AnnAssign)
            and isinstance(node.value, ast.Dict | ast.List | ast.Set | ast.DictComp | ast.Call)
            and not ast.unparse(node.value).startswith(("frozenset(", "re.compile("))
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
            if isinstance(target, ast.Name) and target.id != "__all__"
        }
        assert containers <= tables, (name, containers - tables)
        assert "PYTHONPYCACHEPREFIX" not in (HARNESS / name).read_text()


def test_no_import_cycle_inside_the_harness() -> None:
    """Every ``harness.*`` import, at module level or inside a function, points one way."""
    graph: dict[str, set[str]] = {}
    for path in HARNESS.glob("*.py"):
        imported = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("harness."):
                imported.add(node.module.split(".")[1])
            elif isinstance(node, ast.Import):
                imported |= {a.name.split(".")[1] for a in node.names if a.name.startswith("harness.")}
        graph[path.stem] = imported - {path.stem}
    done: set[str] = set()

    def visit(name: str, trail: tuple[str, ...]) -> None:
        assert name not in trail, " -> ".join((*trail, name))
        if name in done:
            return
        for dep in sorted(graph.get(name, ())):
            visit(dep, (*trail, name))
        done.add(name)

    for name in sorted(graph):
        visit(name, ())
    assert "runtime" in graph["strict"] and "strict" not in graph["runtime"]
