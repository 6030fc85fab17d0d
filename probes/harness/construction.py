"""What a build's own constructor would have set on an object the harness built without it.

Probes build SGLang objects with ``Cls.__new__`` (the constructors want GPUs,
process groups and models), so ``__init__`` never runs. Any attribute the
probe did not give would then silently read as missing -- and SGLang's
``getattr(self, name, default)`` / ``hasattr`` would take a default *the
harness* chose. A fork that keeps its fix state under its own name, or gates
its fix behind its own flag, would be judged by that accident.

:class:`ConstructorReader` answers instead with the build's own code: it reads
the class's construction code (``__init__`` and the ``self.<method>()`` calls
it makes, along the MRO) from the materialised source, finds the assignments
``self.<name> = <expr>`` and evaluates ``<expr>`` with the small evaluator in
:mod:`harness.subset`. Nothing is ``eval``-ed: an expression is read node by node,
and only these are understood:

- literals and displays (``{}``, ``[]``, ``0``, ``None``, ``"x"``, tuples, sets);
- names: ``self``, a local bound exactly once on the path that runs (by a
  plain ``name = <expr>``, read the same way), a parameter (a value the caller
  supplies, such as the published ``server_args``; what the constructor stored
  on the object, ``self.mode = mode``; or its declared default), a module
  global, and a few builtins;
- attribute reads and subscripts of those (``envs.X``, ``get_disagg().policy``);
- calls of the build's own functions and classes, of a handful of standard
  containers and locks (``defaultdict(int)``, ``threading.Lock()``) and of a
  few builtins, with arguments from this subset; never a call whose name
  mentions an engine, a device or CUDA, nor one that starts a thread,
  a process or a socket, nor a method of the object under construction;
- ``and``/``or``/``not``, comparisons, arithmetic and ``a if c else b``;
- around an assignment: ``if``/``else`` whose tests this subset decides, and
  ``with`` blocks (their body runs once).

Anything else makes the read an error naming the construct, never a guess: an
assignment inside a loop, a ``try`` or a ``match``; a test it cannot decide;
two constructor functions assigning different values; a local bound more than
once (or by unpacking, a loop, ``with ... as``) on the path that runs; an
expression outside the subset. The caller (:mod:`harness.strict`) turns that
into a probe error that names it.

The reader holds its state (parsed sources, class indexes) itself; the
caller passes in the values it knows and, if it wants one, the folder where
class indexes are kept between processes.
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import json
import os
import re
import sys
import tempfile
import textwrap
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from harness.subset import Binding, Condition, NotEvaluable, Scope

__all__ = [
    "Assignment",
    "Binding",
    "Condition",
    "ClassIndex",
    "ConstructorReader",
    "Lookup",
    "NoBranchApplies",
    "NotEvaluable",
    "describe",
    "source_line",
]

_INDEX_SCHEMA = 2


class NoBranchApplies(NotEvaluable):
    """Every constructor assignment of the attribute sits in a branch that does not run here."""


@dataclass(frozen=True)
class Assignment:
    """``self.<attribute> = <text>`` (or a plain local ``name = <text>``) inside one construction function."""

    owner: str  # "DecodeTransferQueue.__init__"
    attribute: str
    text: str
    lineno: int
    module: str
    klass: str  # qualified name of the class defining the function
    function: str
    filename: str
    conditions: tuple[Condition, ...] = ()
    outside: str = ""
    """The construct outside the subset that encloses the statement (``a `for` loop (line 12)``), if any."""

    @property
    def scope_key(self) -> str:
        return f"{self.module}:{self.klass}.{self.function}"


@dataclass(frozen=True)
class Lookup:
    """How the build's construction code sets one attribute."""

    attribute: str
    assignments: tuple[Assignment, ...]
    assigned_elsewhere: tuple[str, ...]  # methods outside construction that assign it (lazy state)

    @property
    def constructed(self) -> bool:
        return bool(self.assignments)


