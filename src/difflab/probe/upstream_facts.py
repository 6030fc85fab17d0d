"""What an SGLang test file declares and what one of its failures says about itself (standard library only).

The replay decides later, with both sides' code at hand, whether a failure is behaviour
(``failed``), a test whose own fakes no longer fit the code (``stale``), or a symbol the
fix adds that this code lacks. Here only facts are gathered, in the process that saw the
exception: its type and message, the phase, where it was raised, which name it missed on
which SGLang module or classes, and whether the object that lacked it was one of the
test's own fakes.
"""

from __future__ import annotations

import ast
import re
import sys
import traceback
import types
import unittest
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

SGLANG = "sglang"
CANNOT_IMPORT = re.compile(r"cannot import name '(?P<name>[^']+)' from '(?P<module>[^'(]+)'")
PATCH_TARGET = re.compile(r"<module '(?P<module>[^']+)'.*?> does not have the attribute '(?P<name>[^']+)'")
BINDING = re.compile(
    r"^(?P<callable>[\w.<>]+)\(\) (got an unexpected keyword|missing \d+ required|takes \d+|got multiple values)"
)


@dataclass(frozen=True)
class Where:
    """The file a test comes from, the folder of test code around it, and the SGLang source under test."""

    test_file: Path
    test_dir: Path
    source_root: Path

    def kind(self, path: Path) -> str:
        path = path.resolve()
        if path == self.test_file.resolve() or path.is_relative_to(self.test_dir.resolve()):
            return "test"
        return "sglang" if path.is_relative_to(self.source_root.resolve()) else "other"

    def defines(self, cls: type) -> bool:
        """``cls`` comes from the tests' own code (the test file or a helper module beside it)."""
        source = getattr(sys.modules.get(getattr(cls, "__module__", "") or ""), "__file__", None)
        return bool(source) and self.kind(Path(str(source))) == "test"

    def names_callable(self, name: str) -> bool:
        """A callable the test file defines: a ``lambda`` (the fakes' usual shape) or a ``def`` of that name."""
        short = name.rsplit(".", 1)[-1]
        if short == "<lambda>":
            return True
        try:
            text = self.test_file.read_text(errors="replace")
        except OSError:
            return False
        return re.search(rf"\bdef {re.escape(short)}\(", text) is not None


PHASES = {"_callSetUp": "setup", "_callTestMethod": "call", "_callTearDown": "teardown", "doCleanups": "teardown"}


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:500] if text else type(exc).__name__


def root_cause(exc: BaseException) -> BaseException:
    """The exception a collector wrapped (pytest raises its own error ``from`` an ImportError)."""
    seen = {id(exc)}
    while exc.__cause__ is not None and id(exc.__cause__) not in seen:
        exc = exc.__cause__
        seen.add(id(exc))
    return exc


def _sglang_owners(obj: Any) -> list[str]:
    """``module:QualName`` of every SGLang class in the MRO of ``obj`` (a class, or an instance's class)."""
    cls = obj if isinstance(obj, type) else type(obj)
    return [f"{k.__module__}:{k.__qualname__}" for k in cls.__mro__ if k.__module__.split(".")[0] == SGLANG]


def missing_symbol(exc: BaseException) -> dict[str, Any] | None:
    """The SGLang name the code under test did not have, if that is what ``exc`` says.

    ``{"module": M, "name": N}`` for a module attribute or an import (``name`` None for a
    missing module), ``{"owners": [...], "name": N}`` for an attribute of SGLang classes.
    """
    if isinstance(exc, ModuleNotFoundError):
        name = exc.name or ""
        return {"module": name, "name": None} if name.split(".")[0] == SGLANG else None
    if isinstance(exc, ImportError):
        m = CANNOT_IMPORT.search(str(exc))
        if m and m["module"].strip().split(".")[0] == SGLANG:
            return {"module": m["module"].strip(), "name": m["name"]}
        return None
    if not isinstance(exc, AttributeError):
        return None
    m = PATCH_TARGET.search(str(exc))
    if m and m["module"].split(".")[0] == SGLANG:
        return {"module": m["module"], "name": m["name"]}
    obj, name = getattr(exc, "obj", None), getattr(exc, "name", None)
    if obj is None or not name:
        return None
    if isinstance(obj, types.ModuleType):
        return {"module": obj.__name__, "name": name} if obj.__name__.split(".")[0] == SGLANG else None
    owners = _sglang_owners(obj)
    return {"owners": owners, "name": name} if owners else None


