"""Run SGLang's own test files inside the shared environment; write one JSON result.

``python -m difflab.probe.upstream_child REQUEST_JSON`` with the materialised source and the
staged child modules on ``PYTHONPATH`` (as for a probe). The request names the result file,
the SGLang source, the test files (``{"id", "path", "root"}``: the id is the path under the
root, a folder laid out like SGLang's repository) and the lab's staged pytest.

Each file runs the way it runs upstream: a ``unittest`` file (SGLang's ``CustomTestCase``
classes) with the standard library's runner, a pytest-style file (plain functions,
fixtures, ``import pytest``) under pytest, in this same process. pytest is the lab's own,
appended to the *end* of ``sys.path``: it fills in what the shared environment lacks and
shadows nothing SGLang imports. Two things SGLang's tests do are undone here so the
outcome says what happened: ``CustomTestCase``'s retry wrapper (it turns every failure
into a bare ``Exception``) is replaced by ``unittest.TestCase``'s own method call, and a
failing ``subTest`` is recorded (a plain ``TestResult`` would drop the test).

Per test the result holds its parts (one per phase that did not pass, or the call) and its
sub-tests, each with the facts of :mod:`difflab.probe.upstream_facts`. A file that cannot
be imported gives every test it declares the import failure as its outcome. Standard
library only.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import runpy
import sys
import tempfile
import time
import unittest
from pathlib import Path
from typing import Any

from difflab.probe import sandbox, stubs, upstream_pytest
from difflab.probe.child import write_atomic
from difflab.probe.upstream_facts import Where, declared_tests, part, unittest_phase, unwrap_retries

HOLDER = re.compile(r"\((?P<name>[\w.]+)\)$")
"""The scope an error holder names: ``setUpClass (module.Class)``, ``setUpModule (module)``."""


class Result(unittest.TestResult):
    """One record per test, its sub-tests included, with its own timing."""

    def __init__(self, rel: str, where: Where) -> None:
        super().__init__()
        self.rel = rel
        self.where = where
        self.records: dict[str, dict[str, Any]] = {}
        self.unwrapped: set[str] = set()
        self._started = 0.0

    def test_id(self, test: Any) -> str:
        if isinstance(test, unittest.TestCase):
            return f"{self.rel}::{type(test).__name__}::{test._testMethodName}"
        return f"{self.rel}::{test}"  # an error holder: setUpClass / setUpModule

    def record(self, test: Any) -> dict[str, Any]:
        tid = self.test_id(test)
        return self.records.setdefault(tid, {"id": tid, "file": self.rel, "parts": [], "subtests": [], "duration_s": 0})

    def _add(self, test: Any, outcome: str, err: Any = None, message: str | None = None) -> None:
        if isinstance(test, unittest.case._SubTest):
            self._add_sub(test.test_case, test, outcome, err, message)
            return
        phase = unittest_phase(err[2]) if err else "call"
        exc = err[1] if err else None
        self.record(test)["parts"].append(part(outcome, phase, exc, self.where, message))

    def _add_sub(self, test: Any, subtest: Any, outcome: str, err: Any = None, message: str | None = None) -> None:
        entry = part(outcome, "call", err[1] if err else None, self.where, message)
        self.record(test)["subtests"].append({"name": subtest._subDescription(), **entry})

    def startTest(self, test: unittest.TestCase) -> None:  # noqa: N802 - unittest's API
        super().startTest(test)
        self.unwrapped.update(unwrap_retries(type(test)))
        self.record(test)
        self._started = time.perf_counter()

    def stopTest(self, test: unittest.TestCase) -> None:  # noqa: N802
        self.record(test)["duration_s"] = round(time.perf_counter() - self._started, 6)
        super().stopTest(test)

    def addSuccess(self, test: unittest.TestCase) -> None:  # noqa: N802
        self._add(test, "passed")

    def addFailure(self, test: Any, err: Any) -> None:  # noqa: N802
        self._add(test, "failed", err)

    def addError(self, test: Any, err: Any) -> None:  # noqa: N802
        self._add(test, "error", err)

    def addSkip(self, test: Any, reason: str) -> None:  # noqa: N802
        self._add(test, "skipped", message=reason)

    def addExpectedFailure(self, test: Any, err: Any) -> None:  # noqa: N802
        self._add(test, "passed", message="expected failure")

    def addUnexpectedSuccess(self, test: Any) -> None:  # noqa: N802
        self._add(test, "failed", message="unexpected success of an expectedFailure test")

    def addSubTest(self, test: Any, subtest: Any, err: Any) -> None:  # noqa: N802
        failed = err is not None and issubclass(err[0], test.failureException)
        outcome = "passed" if err is None else ("failed" if failed else "error")
        self._add_sub(test, subtest, outcome, err)


def _flatten(suite: unittest.TestSuite) -> list[unittest.TestCase]:
    out: list[unittest.TestCase] = []
    for item in suite:
        out += _flatten(item) if isinstance(item, unittest.TestSuite) else [item]
    return out


def import_module(path: Path, rel: str) -> Any:
    """Import a test file by its own name (as ``python file.py`` would find its siblings), its folder on the path."""
    sys.path.insert(0, str(path.parent))
    name = path.stem if path.stem not in sys.modules else "difflab_upstream_" + re.sub(r"\W", "_", rel)
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {rel}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def not_importable(rel: str, path: Path, failure: dict[str, Any]) -> list[dict[str, Any]]:
    """Every test the file declares, each failing with the import failure (one entry if none is seen)."""
    try:
        ids = declared_tests(path)[1]
    except (OSError, SyntaxError):
        ids = []
    return [
        {"id": f"{rel}::{tid}", "file": rel, "parts": [failure], "subtests": [], "duration_s": 0.0}
        for tid in ids or ["(import)"]
    ]


def run_unittest_file(rel: str, path: Path, where: Where) -> tuple[list[dict[str, Any]], set[str]]:
    try:
        module = import_module(path, rel)
    except BaseException as exc:  # noqa: BLE001 - an import failure is this file's result
        return not_importable(rel, path, part("error", "import", exc, where)), set()
    suite = unittest.defaultTestLoader.loadTestsFromModule(module)
    tests = _flatten(suite)
    result = Result(rel, where)
    suite.run(result)
    holders = {tid: r for tid, r in result.records.items() if tid.count("::") == 1}  # setUpClass, setUpModule
    for test in tests:  # a test never started (its class or module set-up failed) carries that failure
        if result.test_id(test) in result.records:
            continue
        for tid, holder in holders.items():
            scope = HOLDER.search(tid)
            if scope is None or scope["name"].rsplit(".", 1)[-1] in (type(test).__name__, module.__name__):
                result.record(test)["parts"] += [{**p, "phase": "setup"} for p in holder["parts"]]
                break
    records = [r for r in result.records.values() if r["id"].count("::") > 1 or not tests]
    if not records:
        records = [{"id": f"{rel}::(collect)", "file": rel, "subtests": [], "duration_s": 0.0, "parts": []}]
        records[0]["parts"].append(part("skipped", "collect", message="no unittest.TestCase tests in this file"))
    return records, result.unwrapped


Records = list[dict[str, Any]]


def run_pytest_files(
    root: Path, files: list[tuple[str, Path]], source_root: Path, pytest_path: str | None
) -> tuple[Records, set[str], str | None]:
    """Run the files under pytest in this process; ``(records, unwrapped, pytest version or None)``."""
    if pytest_path and pytest_path not in sys.path:
        sys.path.append(pytest_path)
    session = upstream_pytest.start(root, source_root)
    with tempfile.TemporaryDirectory(prefix="difflab-pytest-") as tmp:
        ini = Path(tmp) / "pytest.ini"
        ini.write_text("[pytest]\n")
        argv = ["pytest", "-p", upstream_pytest.__name__, "-p", "no:cacheprovider", "-q", "-c", str(ini)]
        argv += ["--rootdir", str(root), "--confcutdir", str(root), *(str(p) for _, p in files)]
        saved = sys.argv
        sys.argv = argv
        try:
            runpy.run_module("pytest", run_name="__main__", alter_sys=True)
        except SystemExit:
            pass
        except ImportError as exc:
            failure = part("error", "import", exc, Where(root, root / "test", source_root))
            failure["message"] = f"pytest is not available to run this pytest-style file: {failure['message']}"
            return [r for rel, p in files for r in not_importable(rel, p, failure)], set(), None
        finally:
            sys.argv = saved
    records = []
    for rel, path in files:
        mine = [t for t in session.tests.values() if t["file"] == rel]
        if rel in session.broken:
            mine = not_importable(rel, path, session.broken[rel])
        records += mine or not_importable(rel, path, part("error", "collect", message="pytest collected nothing"))
    version = getattr(sys.modules.get("pytest"), "__version__", None)
    return records, session.unwrapped, version


def run(request: dict[str, Any]) -> dict[str, Any]:
    source_root = Path(request["source_root"])
    records: list[dict[str, Any]] = []
    unwrapped: set[str] = set()
    styles: dict[str, str] = {}
    by_root: dict[str, list[tuple[str, Path]]] = {}
    for f in request["files"]:
        rel, path, root = f["id"], Path(f["path"]), Path(f["root"])
        if not path.is_file():
            missing = part("error", "import", message=f"{rel} not found under {root}")
            records += [{"id": f"{rel}::(file)", "file": rel, "parts": [missing], "subtests": [], "duration_s": 0.0}]
            continue
        try:
            styles[rel] = declared_tests(path)[0]
        except (OSError, SyntaxError, ValueError):
            styles[rel] = "unittest"  # its import then says what is wrong with it
        if styles[rel] == "pytest":
            by_root.setdefault(str(root), []).append((rel, path))
            continue
        found, unwrapped_here = run_unittest_file(rel, path, Where(path, root / "test", source_root))
        records += found
        unwrapped |= unwrapped_here
    pytest_version = None
    for root, files in by_root.items():
        found, unwrapped_here, pytest_version = run_pytest_files(
            Path(root), files, source_root, request.get("pytest_path")
        )
        records += found
        unwrapped |= unwrapped_here
    return {
        "tests": records,
        "styles": styles,
        "runner": {
            "python": sys.version.split()[0],
            "pytest": pytest_version,
            "retry_unwrapped": sorted(unwrapped),
        },
    }


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m difflab.probe.upstream_child REQUEST_JSON", file=sys.stderr)
        return 2
    sandbox.enter()  # the lab's secrets hidden before the first test file is imported
    request = json.loads(Path(argv[0]).read_text())
    stubs.install()
    write_atomic(Path(request["out"]), run(request))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # interpreter teardown with torch loaded costs seconds and proves nothing


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
