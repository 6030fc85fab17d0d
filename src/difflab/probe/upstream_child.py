"""Run SGLang's own unittest-style test files inside the shared environment; write one JSON result.

``python -m difflab.probe.upstream_child OUT_JSON TESTS_ROOT FILE [FILE ...]`` with the materialised
source and the staged child modules on ``PYTHONPATH`` (as for a probe).

unittest, not pytest: the shared environment must hold SGLang's
dependencies and nothing else (pytest's plugins and assertion rewriting
would be one more thing that differs between the lab and a user's
install), and SGLang's CPU unit tests are ``unittest.TestCase`` classes
(``CustomTestCase``). A module-level pytest test function is not collected;
the result says so rather than passing silently.

Outcomes per test: ``passed``, ``failed`` (an assertion: behaviour),
``error`` with ``stale_fake`` true for ImportError/AttributeError (the
test's own fakes or imports no longer fit this code) or false for any other
exception, and ``skipped``. Standard library only.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time
import traceback
import unittest
from pathlib import Path
from typing import Any

from difflab.probe import stubs
from difflab.probe.child import write_atomic

STALE = (ImportError, AttributeError)


def _outcome(test_id: str, outcome: str, exc: Any = None, duration: float = 0.0) -> dict[str, Any]:
    record: dict[str, Any] = {
        "id": test_id,
        "outcome": outcome,
        "duration_s": round(duration, 6),
        "error_type": None,
        "message": None,
        "stale_fake": False,
        "traceback": None,
    }
    if exc is not None:
        etype, value, tb = exc
        record["error_type"] = etype.__name__
        record["message"] = str(value).strip().splitlines()[0][:500] if str(value).strip() else etype.__name__
        record["stale_fake"] = outcome == "error" and issubclass(etype, STALE)
        record["traceback"] = "".join(traceback.format_exception(etype, value, tb))[-4000:]
    return record


class _Result(unittest.TestResult):
    """Collects one record per test, with its own timing."""

    def __init__(self, rel: str) -> None:
        super().__init__()
        self.rel = rel
        self.records: list[dict[str, Any]] = []
        self._started = 0.0

    def _id(self, test: unittest.TestCase) -> str:
        return f"{self.rel}::{type(test).__name__}::{getattr(test, '_testMethodName', str(test))}"

    def startTest(self, test: unittest.TestCase) -> None:  # noqa: N802 - unittest's API
        super().startTest(test)
        self._started = time.perf_counter()

    def _took(self) -> float:
        return time.perf_counter() - self._started

    def addSuccess(self, test: unittest.TestCase) -> None:  # noqa: N802
        self.records.append(_outcome(self._id(test), "passed", duration=self._took()))

    def addFailure(self, test: unittest.TestCase, err: Any) -> None:  # noqa: N802
        self.records.append(_outcome(self._id(test), "failed", err, self._took()))

    def addError(self, test: Any, err: Any) -> None:  # noqa: N802
        test_id = self._id(test) if isinstance(test, unittest.TestCase) else f"{self.rel}::{test}"
        self.records.append(_outcome(test_id, "error", err, self._took()))

    def addSkip(self, test: unittest.TestCase, reason: str) -> None:  # noqa: N802
        record = _outcome(self._id(test), "skipped", duration=self._took())
        record["message"] = reason
        self.records.append(record)

    def addExpectedFailure(self, test: unittest.TestCase, err: Any) -> None:  # noqa: N802
        self.records.append(_outcome(self._id(test), "passed", duration=self._took()))

    def addUnexpectedSuccess(self, test: unittest.TestCase) -> None:  # noqa: N802
        record = _outcome(self._id(test), "failed", duration=self._took())
        record["message"] = "unexpected success of an expectedFailure test"
        self.records.append(record)


def run_file(tests_root: Path, rel: str) -> list[dict[str, Any]]:
    path = tests_root / rel
    if not path.is_file():
        return [_outcome(f"{rel}::(file)", "error", (FileNotFoundError, FileNotFoundError(f"{rel} not found"), None))]
    sys.path.insert(0, str(path.parent))
    started = time.perf_counter()
    try:
        name = "difflab_upstream_" + rel.replace("/", "_").removesuffix(".py")
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    except BaseException:  # noqa: BLE001 - an import failure is this file's result
        return [_outcome(f"{rel}::(import)", "error", sys.exc_info(), time.perf_counter() - started)]
    suite = unittest.defaultTestLoader.loadTestsFromModule(module)
    result = _Result(rel)
    suite.run(result)
    if not result.records:
        record = _outcome(f"{rel}::(collect)", "skipped")
        record["message"] = "no unittest.TestCase tests in this file"
        return [record]
    return result.records


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        print("usage: python -m difflab.probe.upstream_child OUT_JSON TESTS_ROOT FILE [FILE ...]", file=sys.stderr)
        return 2
    stubs.install()
    out, tests_root, files = Path(argv[0]), Path(argv[1]), argv[2:]
    records: list[dict[str, Any]] = []
    for rel in files:
        records += run_file(tests_root, rel)
    write_atomic(out, {"tests": records})
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # interpreter teardown with torch loaded costs seconds and proves nothing


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
