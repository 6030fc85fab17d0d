"""``mutmut``, with the probe harness named the way the probes import it, and mutants a probe process
can import.

Named: a probe runs with ``probes/`` on its ``sys.path`` and imports ``harness.construction``, so that is the
``__module__`` of every function in it. mutmut names a mutant by its file's path (only a leading
``src/`` is dropped): ``probes.harness.construction.x_...``. Its trampoline calls a mutant only when the
two names agree, so without this every harness mutant would run the original code and read as
"no tests". This drops the leading ``probes/`` too.

Importable: a mutated module starts by importing mutmut's trampoline. A probe process runs in the
shared SGLang environment, with only the lab's staged ``difflab.probe`` and the probes on its path
(:mod:`difflab.runner.box`), so a mutated ``difflab/probe/kit.py`` or harness module would fail there
with ``No module named 'mutmut'`` -- and every test that runs a probe would fail with it, whatever the
mutant. Where mutmut is missing, the header below leaves each function as written: the original code,
which is what mutmut's own trampoline runs there anyway (the probe's environment is built from an
allow-list, so no mutant is ever named in it). Nothing else changes; the arguments are ``mutmut``'s
own (``python ci/mutmut_run.py run "harness.construction.*"``).

Fresh: mutmut copies ``tests/`` into ``mutants/`` once; before each run the files changed since are copied
again (:func:`refresh_tests`), so mutants named again after a test was written meet that test.
"""

from __future__ import annotations

import atexit
import os
import resource
import shutil
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import libcst
import mutmut.__main__ as main
import mutmut.mutation.file_mutation as file_mutation
import mutmut.mutation.trampoline as trampoline
import mutmut.runners.harness as harness
import mutmut.utils.format_utils as format_utils
import mutmut.workers.isolation as isolation
import pytest
from mutmut.state import state

IMPORT_ROOTS = ("probes",)
"""Folders whose children are imported as top-level names (a probe's ``sys.path`` holds them)."""

_path_name = format_utils.get_mutant_name


def mutant_name(relative_source_path: Path, mutant_method_name: str) -> str:
    path = Path(relative_source_path)
    if len(path.parts) > 1 and path.parts[0] in IMPORT_ROOTS:
        path = Path(*path.parts[1:])
    return _path_name(path, mutant_method_name)


HEADER = """
try:
    from mutmut.mutation.trampoline import wrap_in_trampoline as _mutmut_mutated, MutantDict
except ModuleNotFoundError:  # a probe process: no mutmut, and no mutant named either
    MutantDict = dict

    def _mutmut_mutated(mutants_dict, is_classmethod=False):
        return lambda func: func
"""
"""What heads every mutated module, in place of mutmut's bare import of its trampoline."""

for _module in (format_utils, file_mutation, main):
    _module.get_mutant_name = mutant_name  # each imported the function by name
_header = list(libcst.parse_module(HEADER).body)
file_mutation.trampoline_impl_cst = [*_header[:-1], _header[-1].with_changes(leading_lines=[libcst.EmptyLine()] * 2)]


class ForkedHits:
    """What a test reached in a process it forked, counted as that test's.

    mutmut learns which tests reach a function from the calls its stats run records in *its* process.
    A test that forks (``tests/test_process_rules.py`` runs each supervisor test in a fork of its own,
    and a supervisor forks the probe) makes those calls in the fork, whose record is lost when it
    exits: every mutant of ``supervise``, ``exited`` or ``end_strays`` then reads "no tests" and is
    never run, though the tests would kill it (the mutant runs fine in a fork: it is named by the
    environment the fork inherits). Here a call recorded in another process is also appended to a
    file, and the stats run folds the file into the test's record before mutmut reads it.
    """

    def __init__(self) -> None:
        fd, name = tempfile.mkstemp(prefix="mutmut-forked-hits-")
        os.close(fd)
        self.path = Path(name)
        self.pid = os.getpid()
        self._record = trampoline.record_trampoline_hit
        owner = os.getpid()
        atexit.register(lambda: os.getpid() == owner and self.path.unlink(missing_ok=True))  # not a worker's exit

    def record(self, name: str, caller: str | None = None) -> None:
        if os.getpid() != self.pid:  # O_APPEND: one line per write, whole, from any number of forks
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
            try:
                os.write(fd, f"{name}\n".encode())
            finally:
                os.close(fd)
        self._record(name, caller)

    def pytest_sessionstart(self, session: Any) -> None:
        self.pid = os.getpid()  # the process that runs the stats' tests, wherever mutmut started it

    @pytest.hookimpl(tryfirst=True)  # before mutmut's collector reads and clears the test's record
    def pytest_runtest_teardown(self, item: Any, nextitem: Any) -> None:
        hits = self.path.read_text().split()
        self.path.write_text("")
        state()._stats.update(hits)

    def install(self) -> None:
        trampoline.record_trampoline_hit = self.record  # the trampoline imported it by name
        execute = harness.PytestRunner.execute_pytest

        def execute_pytest(runner: harness.PytestRunner, params: list[str], **kwargs: Any) -> int:
            if kwargs.get("plugins"):  # the stats run and the test listing bring collectors; a mutant's run none
                kwargs["plugins"] = [*kwargs["plugins"], self]
            return execute(runner, params, **kwargs)

        harness.PytestRunner.execute_pytest = execute_pytest


def no_cpu_limit(which: int, limits: tuple[int, int]) -> None:
    """mutmut's worker limits, less its CPU-time limit: the wall-clock limit it sets beside it still ends a hang.

    An armed CPU-time limit makes this process's CPU clock tick-grained on Linux: a span of a few
    milliseconds reads 0 CPU seconds. The throughput bench samples CPU time per item, so under the
    limit every sample is 0, the A/B tests in ``tests/test_workflow_exits.py`` fail *whatever the
    mutant*, and every mutant those tests reach (all of ``matrix.load``, for one) reads "killed".
    The allowlisted equivalent mutants that came back "killed" showed it.
    """
    if which != resource.RLIMIT_CPU:
        resource.setrlimit(which, limits)


def refresh_tests(root: Path = Path("tests"), copy: Path = Path("mutants") / "tests") -> list[str]:
    """Bring mutmut's copy of the tests up to date: the files added or changed since it copied them.

    mutmut copies the tests into ``mutants/`` once and never again; a later ``run`` (a few mutants named
    again after a new test was written) would run the old copy and miss the new test. The tests are never
    mutated, so the checkout's files are what the copy must hold.
    """
    if not copy.is_dir():
        return []  # a fresh pass: mutmut copies everything itself
    changed = []
    for path in sorted(root.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            target = copy / path.relative_to(root)
            if not target.is_file() or target.read_bytes() != path.read_bytes():
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, target)
                changed.append(str(path))
    return changed


if __name__ == "__main__":
    for name in refresh_tests():
        print(f"mutants/: {name} refreshed", file=sys.stderr)
    isolation.resource = SimpleNamespace(**{**vars(resource), "setrlimit": no_cpu_limit})
    ForkedHits().install()
    sys.argv[0] = "mutmut"
    sys.exit(main.cli())
