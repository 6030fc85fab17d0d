"""The constructor reader on constructors shaped like a fork's KV manager, one rule per test.

The classes live in a small package written to disk (``forkpkg``: a helpers module, a base module and
the manager module), the way a build splits a back end over several files: helpers the manager calls
from another module of the build, a base class from another file, nested classes, a builtin base,
``super()`` calls to the base's helpers, chained locals, and each construct the reader must refuse
(a ``match``, a ``for ... else``, ``except ... as``, ``:=``, unpacking, imports, ``with ... as``).
Each test asserts the value the build's own code gives, or the exact construct an error names.
"""

from __future__ import annotations

import importlib
import json
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

from difflab.paths import shipped_probes

PROBES = shipped_probes()  # under mutation, the mutated copy beside the copied package

HELPERS = '''
import collections

PRIORITIES = ("low", "mid", "high")
TABLE = {"mooncake": 1, "nixl": 2}


def make_pool(size=2, fill="slot"):
    return [fill] * size


def sizes():
    return [1, 2]


class Strict:
    """A value that refuses to be compared (as a tensor does)."""

    def __eq__(self, other):
        raise TypeError("ambiguous comparison")

    __hash__ = object.__hash__


class TransferEngine:
    def __init__(self):
        raise AssertionError("the reader must never build a transfer engine")
'''

BASE = """
from forkpkg.helpers import make_pool


class TransferBase:
    def __init__(self, server_args):
        self.capacity = 4
        self.conflict = True
        self.three = 1
        self.order = "base"

    def _init_pools(self):
        self.pools = make_pool(3)
"""

MANAGER = """
import collections
import os

from forkpkg import helpers
from forkpkg.base_mod import TransferBase
from forkpkg.helpers import PRIORITIES, TABLE, Strict, make_pool


class KVManager(TransferBase):
    enable_metrics = False
    retired = "class value"
    plain_only = 5
    pool_factory = list

    def __init__(self, server_args, count, size=2):
        super().__init__(server_args)
        super()._init_pools()
        self.enable_metrics = server_args.enable_metrics
        self.retired = None
        self.pool_factory = make_pool
        self.capacity = 4
        self.conflict = 1
        self.three = 2
        self._setup_a()
        self._setup_b()
        self.marker = Strict()
        count_alias = self.count_copy = 0
        self.chained = count_alias
        if server_args.limit:
            self.count = count
        self.slots = count * 2
        first = 1
        second = 2
        self.total = first + second
        base = 4
        doubled = base * 2
        self.doubled = doubled
        width = 8 if server_args.limit else 16
        if width > 4:
            self.wide = True
        self.picked = server_args.opaque_mode or "default"
        self.kept = server_args.backend or "none"
        self.gated = server_args.backend and server_args.limit
        self.first_true = "first" or "second"
        self.second_of_and = 1 and "second"
        self.sizes = [1, 2]
        self.kinds = {"a", "b"}
        self.table = {"mooncake": 1, "nixl": 2}
        self.pair = (1, "a")
        self.negative = -1
        self.inverted = not server_args.limit
        self.upper = PRIORITIES[1:]
        self.every_other = PRIORITIES[::2]
        self.code = TABLE["nixl"]
        self.in_range = 1 < 2 < 3
        self.out_of_range = 1 < 3 < 2
        self.pool = make_pool(size=3, fill="page")
        self.bits = helpers.sizes().__len__()
        self.ready: bool = False
        self.declared: int
        self.ratio = 10 // server_args.limit
        self.shifted = 1 << 20
        self.star_args = make_pool(*helpers.sizes())
        self.star_kwargs = make_pool(**TABLE)
        self.spread = {**TABLE}
        self.engine = helpers.TransferEngine()
        self.unknown = undefined_name
        with self.lock_for():
            self.inside_with = 3

        def on_done():
            self.in_callback = 1

        self.after_nested_def = 1
        if (n := len(PRIORITIES)) > 0:
            pass
        self.walrus = n
        a, b = 1, 2
        self.unpacked = a
        import os.path
        self.imported = os.sep
        from collections import OrderedDict as Ordered
        self.aliased = Ordered()
        with open(os.devnull) as handle:
            pass
        self.handle = handle
        try:
            pass
        except ValueError as err:
            self.recovered = 0
        finally:
            self.finished = 1
        self.last_error = err
        for i in range(2):
            looped = i
        else:
            self.after_loop = 1
        self.looped = looped
        match server_args.backend:
            case "mooncake":
                self.matched = 1
        try:
            for j in range(2):
                self.nested = j
        except Exception:
            pass
        for k in range(2):
            if server_args.backend:
                self.in_loop_branch = 1
        if server_args.backend:
            count = count - 1
        self.reassigned = count
        if server_args.limit:
            late_local = 1
        self.maybe = late_local
        if undefined_flag:
            odd = 1
        self.odd = odd

    def lock_for(self):
        return open(os.devnull)

    def _setup_a(self):
        self._common()

    def _setup_b(self):
        self._common()
        self._zlate()

    def _common(self):
        self.common = 1

    def _zlate(self):
        self.late = 2

    def reset(self):
        note = 1
        self.retired += 1
        self.flag: bool = True
        print(note)
        self.reset_value = 2


class Outer:
    class Inner:
        def __init__(self):
            self.nested_value = 7


class Registry(dict):
    def __init__(self):
        super().__init__()
        self.update({"kind": 1})
        self.kind = "registry"


class Keyed(dict, TransferBase):
    pass


Dynamic = type("Dynamic", (TransferBase,), {})


class Tagged(KVManager):
    retired = property(lambda self: "descriptor")
    descriptor_only = property(lambda self: 1)

    def __init__(self, server_args, count):
        super().__init__(server_args, count)
        self.three = 1
        self.descriptor_only = 2


class _Hidden:
    def __init__(self):
        self.hidden = 1


Exposed = _Hidden
del _Hidden
"""


