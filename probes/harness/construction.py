"""What a build's own constructor would have set on an object the harness built without it.

Probes build SGLang objects with ``Cls.__new__`` (the constructors want GPUs,
process groups and models), so ``__init__`` never runs. Any attribute the
probe did not give would then silently read as missing -- and SGLang's
``getattr(self, name, default)`` / ``hasattr`` would take a default *the
harness* chose. A fork that keeps its fix state under its own name, or gates
its fix behind its own flag, would be judged by that accident.

This module answers instead with the build's own code: it reads the class's
construction code (``__init__`` and the ``self.<method>()`` calls it makes,
along the MRO) from the materialised source, finds the single assignment
``self.<name> = <expr>`` and evaluates ``<expr>`` in that function's module,
with ``self`` bound to the object, parameters bound to their declared
defaults (``server_args`` to the published real ``ServerArgs``) and earlier
simple local assignments resolved the same way. So an environment flag
(``envs.X.get()``), a ``ServerArgs`` field and a fresh state container come
out exactly as this build would make them.

What it cannot evaluate (a collaborator built from constructor arguments, a
socket, a thread) it refuses by name; the caller turns that into a probe
error rather than a guess.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import inspect
import json
import os
import re
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

# Calls whose evaluation would start work or touch the outside world: never evaluated.
_REFUSED_CALLS = frozenset(
    {"Thread", "Process", "Popen", "start", "socket", "bind", "connect", "Context", "submit", "run", "Timer"}
)
_REFUSED_SUBSTRINGS = ("engine", "cuda", "device")  # matched case-insensitively: TransferEngine(), init_engine()
_MAX_DEPTH = 8
_INDEX_SCHEMA = 1


class NotEvaluable(Exception):  # noqa: N818 - reads as an answer
    """The build sets the attribute, but from something the harness cannot (or must not) evaluate."""


class NoBranchApplies(NotEvaluable):
    """Every constructor assignment of the attribute sits in a branch that does not run here."""


@dataclass(frozen=True)
class Assignment:
    """``self.<attribute> = <text>`` inside one function of the construction code."""

    owner: str  # "DecodeTransferQueue.__init__"
    attribute: str
    text: str
    lineno: int
    module: str
    klass: str  # qualified name of the class defining the function
    function: str
    filename: str
    conditions: tuple[tuple[str, bool], ...] = ()
    """The ``if`` tests around the assignment and the branch it sits in (True: body, False: else)."""
    in_loop: bool = False

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
    """Everything the harness needs from one class's source, in a form that can be cached on disk."""

    assignments: dict[str, tuple[Assignment, ...]]
    elsewhere: dict[str, tuple[str, ...]]
    locals: dict[str, dict[str, tuple[tuple[int, str], ...]]]  # scope_key -> name -> (lineno, text)


# --- reading the class's source ---------------------------------------------------------
def _source_file(klass: type) -> str | None:
    filename = getattr(sys.modules.get(klass.__module__), "__file__", None)
    return filename if filename and filename.endswith(".py") else None


@functools.cache
def _module_tree(filename: str) -> ast.Module | None:
    try:
        with open(filename, encoding="utf-8") as fh:
            return ast.parse(fh.read(), filename=filename)
    except (OSError, SyntaxError, ValueError):
        return None


def _class_node(klass: type) -> ast.ClassDef | None:
    filename = _source_file(klass)
    tree = _module_tree(filename) if filename else None
    if tree is None:
        return None
    body: list[ast.stmt] = tree.body
    node: ast.ClassDef | None = None
    for part in klass.__qualname__.split("."):
        node = next((n for n in body if isinstance(n, ast.ClassDef) and n.name == part), None)
        if node is None:
            return None
        body = node.body
    return node


def _own_statements(fn: ast.AST) -> Iterator[ast.AST]:
    """Every node of ``fn``'s body, not descending into nested functions, lambdas or classes."""
    stack = list(getattr(fn, "body", []))
    while stack:
        node = stack.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if not isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef):
                stack.append(child)


def _self_attribute(target: ast.AST) -> str | None:
    if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
        return target.attr
    return None


@dataclass(frozen=True)
class _Method:
    klass: type
    node: ast.FunctionDef | ast.AsyncFunctionDef
    filename: str


def _methods(cls: type) -> dict[str, list[_Method]]:
    """Every method defined in the source of ``cls`` and its bases, by name, in MRO order."""
    out: dict[str, list[_Method]] = {}
    for klass in cls.__mro__:
        node = None if klass is object else _class_node(klass)
        if node is None:
            continue
        filename = _source_file(klass) or ""
        for item in node.body:
            if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                out.setdefault(item.name, []).append(_Method(klass, item, filename))
    return out


