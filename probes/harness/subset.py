"""The small evaluator behind :mod:`harness.construction`: one expression of a constructor, node by node.

Nothing here calls ``eval``. An expression is parsed and walked; each node is
either one the subset documents in :mod:`harness.construction` (literals, names,
attribute reads, known calls, operators, ``a if c else b``) or an error that
names it. A name is resolved in the constructor's own scope: ``self``, a local
bound once on the path that runs, a parameter, a module global, a few builtins.
"""

from __future__ import annotations

import ast
import builtins
import collections
import operator
import queue
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

_REFUSED_CALLS = frozenset(
    {"Thread", "Process", "Popen", "start", "socket", "bind", "connect", "Context", "submit", "run", "Timer"}
)
"""Calls whose evaluation would start work or touch the outside world: never evaluated."""
_REFUSED_SUBSTRINGS = ("engine", "cuda", "device")  # matched case-insensitively: TransferEngine(), init_engine()
_MAX_DEPTH = 8

_BUILTINS = {
    name: getattr(builtins, name)
    for name in [
        "set",
        "dict",
        "list",
        "tuple",
        "frozenset",
        "int",
        "float",
        "str",
        "bool",
        "bytes",
        "len",
        "min",
        "max",
        "abs",
        "sum",
        "any",
        "all",
        "isinstance",
        "getattr",
        "hasattr",
        "sorted",
        "range",
    ]
}
"""The builtins a constructor expression may name (``None``/``True``/``False`` are literals)."""

_KNOWN_CALLS: tuple[Any, ...] = (
    *_BUILTINS.values(),
    collections.defaultdict,
    collections.OrderedDict,
    collections.deque,
    collections.Counter,
    threading.Lock,
    threading.RLock,
    threading.Event,
    threading.Condition,
    threading.Semaphore,
    threading.BoundedSemaphore,
    queue.Queue,
    queue.SimpleQueue,
)
"""Standard callables a constructor may call besides the build's own: fresh containers and locks."""

_BINARY: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
    ast.BitOr: operator.or_,
    ast.BitAnd: operator.and_,
}
_UNARY: dict[type, Callable[[Any], Any]] = {
    ast.Not: operator.not_,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
    ast.Invert: operator.invert,
}
_COMPARE: dict[type, Callable[[Any, Any], Any]] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.Is: operator.is_,
    ast.IsNot: operator.is_not,
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
}
_OUTSIDE_NAMES = {
    ast.Lambda: "a lambda",
    ast.ListComp: "a comprehension",
    ast.SetComp: "a comprehension",
    ast.DictComp: "a comprehension",
    ast.GeneratorExp: "a generator",
    ast.JoinedStr: "an f-string",
    ast.NamedExpr: "an assignment expression",
    ast.Starred: "an unpacking",
    ast.Await: "an await",
    ast.Yield: "a yield",
    ast.YieldFrom: "a yield",
}


class NotEvaluable(Exception):  # noqa: N818 - reads as an answer
    """The build sets the attribute, but from something the harness cannot (or must not) evaluate."""


@dataclass(frozen=True)
class Condition:
    """One ``if`` test around a statement and the branch the statement sits in (True: body, False: else)."""

    test: str
    branch: bool
    lineno: int


@dataclass(frozen=True)
class Binding:
    """One binding of a local name in a construction function: a plain assignment, or another form (named)."""

    lineno: int
    text: str  # the value's source for ``name = <expr>``; "" for any other form
    form: str  # "assignment", "parameter", "a `for` target", "unpacking", ...
    conditions: tuple[Condition, ...] = ()
    outside: str = ""