def chain_module(links: int, where: str) -> str:
    """A constructor whose value goes through ``links`` locals, each read from the one before it.

    ``where``: "value" (the attribute reads the last local), "local" (a local bound under an ``if`` on the
    last one), "attribute" (the attribute assigned under that ``if``).
    """
    lines = ["class Chain:", "    def __init__(self):", "        c0 = 1"]
    lines += [f"        c{i} = c{i - 1}" for i in range(1, links + 1)]
    lines += {
        "value": [f"        self.value = c{links}"],
        "local": [f"        if c{links}:", "            value = 5", "        self.value = value"],
        "attribute": [f"        if c{links}:", "            self.value = 5"],
    }[where]
    return "\n".join(lines) + "\n"


@pytest.fixture
def package(tmp_path: Path) -> Iterator[Path]:
    """Writes ``forkpkg`` under ``tmp_path`` and imports it fresh; removes it from sys.modules after."""
    root = tmp_path / "forkpkg"
    root.mkdir()
    (root / "__init__.py").write_text("")
    for name, text in {"helpers": HELPERS, "base_mod": BASE, "manager": MANAGER}.items():
        (root / f"{name}.py").write_text(textwrap.dedent(text))
    sys.path.insert(0, str(tmp_path))
    try:
        yield root
    finally:
        sys.path.remove(str(tmp_path))
        for name in [n for n in sys.modules if n == "forkpkg" or n.startswith("forkpkg.")]:
            del sys.modules[name]


@pytest.fixture
def construction() -> Iterator[ModuleType]:
    sys.path.insert(0, str(PROBES))
    try:
        import harness.construction as construction

        yield construction
    finally:
        sys.path.remove(str(PROBES))


@pytest.fixture
def manager(package: Path) -> ModuleType:
    return importlib.import_module("forkpkg.manager")


ARGS = SimpleNamespace(enable_metrics=True, limit=0, opaque_mode=None, backend="mooncake")


def read(construction: ModuleType, cls: type, attribute: str, server_args: Any = ARGS, **state: Any) -> Any:
    obj = cls.__new__(cls)  # as the probes build SGLang's objects: no constructor runs
    vars(obj).update(state)
    value, _ = construction.ConstructorReader().build_default(obj, cls, attribute, {"server_args": server_args})
    return value


def refused(construction: ModuleType, cls: type, attribute: str, **state: Any) -> str:
    with pytest.raises(construction.NotEvaluable) as caught:
        read(construction, cls, attribute, **state)
    return str(caught.value)