def _self_calls(fn: ast.AST) -> set[str]:
    """Methods ``fn`` calls on ``self`` (and on ``super()``, which runs the base's version)."""
    calls = set()
    for node in _own_statements(fn):
        if not isinstance(node, ast.Call):
            continue
        name = _self_attribute(node.func)
        if name is not None:
            calls.add(name)
        func = node.func
        if (
            isinstance(func, ast.Attribute)
            and isinstance(func.value, ast.Call)
            and isinstance(func.value.func, ast.Name)
            and func.value.func.id == "super"
        ):
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


def _walk_assignments(
    body: list[ast.stmt], conditions: tuple[tuple[str, bool], ...], in_loop: bool
) -> Iterator[tuple[str, ast.expr, tuple[tuple[str, bool], ...], bool]]:
    """Every ``self.<attr> = value`` in ``body``, with the branch conditions leading to it."""
    for stmt in body:
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            continue
        if isinstance(stmt, ast.Assign | ast.AnnAssign) and stmt.value is not None:
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            for target in targets:
                attribute = _self_attribute(target)
                if attribute is not None:
                    yield attribute, stmt.value, conditions, in_loop
        if isinstance(stmt, ast.If):
            test = ast.unparse(stmt.test)
            yield from _walk_assignments(stmt.body, (*conditions, (test, True)), in_loop)
            yield from _walk_assignments(stmt.orelse, (*conditions, (test, False)), in_loop)
        elif isinstance(stmt, ast.For | ast.AsyncFor | ast.While):
            yield from _walk_assignments(stmt.body, conditions, True)
            yield from _walk_assignments(stmt.orelse, conditions, True)
        elif isinstance(stmt, ast.With | ast.AsyncWith):
            yield from _walk_assignments(stmt.body, conditions, in_loop)
        elif isinstance(stmt, ast.Try | ast.TryStar):
            yield from _walk_assignments(stmt.body, conditions, in_loop)
            for handler in stmt.handlers:
                yield from _walk_assignments(handler.body, conditions, True)  # only on a failure
            yield from _walk_assignments(stmt.orelse, conditions, in_loop)
            yield from _walk_assignments(stmt.finalbody, conditions, in_loop)
        elif isinstance(stmt, ast.Match):
            for case in stmt.cases:
                yield from _walk_assignments(case.body, conditions, True)


def _assigned_anywhere(fn: ast.AST) -> set[str]:
    names: set[str] = set()
    for node in _own_statements(fn):
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign | ast.AugAssign):
            targets = [node.target]
        else:
            continue
        names.update(a for a in map(_self_attribute, targets) if a is not None)
    return names


def _simple_locals(fn: ast.AST) -> dict[str, tuple[tuple[int, str], ...]]:
    found: dict[str, list[tuple[int, str]]] = {}
    for node in _own_statements(fn):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            found.setdefault(node.targets[0].id, []).append((node.lineno, ast.unparse(node.value)))
    return {name: tuple(sorted(entries)) for name, entries in found.items()}


def _build_index(cls: type) -> ClassIndex:
    """One pass over the class's source: constructor assignments, locals, other methods assigning each name."""
    methods = _methods(cls)
    construction = _construction(methods)
    constructed = {id(m.node) for m in construction}
    assignments: dict[str, list[Assignment]] = {}
    scopes: dict[str, dict[str, tuple[tuple[int, str], ...]]] = {}
    for method in construction:
        klass = method.klass
        for attribute, value, conditions, in_loop in _walk_assignments(method.node.body, (), False):
            assignments.setdefault(attribute, []).append(
                Assignment(
                    owner=f"{klass.__name__}.{method.node.name}",
                    attribute=attribute,
                    text=ast.unparse(value),
                    lineno=value.lineno,
                    module=klass.__module__,
                    klass=klass.__qualname__,
                    function=method.node.name,
                    filename=method.filename,
                    conditions=conditions,
                    in_loop=in_loop,
                )
            )
        scopes[f"{klass.__module__}:{klass.__qualname__}.{method.node.name}"] = _simple_locals(method.node)
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
    )


# --- the index, cached on disk beside the byte-code cache ---------------------------------
def _index_key(cls: type) -> str | None:
    digest = hashlib.sha256(f"{_INDEX_SCHEMA}:{cls.__module__}:{cls.__qualname__}".encode())
    for klass in cls.__mro__:
        if klass is object:
            continue
        filename = _source_file(klass)
        if filename is None:
            continue
        try:
            with open(filename, "rb") as fh:
                digest.update(filename.encode() + b"\0" + hashlib.sha256(fh.read()).digest())
        except OSError:
            return None
    return digest.hexdigest()


def _cache_dir() -> str | None:
    prefix = os.environ.get("PYTHONPYCACHEPREFIX")
    return os.path.join(prefix, "difflab-construction") if prefix else None