@dataclass(frozen=True)
class ClassIndex:
    """Everything the reader needs from one class's source, in a form that can be kept on disk."""

    assignments: dict[str, tuple[Assignment, ...]]
    elsewhere: dict[str, tuple[str, ...]]
    locals: dict[str, dict[str, tuple[Binding, ...]]]  # scope_key -> name -> its bindings
    stored: dict[str, dict[str, str]] = field(default_factory=dict)  # scope_key -> parameter -> attribute

    def to_json(self) -> str:
        return json.dumps(
            {
                "schema": _INDEX_SCHEMA,
                "assignments": {k: [asdict(a) for a in v] for k, v in self.assignments.items()},
                "elsewhere": self.elsewhere,
                "locals": {
                    scope: {n: [asdict(b) for b in bs] for n, bs in names.items()}
                    for scope, names in self.locals.items()
                },
                "stored": self.stored,
            }
        )

    @classmethod
    def from_json(cls, text: str) -> ClassIndex:
        data = json.loads(text)
        if data.get("schema") != _INDEX_SCHEMA:
            raise ValueError("another index schema")

        def conditions(raw: list[dict[str, Any]]) -> tuple[Condition, ...]:
            return tuple(Condition(str(c["test"]), bool(c["branch"]), int(c["lineno"])) for c in raw)

        def assignment(raw: dict[str, Any]) -> Assignment:
            return Assignment(**(raw | {"conditions": conditions(raw["conditions"])}))

        def binding(raw: dict[str, Any]) -> Binding:
            return Binding(**(raw | {"conditions": conditions(raw["conditions"])}))

        return cls(
            {k: tuple(assignment(a) for a in v) for k, v in data["assignments"].items()},
            {k: tuple(v) for k, v in data["elsewhere"].items()},
            {s: {n: tuple(binding(b) for b in bs) for n, bs in names.items()} for s, names in data["locals"].items()},
            {s: dict(v) for s, v in data["stored"].items()},
        )


# --- reading the class's source ---------------------------------------------------------
def _source_file(klass: type) -> str | None:
    filename = getattr(sys.modules.get(klass.__module__), "__file__", None)
    return filename if filename and filename.endswith(".py") else None


def _own_nodes(fn: ast.AST) -> Iterator[ast.AST]:
    """Every node of ``fn``'s body, not descending into nested functions, lambdas, classes or comprehensions."""
    stack = list(getattr(fn, "body", []))
    nested = ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef | ast.comprehension
    while stack:
        node = stack.pop()
        yield node
        stack.extend(child for child in ast.iter_child_nodes(node) if not isinstance(child, nested))


def _self_attribute(target: ast.AST) -> str | None:
    if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
        return target.attr
    return None


@dataclass(frozen=True)
class _Method:
    klass: type
    node: ast.FunctionDef | ast.AsyncFunctionDef
    filename: str


def _self_calls(fn: ast.AST) -> set[str]:
    """Methods ``fn`` calls on ``self`` (and on ``super()``, which runs the base's version)."""
    calls = set()
    for node in _own_nodes(fn):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = _self_attribute(func)
        if name is not None:
            calls.add(name)
        elif isinstance(func, ast.Attribute) and isinstance(func.value, ast.Call):
            inner = func.value.func
            if isinstance(inner, ast.Name) and inner.id == "super":
                calls.add(func.attr)
    return calls


def _construction(methods: dict[str, list[_Method]]) -> list[_Method]:
    """The functions that run while the object is constructed: ``__init__`` and what it calls on ``self``."""
    seen: list[_Method] = []
    pending = ["__init__"]
    visited: set[str] = set()
    while pending:
        name = pending.pop(0)
        if name in visited:
            continue
        visited.add(name)
        for method in methods.get(name, []):  # every definition along the MRO: __init__ chains to the base's
            seen.append(method)
            pending.extend(sorted(_self_calls(method.node) - visited))
    return seen