# --- what the constructor computes ------------------------------------------------------------------
@pytest.mark.parametrize(
    ("attribute", "expected"),
    [
        ("enable_metrics", True),  # the published server_args, not the class value
        ("total", 3),  # two locals, each its own value
        ("doubled", 8),  # a local read from a local
        ("picked", "default"),
        ("kept", "mooncake"),
        ("gated", 0),
        ("first_true", "first"),
        ("second_of_and", "second"),
        ("sizes", [1, 2]),
        ("kinds", {"a", "b"}),
        ("table", {"mooncake": 1, "nixl": 2}),
        ("pair", (1, "a")),
        ("negative", -1),
        ("inverted", True),
        ("upper", ("mid", "high")),
        ("every_other", ("low", "high")),
        ("code", 2),
        ("in_range", True),
        ("out_of_range", False),
        ("pool", ["page", "page", "page"]),  # keyword arguments reach the build's function
        ("ready", False),  # an annotated assignment
        ("inside_with", 3),  # the body of a `with` runs once
        ("after_nested_def", 1),  # a nested function is skipped, not the end of the constructor
        ("common", 1),  # a helper two construction helpers call
        ("late", 2),  # ... and one called after that shared helper
        ("pools", ["slot", "slot", "slot"]),  # the base's helper, called through super()
        ("chained", 0),  # a chained assignment: the attribute and the local
        ("count_copy", 0),
        ("capacity", 4),  # the same value in the base's constructor and here: fine
        ("wide", True),  # an `if` whose test reads a local
    ],
)
def test_the_constructor_s_value_is_read(
    construction: ModuleType, manager: ModuleType, attribute: str, expected: Any
) -> None:
    value = read(construction, manager.KVManager, attribute)
    assert value == expected and type(value) is type(expected)


def test_classes_the_module_nests_builds_on_builtins_or_makes_at_run_time_are_read(
    construction: ModuleType, manager: ModuleType
) -> None:
    assert read(construction, manager.Outer.Inner, "nested_value") == 7
    assert read(construction, manager.Registry, "kind") == "registry"  # dict's own methods have no source here
    assert read(construction, manager.Keyed, "capacity") == 4
    assert read(construction, manager.Dynamic, "capacity") == 4  # no class statement: the base's constructor


def test_a_stored_parameter_counts_only_when_kept_unconditionally(
    construction: ModuleType, manager: ModuleType
) -> None:
    """``self.count = count`` under an ``if`` says nothing about the argument on the path that runs."""
    message = refused(construction, manager.KVManager, "slots", count=3)
    assert "parameter `count` of KVManager.__init__ has no value here" in message


def test_the_build_s_own_functions_are_those_of_its_top_level_package(
    construction: ModuleType, manager: ModuleType
) -> None:
    """``make_pool`` lives in forkpkg.helpers, the constructor in forkpkg.manager: both are the build's."""
    assert read(construction, manager.KVManager, "pool") == ["page"] * 3


# --- what it refuses, named -------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("attribute", "named"),
    [
        ("ratio", "`10 // server_args.limit` failed here: ZeroDivisionError: integer division or modulo by zero"),
        ("shifted", "`1 << 20` uses an operator outside what the harness reads"),
        ("star_args", "`make_pool(*helpers.sizes())` unpacks its arguments, outside what the harness reads"),
        ("star_kwargs", "`make_pool(**TABLE)` unpacks its arguments, outside what the harness reads"),
        ("spread", "`{**TABLE}` unpacks a mapping, outside what the harness reads"),
        ("engine", "`helpers.TransferEngine()` calls TransferEngine(), which the harness never runs"),
        ("unknown", "`undefined_name` is neither a local of KVManager.__init__, a module global nor a builtin"),
        ("walrus", "local `n` of KVManager.__init__ is bound by `:=` (line "),
        ("unpacked", "local `a` of KVManager.__init__ is bound by unpacking (line "),
        ("imported", "local `os` of KVManager.__init__ is bound by an import (line "),
        ("aliased", "local `Ordered` of KVManager.__init__ is bound by an import (line "),
        ("handle", "local `handle` of KVManager.__init__ is bound by `with ... as` (line "),
        ("last_error", "local `err` of KVManager.__init__ is bound by `except ... as` (line "),
        ("looped", "local `looped` of KVManager.__init__ is bound inside a `for` loop (line "),
        ("reassigned", "parameter `count` of KVManager.__init__ is reassigned (line "),
        ("recovered", "sets it as `0` inside a `try` (line "),
        ("finished", "sets it as `1` inside a `try` (line "),
        ("after_loop", "sets it as `1` inside a `for` loop (line "),
        ("matched", "sets it as `1` inside a `match` (line "),
        ("nested", "sets it as `j` inside a `try` (line "),  # the outermost construct is named
        ("in_loop_branch", "sets it as `1` inside a `for` loop (line "),  # an `if` inside a loop is still in it
        ("never_set", "the constructor of KVManager does not set 'never_set'"),
        ("bits", "`helpers.sizes().__len__()` is neither the build's own code nor a call the harness knows"),
        ("maybe", "local `late_local` of KVManager.__init__ is not bound before line "),
        ("odd", "local `odd` of KVManager.__init__ is bound under a condition: `if undefined_flag` (line "),
    ],
)
def test_a_construct_the_reader_does_not_read_is_named(
    construction: ModuleType, manager: ModuleType, attribute: str, named: str
) -> None:
    message = refused(construction, manager.KVManager, attribute, count=3)
    assert named in message, message
    if "inside a" in named and "local" not in named:
        assert message.endswith(", which the harness does not read"), message


