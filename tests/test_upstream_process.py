"""The test child's processes as the replay starts them: real child processes, read back from what they leave.

A bare virtual environment (no pytest, no lab) stands in for the shared environment, so a
pytest-style file runs only if the lab's staged pytest reaches the child; the stand-in ``sglang``
needs nothing else. Each test waits for every process it starts (a hung one is killed by the
product's own timeout, and its id checked gone).
"""

from __future__ import annotations

import importlib.metadata as metadata
import os
import re
import subprocess
import time
import venv
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import upstream_fakes as fakes
from difflab.upstream_tests import process
from difflab.upstream_tests.files import TestFile, Tree, locate
from difflab.upstream_tests.process import Job, plan, run_jobs
from difflab.upstream_tests.staging import closure, digest

Y = fakes.Y
HUNG = f"{fakes.FOLDER}/test_hangs.py"
SECOND = f"{fakes.FOLDER}/test_second.py"
HANGS = """import os
import sys
import time

print("waiting", os.getpid(), flush=True)
sys.stdout.buffer.write(b"not text: \\xff\\n")
sys.stdout.flush()
time.sleep(30)  # far longer than its timeout
"""
HANGS_ON_STDERR = """import os
import sys
import time

print("waiting", os.getpid(), "on stderr", file=sys.stderr, flush=True)
time.sleep(30)
"""
STEP = """import os
import sys
import time
import unittest
from pathlib import Path

print("bytecode in", os.environ["PYTHONPYCACHEPREFIX"], file=sys.{stream}, flush=True)
LOG = Path({log!r})
with LOG.open("a") as f:
    f.write("start {label}\\n")
time.sleep(0.5)  # long enough for a second process, had one been started beside this one, to start too
with LOG.open("a") as f:
    f.write("end {label}\\n")


class TestStep(unittest.TestCase):
    def test_step(self):
        pass
"""


@dataclass
class BarePython:
    """A shared environment without pytest: the lab's interpreter in a virtual environment of its own."""

    cache: Path
    python: Path
    progress: list[Callable[[str], None] | None] = field(default_factory=list)

    def ensure(self, progress: Callable[[str], None] | None = None) -> BarePython:
        self.progress.append(progress)
        return self