@dataclass(frozen=True)
class _Place:
    """Where a statement sits in its function: the ``if`` tests leading to it, and an enclosing construct."""

    conditions: tuple[Condition, ...] = ()
    outside: str = ""

    def branch(self, stmt: ast.If, taken: bool) -> _Place:
        return _Place((*self.conditions, Condition(ast.unparse(stmt.test), taken, stmt.lineno)), self.outside)

    def inside(self, what: str, stmt: ast.stmt) -> _Place:
        return self if self.outside else _Place(self.conditions, f"{what} (line {stmt.lineno})")


_OUTSIDE: dict[type, str] = {
    ast.For: "a `for` loop",
    ast.AsyncFor: "an `async for` loop",
    ast.While: "a `while` loop",
    ast.Try: "a `try`",
    ast.TryStar: "a `try`",
    ast.Match: "a `match`",
}


def _statements(body: list[ast.stmt], place: _Place) -> Iterator[tuple[ast.stmt, _Place]]:
    """Every statement of ``body`` (nested blocks too, not nested functions), with its place."""
    for stmt in body:
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            continue
        yield stmt, place
        if isinstance(stmt, ast.If):
            yield from _statements(stmt.body, place.branch(stmt, True))
            yield from _statements(stmt.orelse, place.branch(stmt, False))
        elif isinstance(stmt, ast.With | ast.AsyncWith):
            yield from _statements(stmt.body, place)
        elif type(stmt) in _OUTSIDE:
            inner = place.inside(_OUTSIDE[type(stmt)], stmt)
            for block in _blocks(stmt):
                yield from _statements(block, inner)


def _blocks(stmt: ast.stmt) -> Iterator[list[ast.stmt]]:
    for name in ("body", "orelse", "finalbody"):
        yield getattr(stmt, name, [])
    for handler in getattr(stmt, "handlers", []):
        yield handler.body
    for case in getattr(stmt, "cases", []):
        yield case.body


def _targets(stmt: ast.stmt) -> list[ast.expr]:
    if isinstance(stmt, ast.Assign):
        return stmt.targets
    if isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
        return [stmt.target]
    return []


_FORMS: dict[type, str] = {
    ast.AugAssign: "an augmented assignment",
    ast.For: "a `for` target",
    ast.AsyncFor: "a `for` target",
    ast.With: "`with ... as`",
    ast.AsyncWith: "`with ... as`",
}


def _stored_names(nodes: list[ast.AST]) -> Iterator[str]:
    for node in nodes:
        for name in ast.walk(node):
            if isinstance(name, ast.Name) and isinstance(name.ctx, ast.Store):
                yield name.id


def _bound_by_form(stmt: ast.stmt) -> list[ast.AST]:
    """The targets an augmented assignment, a ``for`` or a ``with ... as`` binds."""
    if isinstance(stmt, ast.With | ast.AsyncWith):
        return [i.optional_vars for i in stmt.items if i.optional_vars is not None]
    return [stmt.target] if isinstance(stmt, ast.AugAssign | ast.For | ast.AsyncFor) else []


def _name_bindings(stmt: ast.stmt) -> Iterator[tuple[str, str, str]]:
    """(name, value text, form) for every local name ``stmt`` itself binds (a plain assignment has a text)."""
    for target in _targets(stmt):
        if isinstance(target, ast.Name):
            yield target.id, ast.unparse(stmt.value), "assignment"  # type: ignore[attr-defined]
        else:
            yield from ((name, "", "unpacking") for name in _stored_names([target]))
    form = _FORMS.get(type(stmt))
    if form is not None:
        yield from ((name, "", form) for name in _stored_names(_bound_by_form(stmt)))
    if isinstance(stmt, ast.Import | ast.ImportFrom):
        for alias in stmt.names:
            yield (alias.asname or alias.name).split(".")[0], "", "an import"


def _walrus_names(stmt: ast.stmt) -> Iterator[str]:
    """Names bound by ``:=`` in the expressions of ``stmt`` itself (not of the blocks it holds)."""
    for child in ast.iter_child_nodes(stmt):
        if isinstance(child, ast.expr):
            for node in ast.walk(child):
                if isinstance(node, ast.NamedExpr):
                    yield node.target.id