def _to_json(index: ClassIndex) -> str:
    return json.dumps(
        {
            "assignments": {k: [asdict(a) for a in v] for k, v in index.assignments.items()},
            "elsewhere": index.elsewhere,
            "locals": index.locals,
        }
    )


def _from_json(text: str) -> ClassIndex:
    data = json.loads(text)

    def assignment(raw: dict[str, Any]) -> Assignment:
        raw["conditions"] = tuple((test, bool(branch)) for test, branch in raw["conditions"])
        return Assignment(**raw)

    return ClassIndex(
        {k: tuple(assignment(a) for a in v) for k, v in data["assignments"].items()},
        {k: tuple(v) for k, v in data["elsewhere"].items()},
        {
            scope: {name: tuple((int(n), str(t)) for n, t in entries) for name, entries in names.items()}
            for scope, names in data["locals"].items()
        },
    )


@functools.cache
def class_index(cls: type) -> ClassIndex:
    """The construction index of ``cls``, from the disk cache when its source files are unchanged."""
    key, folder = _index_key(cls), _cache_dir()
    path = os.path.join(folder, f"{key}.json") if key and folder else None
    if path is not None:
        try:
            with open(path, encoding="utf-8") as fh:
                return _from_json(fh.read())
        except (OSError, ValueError, KeyError, TypeError):
            pass
    index = _build_index(cls)
    if path is not None:
        try:  # best effort: a read-only cache (the Docker backend) just means parsing again
            os.makedirs(folder, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=folder, suffix=".part")
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(_to_json(index))
            os.replace(tmp, path)
        except OSError:
            pass
    return index


def shadowed_class_values(cls: type) -> dict[str, Any]:
    """Plain class-level values that the constructor also assigns (``enable_x: bool = False`` on a base).

    Normal attribute lookup finds these, so an object built without ``__init__``
    would silently read the class value where the build's constructor computes
    another one; the harness answers them like missing attributes instead.
    """
    return dict(_shadowed_class_values(cls))


@functools.cache
def _shadowed_class_values(cls: type) -> dict[str, Any]:
    out: dict[str, Any] = {}
    names = class_index(cls).assignments
    for klass in reversed(cls.__mro__):
        for name, value in vars(klass).items():
            if name in names and not name.startswith("__"):
                if callable(value) or hasattr(value, "__get__"):
                    out.pop(name, None)  # a method or descriptor: not a plain default
                else:
                    out[name] = value
    return out


def lookup(cls: type, attribute: str) -> Lookup:
    """How the construction code of ``cls`` (from the materialised source) sets ``attribute``."""
    index = class_index(cls)
    return Lookup(attribute, index.assignments.get(attribute, ()), index.elsewhere.get(attribute, ()))


# --- evaluating one assignment ------------------------------------------------------------
@functools.lru_cache(maxsize=512)
def _compiled(text: str, filename: str) -> tuple[Any, str | None]:
    """The expression compiled for ``eval``, and the name of a refused call in it (if any)."""
    tree = ast.parse(text, mode="eval")
    refused = None
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            if name in _REFUSED_CALLS or any(s in name.lower() for s in _REFUSED_SUBSTRINGS):
                refused = name
                break
    return compile(tree, filename, "eval"), refused


@functools.lru_cache(maxsize=1024)
def _function_object(assignment: Assignment) -> Any:
    owner: Any = sys.modules.get(assignment.module)
    for part in assignment.klass.split("."):
        owner = getattr(owner, part, None)
    fn = vars(owner).get(assignment.function) if owner is not None else None
    fn = getattr(fn, "__func__", fn)
    return inspect.unwrap(fn) if callable(fn) else None


class _Scope(dict):
    """Local names of one construction function, resolved on demand."""

    def __init__(self, obj: Any, assignment: Assignment, lineno: int, parameters: dict[str, Any], depth: int) -> None:
        super().__init__(self=obj)
        self._obj = obj
        self._assignment = assignment
        self._lineno = lineno
        self._parameters = parameters
        self._depth = depth

    def __missing__(self, name: str) -> Any:
        if name in self._parameters:
            value = self._parameters[name]
            self[name] = value
            return value
        scope = class_index_scope(self._assignment).get(name, ())
        earlier = [(n, t) for n, t in scope if n < self._lineno]
        if not earlier:
            stored = _STORED.get(self._assignment.scope_key, {}).get(name)
            if stored is not None and stored in vars(self._obj):
                # a constructor argument the function also kept: ``self.mode = mode``
                value = vars(self._obj)[stored]
                self[name] = value
                return value
            raise KeyError(name)  # a module global or builtin: eval looks there next
        lineno, text = earlier[-1]  # the last simple ``name = ...`` before the use
        value = _evaluate(self._obj, self._assignment, text, lineno, self._parameters, self._depth + 1)
        self[name] = value
        return value