@pytest.fixture(scope="module")
def bare(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The environment's interpreter; its cache (the staged pytest, kept between tests) is beside it."""
    root = tmp_path_factory.mktemp("bare")
    venv.EnvBuilder(with_pip=False, symlinks=True).create(root / "env")
    python = root / "env" / "bin" / "python"
    found = subprocess.run([str(python), "-s", "-c", "import pytest"], capture_output=True, text=True)
    assert found.returncode == 1 and "No module named 'pytest'" in found.stderr, "the environment must lack pytest"
    return python


def _file(root: Path, rel: str, text: str) -> TestFile:
    found = locate(rel, [Tree(fakes.write(root, {rel: fakes.HEADER + text}), "the tests folder")])
    assert found is not None
    return found


def _outcomes(job: Job) -> dict[str, list[str]]:
    return {t["id"]: [p["outcome"] for p in t["parts"]] for t in job.tests}


def test_a_pytest_style_file_runs_under_the_lab_s_staged_pytest_in_an_environment_without_one(
    tmp_path: Path, bare: Path
) -> None:
    head = fakes.fake_source(tmp_path / "head", "head", fixed=True)
    tests = fakes.write(tmp_path / "tests", {Y: fakes.PYTEST_FILE})
    file = locate(Y, [Tree(tests, "the tests folder")])
    assert file is not None
    env = BarePython(bare.parents[2] / "cache", bare)
    said: list[str] = []
    (job,) = run_jobs(plan([(head, file)]), env, said.append)  # type: ignore[arg-type]
    assert (job.status, job.error) == ("ok", None), job.log
    assert _outcomes(job) == {
        f"{Y}::test_rejected_is_not_enqueued": ["passed"],
        f"{Y}::test_holding_a_slot_is_enqueued[0]": ["passed"],
        f"{Y}::test_holding_a_slot_is_enqueued[4]": ["passed"],
    }
    assert job.records(Y) == job.tests and job.runner["pytest"] == metadata.version("pytest")
    assert env.progress == [said.append], "the environment's own progress is said the same way"
    staged = env.cache / "childlib-pytest" / digest(closure())[:16]
    assert (staged / "pytest" / "__init__.py").is_file(), "staged in the environment's own cache"
    assert len(said) == 1 and said[0].startswith("upstream tests on head: 3 test(s) in ")


def test_a_hung_test_process_is_killed_after_its_timeout_with_what_it_wrote(
    tmp_path: Path, bare: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The timeout grows with the files the process runs: 3 s, and 1.5 s for each of the two here.

    Generous: a loaded machine starts Python slowly, and what it printed before the kill is checked.
    One process writes to its output only, the other to its error stream only; both run at once.
    """
    monkeypatch.setattr(process, "BASE_TIMEOUT_S", 3.0)
    monkeypatch.setattr(process, "PER_FILE_S", 1.5)
    jobs: list[Job] = []
    for label, text in (("out", HANGS), ("err", HANGS_ON_STDERR)):
        src = fakes.fake_source(tmp_path / label, label, fixed=True)
        tests = tmp_path / f"tests-{label}"
        jobs += plan([(src, f) for f in (_file(tests, HUNG, text), _file(tests, SECOND, "import unittest\n"))])
    env = BarePython(bare.parents[2] / "cache", bare)
    started = time.perf_counter()
    done = run_jobs(jobs, env, workers=2)  # type: ignore[arg-type]
    took = time.perf_counter() - started
    assert [(j.source.label, j.status, j.error, j.tests) for j in done] == [
        (label, "error", "upstream tests hung: killed after 6 s", []) for label in ("out", "err")
    ]
    out = re.fullmatch(r"waiting (\d+)\nnot text: \ufffd\n", done[0].log)
    err = re.fullmatch(r"waiting (\d+) on stderr\n", done[1].log)
    assert out is not None and err is not None, f"their own output, as text: {[j.log for j in done]!r}"
    for pid in (out[1], err[1]):
        with pytest.raises(ProcessLookupError):
            os.kill(int(pid), 0)  # killed and waited for: nothing left behind
    assert all(6.0 <= j.duration_s <= took for j in done), "each ran until it was killed, and no longer than the call"


def test_with_one_worker_the_processes_run_one_after_the_other(tmp_path: Path, bare: Path) -> None:
    log = tmp_path / "order.log"
    jobs: list[Job] = []
    for label, stream in (("base", "stdout"), ("head", "stderr")):
        src = fakes.fake_source(tmp_path / label, label, fixed=label == "head")
        text = STEP.format(log=str(log), label=label, stream=stream)
        jobs += plan([(src, _file(tmp_path / f"tests-{label}", SECOND, text))])
    env = BarePython(bare.parents[2] / "cache", bare)
    done = run_jobs(jobs, env, None, workers=1)  # type: ignore[arg-type]
    passed = {f"{SECOND}::TestStep::test_step": ["passed"]}
    assert [(j.source.label, j.status, j.error, _outcomes(j), j.log) for j in done] == [
        # the bytecode of each build under the environment's cache; one stream or the other
        (label, "ok", None, passed, f"bytecode in {env.cache / 'pycache'}{tmp_path / label}\n")
        for label in ("base", "head")
    ]
    assert log.read_text().splitlines() == ["start base", "end base", "start head", "end head"]
    assert all(j.duration_s >= 0.5 for j in done), "each ran at least its own file"


def test_a_test_process_that_exits_without_a_result_is_an_error_with_its_exit_code(tmp_path: Path, bare: Path) -> None:
    src = fakes.fake_source(tmp_path / "src", "src", fixed=True)
    leaves = "import os\nimport sys\n\nprint('Fatal Python error: Aborted', file=sys.stderr, flush=True)\nos._exit(7)\n"
    (job,) = run_jobs(
        plan([(src, _file(tmp_path / "tests", SECOND, leaves))]), BarePython(bare.parents[2] / "cache", bare)
    )  # type: ignore[arg-type]
    assert (job.status, job.error, job.tests, job.log) == (
        "error",
        "test process died (exit 7)\nFatal Python error: Aborted",
        [],
        "Fatal Python error: Aborted\n",
    )