def _function_locals(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> dict[str, tuple[Binding, ...]]:
    """Every binding of every local name in ``fn``: its parameters first, then each statement's."""
    found: dict[str, list[Binding]] = {}
    args = fn.args
    for arg in (*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg):
        if arg is not None and arg.arg != "self":
            found.setdefault(arg.arg, []).append(Binding(fn.lineno, "", "parameter"))
    for stmt, place in _statements(fn.body, _Place()):
        pairs = [*_name_bindings(stmt), *((n, "", "`:=`") for n in _walrus_names(stmt))]
        if isinstance(stmt, ast.Try | ast.TryStar):
            pairs += [(h.name, "", "`except ... as`") for h in stmt.handlers if h.name]
        for name, text, form in pairs:
            found.setdefault(name, []).append(Binding(stmt.lineno, text, form, place.conditions, place.outside))
    return {name: tuple(bindings) for name, bindings in found.items()}


def _method_assignments(method: _Method) -> Iterator[Assignment]:
    klass, node = method.klass, method.node
    for stmt, place in _statements(node.body, _Place()):
        for target in _targets(stmt):
            attribute = _self_attribute(target)
            if attribute is None:
                continue
            value: ast.expr = stmt.value  # type: ignore[attr-defined]
            yield Assignment(
                owner=f"{klass.__name__}.{node.name}",
                attribute=attribute,
                text=ast.unparse(value),
                lineno=value.lineno,
                module=klass.__module__,
                klass=klass.__qualname__,
                function=node.name,
                filename=method.filename,
                conditions=place.conditions,
                outside=place.outside,
            )


def _assigned_anywhere(fn: ast.AST) -> set[str]:
    names: set[str] = set()
    for node in _own_nodes(fn):
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign | ast.AugAssign):
            targets = [node.target]
        else:
            continue
        names.update(a for a in map(_self_attribute, targets) if a is not None)
    return names


def _stored_parameters(assignments: Iterator[Assignment], parameters: set[str]) -> dict[str, str]:
    """Parameters the function keeps on the object unconditionally (``self.mode = mode``): parameter -> attribute."""
    stored: dict[str, str] = {}
    for a in assignments:
        if a.text in parameters and not a.conditions and not a.outside:
            stored.setdefault(a.text, a.attribute)
    return stored