def fake_kind(exc: BaseException, where: Where) -> str | None:
    """The test's own fake that the code under test could not use, or None.

    An attribute missing on a ``SimpleNamespace``, a mock or a class the test file defines;
    a ``TypeError`` binding a callable the test file defines (``<lambda>`` included) or
    naming one of those fakes.
    """
    if isinstance(exc, AttributeError):
        obj = getattr(exc, "obj", None)
        if obj is None:
            return "Mock" if "Mock" in str(exc).split(" object", 1)[0] else None
        cls = obj if isinstance(obj, type) else type(obj)
        if cls is types.SimpleNamespace:
            return "SimpleNamespace"
        if isinstance(obj, mock.NonCallableMock):
            return "Mock"
        if where.defines(cls):
            return cls.__qualname__
        return None
    if isinstance(exc, TypeError):
        text = str(exc)
        m = BINDING.match(text)
        if m and where.names_callable(m["callable"]):
            return m["callable"]
        for name in ("SimpleNamespace", "Mock", "MagicMock"):
            if f"'{name}'" in text:
                return name
    return None


def raised_in(tb: types.TracebackType | None, where: Where) -> str:
    """Where the innermost frame is: the tests' code (``test``), SGLang's code (``sglang``), or ``other``."""
    frames = traceback.extract_tb(tb) if tb is not None else []
    return where.kind(Path(frames[-1].filename)) if frames else "other"


def unittest_phase(tb: types.TracebackType | None) -> str:
    """setup, call or teardown, from the unittest frames the traceback passes through."""
    phase = "call"
    while tb is not None:
        phase = PHASES.get(tb.tb_frame.f_code.co_name, phase)
        tb = tb.tb_next
    return phase


def describe(exc: BaseException, where: Where) -> dict[str, Any]:
    """The facts the replay classifies: type, message, missing SGLang symbol, fake, where raised."""
    cause = root_cause(exc)
    return {
        "error_type": type(cause).__name__,
        "message": first_line(cause),
        "missing": missing_symbol(cause),
        "fake": fake_kind(cause, where),
        "raised_in": raised_in(cause.__traceback__, where),
        "traceback": "".join(traceback.format_exception(type(cause), cause, cause.__traceback__))[-4000:],
    }


def unwrap_retries(cls: type) -> list[str]:
    """Give every class between ``cls`` and ``unittest.TestCase`` TestCase's own ``_callTestMethod``.

    SGLang's ``CustomTestCase`` retries each test method and re-raises any failure as a bare
    ``Exception("retry() exceed maximum number of retries.")``: an assertion and a stale
    fake would read the same. Returns the classes whose wrapper was replaced.
    """
    replaced = []
    for klass in cls.__mro__:
        if klass is unittest.TestCase:
            break
        if "_callTestMethod" in vars(klass):
            klass._callTestMethod = unittest.TestCase._callTestMethod  # type: ignore[method-assign]
            replaced.append(f"{klass.__module__}.{klass.__qualname__}")
    return replaced


def _base_names(node: ast.ClassDef) -> list[str]:
    names = []
    for base in node.bases:
        if isinstance(base, ast.Name):
            names.append(base.id)
        elif isinstance(base, ast.Attribute):
            names.append(base.attr)
    return names


def uses_pytest(tree: ast.Module) -> bool:
    """Imports pytest or defines module-level test functions: the file runs under pytest upstream too."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "pytest" for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "pytest":
            return True
    return any(isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name.startswith("test") for n in tree.body)


def declared_tests(path: Path) -> tuple[str, list[str]]:
    """``(style, ids)`` read from the source: ``unittest`` or ``pytest``, and ``Class::method`` / ``function`` ids.

    Used when the file cannot be imported on a side, so each of its tests still gets an
    outcome there. Tests a class inherits from another module are not seen (the other
    side's run names them).
    """
    tree = ast.parse(path.read_text(errors="replace"), str(path))
    style = "pytest" if uses_pytest(tree) else "unittest"
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}

    def is_testcase(name: str, seen: frozenset[str] = frozenset()) -> bool:
        node = classes.get(name)
        if node is None or name in seen:
            return False
        return any(b.endswith("TestCase") or is_testcase(b, seen | {name}) for b in _base_names(node))

    def methods(name: str, seen: frozenset[str] = frozenset()) -> list[str]:
        node = classes.get(name)
        if node is None or name in seen:
            return []
        own = [f.name for f in node.body if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)]
        inherited = [m for b in _base_names(node) for m in methods(b, seen | {name})]
        return [m for m in dict.fromkeys(own + inherited) if m.startswith("test")]

    ids = []
    for name in classes:
        collected = is_testcase(name) or (style == "pytest" and name.startswith("Test"))
        if collected:
            ids += [f"{name}::{m}" for m in methods(name)]
    if style == "pytest":
        functions = (n for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef))
        ids += [n.name for n in functions if n.name.startswith("test")]
    return style, ids


def part(
    outcome: str,
    phase: str,
    exc: BaseException | None = None,
    where: Where | None = None,
    message: str | None = None,
) -> dict[str, Any]:
    """One outcome record (a test, a phase of it, or a sub-test): what both runners write."""
    record: dict[str, Any] = {"outcome": outcome, "phase": phase, "message": message}
    record.update(dict.fromkeys(("error_type", "missing", "fake", "raised_in", "traceback")))
    if exc is not None and where is not None:
        record.update(describe(exc, where))
        if message:
            record["message"] = message
    return record