_SCOPES: dict[str, dict[str, tuple[tuple[int, str], ...]]] = {}
_STORED: dict[str, dict[str, str]] = {}  # scope_key -> argument name -> attribute it is stored in


def class_index_scope(assignment: Assignment) -> dict[str, tuple[tuple[int, str], ...]]:
    return _SCOPES.get(assignment.scope_key, {})


@functools.lru_cache(maxsize=512)
def _signature(fn: Any) -> inspect.Signature | None:
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):
        return None


def _parameters(assignment: Assignment, known: dict[str, Any]) -> dict[str, Any]:
    fn = _function_object(assignment)
    out: dict[str, Any] = {}
    if fn is None:
        return out
    signature = _signature(fn)
    if signature is None:
        return out
    for name, param in signature.parameters.items():
        if name == "self":
            continue
        if name in known:
            out[name] = known[name]
        elif param.default is not inspect.Parameter.empty:
            out[name] = param.default
    return out


def _evaluate(obj: Any, assignment: Assignment, text: str, lineno: int, parameters: dict[str, Any], depth: int) -> Any:
    if depth > _MAX_DEPTH:
        raise NotEvaluable(f"`{assignment.text}` depends on too many locals")
    code, refused = _compiled(text, assignment.filename)
    if refused is not None:
        raise NotEvaluable(f"`{text}` calls {refused}(), which the harness never runs")
    fn = _function_object(assignment)
    if fn is None:
        raise NotEvaluable(f"{assignment.owner} is not a plain function")
    try:
        return eval(code, fn.__globals__, _Scope(obj, assignment, lineno, parameters, depth))  # noqa: S307
    except NotEvaluable:
        raise
    except Exception as exc:
        raise NotEvaluable(f"`{text}` failed here: {type(exc).__name__}: {exc}") from None


@functools.cache
def _register_scopes(cls: type) -> None:
    """The class's local assignments and stored arguments, known to every evaluation (once per class)."""
    index = class_index(cls)
    _SCOPES.update(index.locals)
    for assignments in index.assignments.values():
        for a in assignments:
            if a.text.isidentifier() and not a.conditions:
                _STORED.setdefault(a.scope_key, {}).setdefault(a.text, a.attribute)


def build_default(obj: Any, cls: type, attribute: str, known: dict[str, Any]) -> tuple[Any, Assignment]:
    """The value this build's constructor gives ``attribute`` on ``obj``, and where it comes from.

    Only assignments whose enclosing ``if`` tests hold here count; raises
    :class:`NotEvaluable` when a test or the value cannot be evaluated, or
    when several constructor functions set different values.
    """
    index = class_index(cls)
    _register_scopes(cls)
    found = index.assignments.get(attribute, ())
    if not found:
        raise NotEvaluable(f"the constructor of {cls.__name__} does not set {attribute!r}")
    applicable: list[tuple[Assignment, dict[str, Any]]] = []
    for assignment in found:
        parameters = _parameters(assignment, known)
        taken = _branch_taken(obj, assignment, parameters)
        if taken is False:
            continue
        if taken is None or assignment.in_loop:
            raise NotEvaluable(
                f"{assignment.owner} sets it as `{assignment.text}` only under a condition the harness cannot decide"
            )
        applicable.append((assignment, parameters))
    if not applicable:
        raise NoBranchApplies(f"no branch of the constructor of {cls.__name__} that runs here sets {attribute!r}")
    results: list[tuple[Any, Assignment]] = []
    for assignment, parameters in applicable:
        try:
            value = _evaluate(obj, assignment, assignment.text, assignment.lineno, parameters, 0)
        except NotEvaluable as exc:
            raise NotEvaluable(f"{assignment.owner}: {exc}") from None
        results.append((value, assignment))
    last_value, last = results[-1]
    differing = any(not _equal(last_value, value) for value, _ in results[:-1])
    if differing and len({a.scope_key for _, a in results}) > 1:
        places = ", ".join(f"{a.owner}: `{a.text}`" for _, a in results)
        raise NotEvaluable(f"set to different values in several constructor functions ({places})")
    return last_value, last  # within one straight-line function the last assignment that runs wins


def _branch_taken(obj: Any, assignment: Assignment, parameters: dict[str, Any]) -> bool | None:
    """Whether every ``if`` around the assignment takes its branch here (None: cannot tell)."""
    for test, branch in assignment.conditions:
        try:
            value = bool(_evaluate(obj, assignment, test, assignment.lineno, parameters, 0))
        except NotEvaluable:
            return None
        if value is not branch:
            return False
    return True


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


@functools.lru_cache(maxsize=1024)
def source_line(assignment: Assignment) -> str:
    return textwrap.shorten(f"{assignment.owner}: self.{assignment.attribute} = {assignment.text}", 200)