# --- the reader ---------------------------------------------------------------------------
class ConstructorReader:
    """Reads classes' construction code and evaluates what it assigns; one per process is enough.

    ``cache_folder``: where class indexes are kept between processes (keyed by the
    source files' contents), or None to read the source again in every process.
    """

    def __init__(self, cache_folder: Path | None = None) -> None:
        self.cache_folder = cache_folder
        self._trees: dict[str, ast.Module | None] = {}
        self._indexes: dict[type, ClassIndex] = {}
        self._shadowed: dict[type, dict[str, Any]] = {}

    # -- the index of one class
    def _module_tree(self, filename: str) -> ast.Module | None:
        if filename not in self._trees:
            try:
                self._trees[filename] = ast.parse(Path(filename).read_text(encoding="utf-8"), filename=filename)
            except (OSError, SyntaxError, ValueError):
                self._trees[filename] = None
        return self._trees[filename]

    def _class_node(self, klass: type) -> ast.ClassDef | None:
        filename = _source_file(klass)
        tree = self._module_tree(filename) if filename else None
        body: list[ast.stmt] = tree.body if tree is not None else []
        node: ast.ClassDef | None = None
        for part in klass.__qualname__.split("."):
            node = next((n for n in body if isinstance(n, ast.ClassDef) and n.name == part), None)
            if node is None:
                return None
            body = node.body
        return node

    def _methods(self, cls: type) -> dict[str, list[_Method]]:
        """Every method defined in the source of ``cls`` and its bases, by name, in MRO order."""
        out: dict[str, list[_Method]] = {}
        for klass in cls.__mro__:
            node = None if klass is object else self._class_node(klass)
            for item in node.body if node is not None else ():
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                    out.setdefault(item.name, []).append(_Method(klass, item, _source_file(klass) or ""))
        return out

    def _build_index(self, cls: type) -> ClassIndex:
        """One pass over the class's source: constructor assignments, locals, other methods assigning each name."""
        methods = self._methods(cls)
        construction = _construction(methods)
        constructed = {id(m.node) for m in construction}
        assignments: dict[str, list[Assignment]] = {}
        scopes: dict[str, dict[str, tuple[Binding, ...]]] = {}
        stored: dict[str, dict[str, str]] = {}
        for method in construction:
            found = list(_method_assignments(method))
            for a in found:
                assignments.setdefault(a.attribute, []).append(a)
            scope = f"{method.klass.__module__}:{method.klass.__qualname__}.{method.node.name}"
            scopes[scope] = _function_locals(method.node)
            parameters = {n for n, b in scopes[scope].items() if b[0].form == "parameter"}
            stored[scope] = _stored_parameters(iter(found), parameters)
        elsewhere: dict[str, list[str]] = {}
        for name, defs in methods.items():
            for method in defs:
                if id(method.node) not in constructed:
                    for attribute in _assigned_anywhere(method.node):
                        elsewhere.setdefault(attribute, []).append(f"{method.klass.__name__}.{name}")
        return ClassIndex(
            {k: tuple(v) for k, v in assignments.items()},
            {k: tuple(dict.fromkeys(v)) for k, v in elsewhere.items()},
            scopes,
            stored,
        )

    def _index_path(self, cls: type) -> Path | None:
        if self.cache_folder is None:
            return None
        digest = hashlib.sha256(f"{_INDEX_SCHEMA}:{cls.__module__}:{cls.__qualname__}".encode())
        for klass in cls.__mro__:
            filename = None if klass is object else _source_file(klass)
            if filename is None:
                continue
            try:
                digest.update(filename.encode() + b"\0" + hashlib.sha256(Path(filename).read_bytes()).digest())
            except OSError:
                return None
        return self.cache_folder / f"{digest.hexdigest()}.json"

    def index(self, cls: type) -> ClassIndex:
        """The construction index of ``cls``, from the cache folder when its source files are unchanged."""
        if cls in self._indexes:
            return self._indexes[cls]
        path = self._index_path(cls)
        index = None
        if path is not None:
            try:
                index = ClassIndex.from_json(path.read_text(encoding="utf-8"))
            except (OSError, ValueError, KeyError, TypeError):
                index = None
        if index is None:
            index = self._build_index(cls)
            if path is not None:
                _write_quietly(path, index.to_json())
        self._indexes[cls] = index
        return index

    # -- answers
    def lookup(self, cls: type, attribute: str) -> Lookup:
        """How the construction code of ``cls`` (from the materialised source) sets ``attribute``."""
        index = self.index(cls)
        return Lookup(attribute, index.assignments.get(attribute, ()), index.elsewhere.get(attribute, ()))

    def shadowed_class_values(self, cls: type) -> dict[str, Any]:
        """Plain class-level values that the constructor also assigns (``enable_x: bool = False`` on a base).

        Normal attribute lookup finds these, so an object built without ``__init__``
        would silently read the class value where the build's constructor computes
        another one; the harness answers them like missing attributes instead.
        """
        if cls not in self._shadowed:
            out: dict[str, Any] = {}
            names = self.index(cls).assignments
            for klass in reversed(cls.__mro__):
                for name, value in vars(klass).items():
                    if name in names and not name.startswith("__"):
                        if callable(value) or hasattr(value, "__get__"):
                            out.pop(name, None)  # a method or descriptor: not a plain default
                        else:
                            out[name] = value
            self._shadowed[cls] = out
        return dict(self._shadowed[cls])

    def build_default(self, obj: Any, cls: type, attribute: str, known: Mapping[str, Any]) -> tuple[Any, Assignment]:
        """The value this build's constructor gives ``attribute`` on ``obj``, and where it comes from.

        ``known``: parameter values the caller supplies (the published ``server_args``).
        Only assignments whose enclosing ``if`` tests hold here count; raises
        :class:`NotEvaluable` naming what it cannot read, :class:`NoBranchApplies`
        when no assignment runs here.
        """
        index = self.index(cls)
        found = index.assignments.get(attribute, ())
        if not found:
            raise NotEvaluable(f"the constructor of {cls.__name__} does not set {attribute!r}")
        applicable = [(a, scope) for a in found if (scope := self._taken(obj, index, a, known)) is not None]
        if not applicable:
            raise NoBranchApplies(f"no branch of the constructor of {cls.__name__} that runs here sets {attribute!r}")
        results: list[tuple[Any, Assignment]] = []
        for assignment, scope in applicable:
            try:
                results.append((scope.evaluate(assignment.text, assignment.lineno), assignment))
            except NotEvaluable as exc:
                raise NotEvaluable(f"{assignment.owner}: {exc}") from None
        last_value, last = results[-1]
        differing = any(not _equal(last_value, value) for value, _ in results[:-1])
        if differing and len({a.scope_key for _, a in results}) > 1:
            places = ", ".join(f"{a.owner}: `{a.text}`" for _, a in results)
            raise NotEvaluable(f"set to different values in several constructor functions ({places})")
        return last_value, last  # within one straight-line function the last assignment that runs wins

    def _taken(self, obj: Any, index: ClassIndex, assignment: Assignment, known: Mapping[str, Any]) -> Scope | None:
        """The scope to evaluate ``assignment`` in, or None where one of its ``if`` tests does not hold here."""
        function = _function_object(assignment)
        scope = Scope(
            obj=obj,
            where=assignment.owner,
            function=function,
            parameters=_parameters(function, known),
            locals=index.locals.get(assignment.scope_key, {}),
            stored=index.stored.get(assignment.scope_key, {}),
            build_package=assignment.module.split(".")[0],
        )
        try:
            holds = scope.conditions_hold(assignment.conditions)
        except NotEvaluable as exc:
            raise NotEvaluable(
                f"{assignment.owner} sets it as `{assignment.text}` only under a condition the harness cannot "
                f"decide: {exc}"
            ) from None
        if holds and assignment.outside:
            raise NotEvaluable(
                f"{assignment.owner} sets it as `{assignment.text}` inside {assignment.outside}, "
                "which the harness does not read"
            )
        return scope if holds else None