def test_the_line_an_error_names_is_the_construct_s_own(construction: ModuleType, manager: ModuleType) -> None:
    source = Path(manager.__file__).read_text().splitlines()
    message = refused(construction, manager.KVManager, "reassigned", count=3)
    line = int(message.rsplit("(line ", 1)[1].rstrip(")"))
    assert source[line - 1].strip() == "count = count - 1"
    message = refused(construction, manager.KVManager, "maybe")
    line = int(message.split("before line ", 1)[1].split()[0])
    assert source[line - 1].strip() == "self.maybe = late_local"
    message = refused(construction, manager.KVManager, "nested")
    line = int(message.split("(line ", 1)[1].split(")")[0])
    assert source[line - 1].strip() == "try:"


@pytest.mark.parametrize(
    ("cls", "attribute", "places"),
    [
        ("KVManager", "conflict", "KVManager.__init__: `1`, TransferBase.__init__: `True`"),
        ("Tagged", "three", "Tagged.__init__: `1`, KVManager.__init__: `2`, TransferBase.__init__: `1`"),
    ],
)
def test_values_that_differ_across_constructor_functions_are_refused(
    construction: ModuleType, manager: ModuleType, cls: str, attribute: str, places: str
) -> None:
    """``True`` and ``1`` are equal in Python but not the same default; the first and last agreeing is not enough."""
    message = refused(construction, getattr(manager, cls), attribute)
    assert message == f"set to different values in several constructor functions ({places})"


def test_a_value_that_refuses_comparison_is_not_taken_as_equal(construction: ModuleType, package: Path) -> None:
    (package / "strict_mod.py").write_text(
        textwrap.dedent(
            """
            from forkpkg.helpers import Strict


            class Base:
                def __init__(self):
                    self.marker = Strict()


            class Child(Base):
                def __init__(self):
                    super().__init__()
                    self.marker = Strict()
            """
        )
    )
    module = importlib.import_module("forkpkg.strict_mod")
    assert "different values" in refused(construction, module.Child, "marker")


def test_a_class_the_module_no_longer_names_is_refused_not_guessed(
    construction: ModuleType, manager: ModuleType
) -> None:
    assert refused(construction, manager.Exposed, "hidden").endswith(": _Hidden.__init__ is not a plain function")


def test_a_source_that_no_longer_parses_sets_nothing(construction: ModuleType, manager: ModuleType) -> None:
    Path(manager.__file__).write_text("class KVManager(:\n")
    assert refused(construction, manager.KVManager, "total") == "the constructor of KVManager does not set 'total'"
    assert read(construction, manager.KVManager, "capacity") == 4  # the base's file still reads


@pytest.mark.parametrize(("where", "most"), [("value", 7), ("attribute", 7), ("local", 6)])
def test_a_value_may_go_through_a_bounded_chain_of_locals(
    construction: ModuleType, package: Path, where: str, most: int
) -> None:
    """Eight reads deep at most: one local more than that is refused, whichever way the chain is reached."""
    for links in (most, most + 1):
        name = f"chain_{where}_{links}"
        (package / f"{name}.py").write_text(chain_module(links, where))
        cls = importlib.import_module(f"forkpkg.{name}").Chain
        if links == most:
            assert read(construction, cls, "value") == (1 if where == "value" else 5)
        else:
            assert "depends on too many locals" in refused(construction, cls, "value")


