"""A fixed sample of mutants of the judging core must each be killed by the tests named for it.

Each example in ``mutation_examples.toml`` is applied to a copy of the package, and the named tests run
against the copy in a child process: they must fail. The nightly ``nox -s mutation`` pass measures the
whole score; this sample keeps a collapse of it from going unnoticed between two nightly runs.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "difflab"
EXAMPLES = tomllib.loads((Path(__file__).with_name("mutation_examples.toml")).read_text(encoding="utf-8"))["example"]


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:60]


def package_copy(tmp_path: Path) -> Path:
    """``<tmp>/src/difflab`` plus the checkout folders the package finds beside itself; ``probes/`` is a
    copy too (the harness has examples), the rest are links."""
    src = tmp_path / "src"
    shutil.copytree(PACKAGE, src / "difflab", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "probes", tmp_path / "probes", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("matrices", "results"):
        (tmp_path / name).symlink_to(ROOT / name)
    return src


def example_file(src: Path, module: str) -> Path:
    """``module`` is a path in the package (``diff/verdict.py``), or in the checkout for the probes'
    harness (``probes/harness/construction.py``)."""
    return src.parent / module if module.startswith("probes/") else src / "difflab" / module


def run_tests(src: Path, tests: list[str]) -> subprocess.CompletedProcess[str]:
    # no third-party plugins in the child: the named tests need none, and loading them is most of its start-up
    env = {**os.environ, "PYTHONPATH": str(src), "PYTHONDONTWRITEBYTECODE": "1", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    argv = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *tests]
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_the_copy_is_what_the_child_imports_and_it_passes_unmutated(tmp_path: Path) -> None:
    src = package_copy(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(src)}
    probe = subprocess.run(
        [sys.executable, "-c", "import difflab; print(difflab.__file__)"], env=env, capture_output=True, text=True
    )
    assert probe.stdout.strip() == str(src / "difflab" / "__init__.py")
    done = run_tests(src, ["tests/test_verdict_rules.py::test_a_fix_takes_its_worst_probe"])
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


def test_every_example_names_existing_tests() -> None:
    assert len(EXAMPLES) >= 30
    for example in EXAMPLES:
        assert set(example) == {"what", "module", "find", "replace", "tests"}, example
        for test in example["tests"]:
            path, _, name = test.partition("::")
            assert re.search(rf"^def {re.escape(name)}\(", (ROOT / path).read_text(), re.M), test


@pytest.mark.parametrize("example", EXAMPLES, ids=[slug(e["what"]) for e in EXAMPLES])
def test_the_example_mutant_is_killed(tmp_path: Path, example: dict) -> None:
    src = package_copy(tmp_path)
    module = example_file(src, example["module"])
    text = module.read_text(encoding="utf-8")
    hits = text.count(example["find"])
    assert hits == 1, (
        f"stale example {example['what']!r}: its text occurs {hits} times in {example['module']}; "
        "update tests/mutation_examples.toml to the same edit of the current code"
    )
    module.write_text(text.replace(example["find"], example["replace"]), encoding="utf-8")
    done = run_tests(src, example["tests"])
    output = done.stdout + done.stderr
    assert done.returncode == 1 and " failed" in output, (
        f"mutant survived: {example['what']} ({example['module']}); {example['tests']} passed against it\n"
        + output[-3000:]
    )