def _write_quietly(path: Path, text: str) -> None:
    """Best effort: a read-only cache (the Docker back end) just means reading the source again."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".part")
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except OSError:
        pass


def _function_object(assignment: Assignment) -> Any:
    owner: Any = sys.modules.get(assignment.module)
    for part in assignment.klass.split("."):
        owner = getattr(owner, part, None)
    fn = vars(owner).get(assignment.function) if owner is not None else None
    fn = getattr(fn, "__func__", fn)
    return inspect.unwrap(fn) if callable(fn) else None


def _parameters(fn: Any, known: Mapping[str, Any]) -> dict[str, Any]:
    """The function's parameters with a value here: supplied by the caller, else the declared default."""
    try:
        signature = inspect.signature(fn) if fn is not None else None
    except (TypeError, ValueError):
        signature = None
    out: dict[str, Any] = {}
    for name, param in signature.parameters.items() if signature is not None else ():
        if name == "self":
            continue
        if name in known:
            out[name] = known[name]
        elif param.default is not inspect.Parameter.empty:
            out[name] = param.default
    return out


def _equal(a: Any, b: Any) -> bool:
    try:
        return bool(a == b) and type(a) is type(b)
    except Exception:
        return False


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def describe(value: Any) -> str:
    """A short, stable text for a value (object addresses dropped, so observations repeat exactly)."""
    text = _ADDRESS.sub("", repr(value))
    return text if len(text) <= 80 else text[:77] + "..."


def source_line(assignment: Assignment) -> str:
    return textwrap.shorten(f"{assignment.owner}: self.{assignment.attribute} = {assignment.text}", 200)
