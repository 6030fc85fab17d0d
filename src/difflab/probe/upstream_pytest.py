"""A pytest plugin that records every test of an SGLang pytest-style file, as the unittest runner does.

Loaded by name (``-p difflab.probe.upstream_pytest``) into the pytest that
:mod:`difflab.probe.upstream_child` runs in its own process; pytest calls these hooks by
name, so the module needs no pytest import (standard library only). pytest reports a
unittest sub-test failure as its own report and the parent test as passed; the lab's
outcome of a test is taken over all its parts, sub-tests included.
"""

from __future__ import annotations

import unittest
from pathlib import Path
from typing import Any

from difflab.probe.upstream_facts import Where, part, unwrap_retries


class Session:
    """What one pytest run collected: records per node id, and collection (import) failures per file."""

    def __init__(self, root: Path, source_root: Path) -> None:
        self.root = root
        self.source_root = source_root
        self.tests: dict[str, dict[str, Any]] = {}
        self.broken: dict[str, dict[str, Any]] = {}
        self.unwrapped: set[str] = set()
        self._parts: dict[int, tuple[Any, dict[str, Any]]] = {}
        self._errors: dict[int, tuple[Any, BaseException]] = {}

    def held(self, report: Any, record: dict[str, Any]) -> None:
        """Pair a report's record with its exception, whichever of the two hooks pytest calls first."""
        self._parts[id(report)] = (report, record)
        pending = self._errors.pop(id(report), None)
        if pending is not None and pending[0] is report:
            self.explain(report, record, pending[1])

    def raised(self, report: Any, exc: BaseException) -> None:
        held = self._parts.get(id(report))
        if held is not None and held[0] is report:
            self.explain(report, held[1], exc)
        else:
            self._errors[id(report)] = (report, exc)

    def explain(self, report: Any, record: dict[str, Any], exc: BaseException) -> None:
        keep = None if record["phase"] == "import" else record.get("message")  # the exception says it best
        record.update(part(record["outcome"], record["phase"], exc, self.where(report.nodeid), keep))
        if record["outcome"] == "failed" and not isinstance(exc, AssertionError) and type(exc).__name__ != "Failed":
            record["outcome"] = "error"

    def where(self, nodeid: str) -> Where:
        rel = nodeid.split("::", 1)[0]
        return Where(self.root / rel, self.root / "test", self.source_root)

    def record(self, nodeid: str) -> dict[str, Any]:
        rel = nodeid.split("::", 1)[0]
        empty = {"id": nodeid, "file": rel, "parts": [], "subtests": [], "duration_s": 0.0}
        return self.tests.setdefault(nodeid, empty)


SESSION: Session | None = None


def start(root: Path, source_root: Path) -> Session:
    """A fresh record for the next pytest run (one per folder of test files)."""
    global SESSION
    SESSION = Session(root, source_root)
    return SESSION


def _outcome(report: Any) -> str:
    if report.passed:
        return "passed"
    if report.skipped:
        return "passed" if hasattr(report, "wasxfail") else "skipped"
    return "failed" if report.when == "call" else "error"


def _subtest_name(context: Any) -> str:
    msg = f"[{context.msg}] " if getattr(context, "msg", None) else ""
    kwargs = getattr(context, "kwargs", None) or {}
    params = f"({', '.join(f'{k}={v}' for k, v in kwargs.items())})" if kwargs else ""
    return (msg + params).strip() or "(sub-test)"


def pytest_collection_modifyitems(session: Any, config: Any, items: list[Any]) -> None:
    """Unwrap CustomTestCase's retry on every unittest class collected."""
    assert SESSION is not None
    for item in items:
        cls = getattr(item, "cls", None)
        if isinstance(cls, type) and issubclass(cls, unittest.TestCase):
            SESSION.unwrapped.update(unwrap_retries(cls))


def pytest_collectreport(report: Any) -> None:
    assert SESSION is not None
    if report.failed:
        message = str(getattr(report, "longrepr", "") or "").strip().splitlines()[-1:] or [""]
        record = part("error", "import", message=message[0][:500])
        SESSION.broken[report.nodeid.split("::", 1)[0]] = record
        SESSION.held(report, record)


def pytest_runtest_logreport(report: Any) -> None:
    assert SESSION is not None
    test = SESSION.record(report.nodeid)
    test["duration_s"] += float(getattr(report, "duration", 0.0) or 0.0)
    outcome = _outcome(report)
    message = None
    if outcome == "skipped" and isinstance(report.longrepr, tuple):
        message = str(report.longrepr[-1])
    record = part(outcome, report.when, message=message)
    context = getattr(report, "context", None)
    if context is not None:
        test["subtests"].append({"name": _subtest_name(context), **record})
    elif outcome != "passed" or report.when == "call":
        test["parts"].append(record)
    SESSION.held(report, record)


def pytest_exception_interact(node: Any, call: Any, report: Any) -> None:
    """The exception behind a failed report: its facts go into that report's record."""
    assert SESSION is not None
    excinfo = getattr(call, "excinfo", None)
    if excinfo is not None:
        SESSION.raised(report, excinfo.value)