def refused_call(tree: ast.AST) -> str | None:
    """The name of a call in ``tree`` the harness never makes (an engine, a device, a thread...), if any."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            if name in _REFUSED_CALLS or any(s in name.lower() for s in _REFUSED_SUBSTRINGS):
                return name
    return None


@dataclass
class Scope:
    """One construction function, as the evaluator sees it: the object, its parameters and locals.

    ``parameters``: values for the function's parameters (the caller's, else declared
    defaults); ``stored``: parameter -> the attribute the function keeps it in;
    ``build_package``: the top-level package whose functions and classes count as the build's own.
    """

    obj: Any
    where: str  # "MooncakeKVManager.__init__", for messages
    function: Any
    parameters: Mapping[str, Any]
    locals: Mapping[str, tuple[Binding, ...]]
    stored: Mapping[str, str]
    build_package: str
    _values: dict[str, Any] = field(default_factory=dict)

    def evaluate(self, text: str, lineno: int, depth: int = 0) -> Any:
        """The value of expression ``text`` as it reads at line ``lineno`` of the function."""
        if depth > _MAX_DEPTH:
            raise NotEvaluable(f"`{text}` depends on too many locals")
        tree = ast.parse(text, mode="eval")
        refused = refused_call(tree)
        if refused is not None:
            raise NotEvaluable(f"`{text}` calls {refused}(), which the harness never runs")
        if self.function is None:
            raise NotEvaluable(f"{self.where} is not a plain function")
        try:
            return _Walk(self, lineno, depth).value(tree.body)
        except NotEvaluable:
            raise
        except Exception as exc:
            raise NotEvaluable(f"`{text}` failed here: {type(exc).__name__}: {exc}") from None

    def conditions_hold(self, conditions: tuple[Condition, ...], depth: int = 0) -> bool:
        """Whether every ``if`` test takes the given branch here; raises NotEvaluable when one cannot be decided."""
        for condition in conditions:
            try:
                value = bool(self.evaluate(condition.test, condition.lineno, depth))
            except NotEvaluable as exc:
                raise NotEvaluable(f"`if {condition.test}` (line {condition.lineno}): {exc}") from None
            if value is not condition.branch:
                return False
        return True

    def name(self, name: str, lineno: int, depth: int) -> Any:
        """``name`` as it reads at ``lineno``: self, a local, a parameter, a module global or a builtin."""
        if name == "self":
            return self.obj
        bindings = self.locals.get(name)
        if bindings is not None:
            return self._local(name, bindings, lineno, depth)
        namespace = self.function.__globals__
        if name in namespace:
            return namespace[name]
        if name in _BUILTINS:
            return _BUILTINS[name]
        raise NotEvaluable(f"`{name}` is neither a local of {self.where}, a module global nor a builtin it reads")

    def _local(self, name: str, bindings: tuple[Binding, ...], lineno: int, depth: int) -> Any:
        key = f"{name}@{lineno}"
        if key not in self._values:
            self._values[key] = self._resolve_local(name, bindings, lineno, depth)
        return self._values[key]

    def _resolve_local(self, name: str, bindings: tuple[Binding, ...], lineno: int, depth: int) -> Any:
        is_parameter = any(b.form == "parameter" for b in bindings)
        running = [b for b in bindings if b.form != "parameter" and b.lineno < lineno and self._runs(name, b, depth)]
        if running and is_parameter:
            raise NotEvaluable(f"parameter `{name}` of {self.where} is reassigned (line {running[0].lineno})")
        if len(running) > 1:
            lines = ", ".join(str(b.lineno) for b in running)
            raise NotEvaluable(f"local `{name}` of {self.where} is assigned {len(running)} times (lines {lines})")
        if running:
            (binding,) = running
            if binding.form != "assignment":
                raise NotEvaluable(f"local `{name}` of {self.where} is bound by {binding.form} (line {binding.lineno})")
            return self.evaluate(binding.text, binding.lineno, depth + 1)
        if is_parameter:
            return self._parameter(name)
        raise NotEvaluable(f"local `{name}` of {self.where} is not bound before line {lineno} on the path that runs")

    def _runs(self, name: str, binding: Binding, depth: int) -> bool:
        if binding.outside:
            raise NotEvaluable(f"local `{name}` of {self.where} is bound inside {binding.outside}")
        try:
            return self.conditions_hold(binding.conditions, depth + 1)
        except NotEvaluable as exc:
            raise NotEvaluable(f"local `{name}` of {self.where} is bound under a condition: {exc}") from None

    def _parameter(self, name: str) -> Any:
        if name in self.parameters:
            return self.parameters[name]
        attribute = self.stored.get(name)
        state = vars(self.obj)
        if attribute is not None and attribute in state:  # ``self.mode = mode``: the object keeps the argument
            return state[attribute]
        raise NotEvaluable(f"parameter `{name}` of {self.where} has no value here (no default, not kept on the object)")


class _Walk:
    """One evaluation: the nodes of one expression, read at one line of the function."""

    def __init__(self, scope: Scope, lineno: int, depth: int) -> None:
        self.scope, self.lineno, self.depth = scope, lineno, depth

    def value(self, node: ast.expr) -> Any:
        method = getattr(self, f"_{type(node).__name__}", None)
        if method is None:
            what = _OUTSIDE_NAMES.get(type(node), f"a {type(node).__name__} expression")
            raise NotEvaluable(f"`{ast.unparse(node)}` is {what}, outside what the harness reads")
        return method(node)

    def _Constant(self, node: ast.Constant) -> Any:  # noqa: N802 - named after the node
        return node.value

    def _Name(self, node: ast.Name) -> Any:  # noqa: N802
        return self.scope.name(node.id, self.lineno, self.depth)

    def _Attribute(self, node: ast.Attribute) -> Any:  # noqa: N802
        return getattr(self.value(node.value), node.attr)

    def _Subscript(self, node: ast.Subscript) -> Any:  # noqa: N802
        return self.value(node.value)[self.value(node.slice)]

    def _Slice(self, node: ast.Slice) -> slice:  # noqa: N802
        parts = (node.lower, node.upper, node.step)
        return slice(*(None if part is None else self.value(part) for part in parts))

    def _Tuple(self, node: ast.Tuple) -> tuple[Any, ...]:  # noqa: N802
        return tuple(self.value(e) for e in node.elts)

    def _List(self, node: ast.List) -> list[Any]:  # noqa: N802
        return [self.value(e) for e in node.elts]

    def _Set(self, node: ast.Set) -> set[Any]:  # noqa: N802
        return {self.value(e) for e in node.elts}

    def _Dict(self, node: ast.Dict) -> dict[Any, Any]:  # noqa: N802
        if any(key is None for key in node.keys):
            raise NotEvaluable(f"`{ast.unparse(node)}` unpacks a mapping, outside what the harness reads")
        return {self.value(k): self.value(v) for k, v in zip(node.keys, node.values, strict=True)}  # type: ignore[arg-type]

    def _BoolOp(self, node: ast.BoolOp) -> Any:  # noqa: N802
        result: Any = None
        for operand in node.values:  # short-circuits as Python does
            result = self.value(operand)
            if bool(result) is isinstance(node.op, ast.Or):
                return result
        return result

    def _UnaryOp(self, node: ast.UnaryOp) -> Any:  # noqa: N802
        return _UNARY[type(node.op)](self.value(node.operand))

    def _BinOp(self, node: ast.BinOp) -> Any:  # noqa: N802
        function = _BINARY.get(type(node.op))
        if function is None:
            raise NotEvaluable(f"`{ast.unparse(node)}` uses an operator outside what the harness reads")
        return function(self.value(node.left), self.value(node.right))

    def _Compare(self, node: ast.Compare) -> bool:  # noqa: N802
        left = self.value(node.left)
        for op, comparator in zip(node.ops, node.comparators, strict=True):
            right = self.value(comparator)
            if not _COMPARE[type(op)](left, right):
                return False
            left = right
        return True

    def _IfExp(self, node: ast.IfExp) -> Any:  # noqa: N802
        return self.value(node.body) if self.value(node.test) else self.value(node.orelse)

    def _Call(self, node: ast.Call) -> Any:  # noqa: N802
        text = ast.unparse(node.func)
        root = node.func
        while isinstance(root, ast.Attribute):
            root = root.value
        if isinstance(root, ast.Name) and root.id == "self":
            raise NotEvaluable(f"`{text}()` is a method call on the object under construction, which it never makes")
        if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
            raise NotEvaluable(f"`{ast.unparse(node)}` unpacks its arguments, outside what the harness reads")
        function = self.value(node.func)
        if not self._known(function):
            raise NotEvaluable(f"`{text}()` is neither the build's own code nor a call the harness knows")
        args = [self.value(a) for a in node.args]
        kwargs = {k.arg: self.value(k.value) for k in node.keywords}
        return function(*args, **kwargs)

    def _known(self, function: Any) -> bool:
        if any(function is known for known in _KNOWN_CALLS):
            return True
        module = getattr(function, "__module__", None)
        return isinstance(module, str) and module.split(".")[0] == self.scope.build_package