# --- what the index records ----------------------------------------------------------------------------
def test_the_lookup_names_where_an_attribute_is_set(construction: ModuleType, manager: ModuleType) -> None:
    reader = construction.ConstructorReader()
    found = reader.lookup(manager.KVManager, "retired")
    assert found.attribute == "retired" and found.constructed
    assert [a.owner for a in found.assignments] == ["KVManager.__init__"]
    assert found.assignments[0].filename == manager.__file__
    assert found.assigned_elsewhere == ("KVManager.reset",)  # an augmented assignment, after other statements
    assert reader.lookup(manager.KVManager, "flag").assigned_elsewhere == ("KVManager.reset",)
    assert reader.lookup(manager.KVManager, "reset_value").assigned_elsewhere == ("KVManager.reset",)
    assert reader.lookup(manager.KVManager, "capacity").assigned_elsewhere == ()
    missing = reader.lookup(manager.KVManager, "never_set")
    assert missing.assignments == () and missing.assigned_elsewhere == () and not missing.constructed
    assert reader.lookup(manager.KVManager, "declared").assignments == ()  # a bare annotation assigns nothing
    assert reader.lookup(manager.KVManager, "in_callback").assignments == ()


def test_class_values_the_constructor_replaces_are_reported(construction: ModuleType, manager: ModuleType) -> None:
    reader = construction.ConstructorReader()
    # `pool_factory = list` is callable: a class-level factory, not a plain default
    assert reader.shadowed_class_values(manager.KVManager) == {"enable_metrics": False, "retired": "class value"}
    assert reader.shadowed_class_values(manager.Tagged) == {"enable_metrics": False}  # a property is no default
    copy = reader.shadowed_class_values(manager.KVManager)
    copy.clear()
    assert reader.shadowed_class_values(manager.KVManager)  # the reader's own answer is not the caller's


def test_an_index_schema_from_another_version_is_refused(construction: ModuleType) -> None:
    with pytest.raises(ValueError, match="^another index schema$"):
        construction.ClassIndex.from_json(json.dumps({"schema": -1}))


# --- the index cache -----------------------------------------------------------------------------------
def test_the_cache_keeps_one_index_per_class_in_a_folder_it_creates(
    construction: ModuleType, manager: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Written beside the index it becomes (so the rename is atomic), even where the temporary folder is gone."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "no-temporary-folder"))
    folder = tmp_path / "deep" / "cache"
    reader = construction.ConstructorReader(folder)
    indexes = [reader.index(manager.KVManager), reader.index(manager.Registry)]
    kept = [construction.ClassIndex.from_json(p.read_text()) for p in sorted(folder.iterdir())]
    assert len(kept) == 2 and all(index in kept for index in indexes)
    assert {p.suffix for p in folder.iterdir()} == {".json"}
    first = indexes[0]
    assert construction.ClassIndex.from_json(first.to_json()) == first  # lazily assigned names survive the trip
    assert first.elsewhere["retired"] == ("KVManager.reset",)


def test_the_cache_answers_until_a_source_file_of_the_class_changes(
    construction: ModuleType, manager: ModuleType, package: Path, tmp_path: Path
) -> None:
    folder = tmp_path / "cache"
    construction.ConstructorReader(folder).index(manager.KVManager)
    (kept,) = folder.iterdir()
    construction.ConstructorReader(folder).index(manager.Keyed)  # dict (no source) comes before its other base
    data = json.loads(kept.read_text())
    data["assignments"]["capacity"][0]["text"] = "42"
    kept.write_text(json.dumps(data))
    assert construction.ConstructorReader(folder).lookup(manager.KVManager, "capacity").assignments[0].text == "42"
    base = package / "base_mod.py"  # another file of the class's MRO
    base.write_text(base.read_text().replace("self.capacity = 4", "self.capacity = 5"))
    fresh = construction.ConstructorReader(folder)
    assert [a.text for a in fresh.lookup(manager.KVManager, "capacity").assignments] == ["4", "5"]
    assert [a.text for a in fresh.lookup(manager.Keyed, "capacity").assignments] == ["5"]


class Thing:
    """An object whose repr carries its address."""


def test_describe_and_source_line_are_short_and_stable(construction: ModuleType) -> None:
    assert construction.describe(Thing()).endswith("Thing object>")
    assert " at 0x" not in construction.describe(Thing())
    assert construction.describe("x" * 78) == repr("x" * 78)  # 80 characters: whole
    long = construction.describe("x" * 79)
    assert len(long) == 80 and long == repr("x" * 79)[:77] + "..."
    prefix = "A.__init__: self.value = "  # 25 characters
    over = construction.Assignment("A.__init__", "value", "y" * 176, 1, "m", "A", "__init__", "m.py")
    assert construction.source_line(over) == prefix + "[...]"  # 201 characters: shortened
    fits = construction.Assignment("A.__init__", "value", "y" * 175, 1, "m", "A", "__init__", "m.py")
    assert construction.source_line(fits) == prefix + "y" * 175
