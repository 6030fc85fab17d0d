"""A fix added the way docs/probes.md says needs no edit outside ``probes/``, ``matrices/`` and docs.

The worked example's files are taken from docs/probes.md itself (each block follows a
``<!-- scratch-fix: PATH -->`` line: a new file under ``probes/``, or text appended to a file
under ``matrices/``), added to a copy of the lab, and the suite's inventory checks (every test
marked ``inventory``: the matrix loads, the release map lists every fix, probe files, hunks,
families, the CI cells, throughput probes) run on that copy, reading its probes and matrices.
They pass with the scratch fix in; without its line in the release map they fail and name it,
so the checks do look at the new fix.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from difflab.matrix import load_matrix

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "probes.md"
COPIED = ("src", "probes", "matrices", "tests", "ci", ".github", "docs", "pyproject.toml", "setup.py", "noxfile.py")
ALLOWED = ("probes/", "matrices/")
_BLOCK = re.compile(r"<!-- scratch-fix: (?P<path>\S+) -->\n```\w*\n(?P<text>.*?)\n```", re.S)

pytestmark = pytest.mark.xdist_group("scratch-fix")


def guide_blocks() -> list[tuple[str, str]]:
    """(path, text) of every scratch-fix block in docs/probes.md, in order."""
    return [(m["path"], m["text"] + "\n") for m in _BLOCK.finditer(GUIDE.read_text())]


def lab_copy(dest: Path) -> Path:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache")
    for name in COPIED:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=ignore)
        elif src.is_file():
            shutil.copy2(src, dest / name)
    return dest


def add_scratch_fix(root: Path, blocks: list[tuple[str, str]]) -> None:
    for rel, text in blocks:
        assert rel.startswith(ALLOWED), f"docs/probes.md asks for an edit outside probes/ and matrices/: {rel}"
        target = root / rel
        if rel.startswith("probes/"):
            assert not target.exists(), f"{rel}: the example must be a new probe"
            target.write_text(text)
        else:
            assert target.is_file(), f"{rel}: the example appends to an existing matrix file"
            target.write_text(target.read_text().rstrip("\n") + "\n\n" + text)


def inventory(root: Path) -> subprocess.CompletedProcess[str]:
    """The inventory checks of the copy, on the copy's own package, probes and matrices."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DIFFLAB_PROBES", "PYTEST_", "COV_"))}
    env["PYTHONPATH"] = str(root / "src")
    own = Path(__file__).name
    files = sorted(
        p.name for p in (root / "tests").glob("test_*.py") if p.name != own and "pytest.mark.inventory" in p.read_text()
    )
    argv = [sys.executable, "-m", "pytest", "-m", "inventory", "-q", "-p", "no:cacheprovider", "-p", "no:randomly"]
    argv += [f"tests/{name}" for name in files]
    return subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True, timeout=600, check=False)


@pytest.fixture(scope="module")
def blocks() -> list[tuple[str, str]]:
    found = guide_blocks()
    assert [p for p, _ in found] == [
        "probes/pr38935_example_door.py",
        "matrices/upstream.toml",
        "matrices/release-map.toml",
    ], "docs/probes.md's worked example: the probe, its matrix entry, its release-map line"
    return found


def test_the_guides_example_is_a_whole_fix_the_inventory_accepts(tmp_path: Path, blocks) -> None:
    root = lab_copy(tmp_path / "lab")
    add_scratch_fix(root, blocks)
    matrix = load_matrix(root / "matrices" / "upstream.toml")
    added = [f for f in matrix.fixes if f.id == "example-door"]
    assert added and added[0].probes[0].name == "pr38935_example_door" and added[0].hunks
    done = inventory(root)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    passed = re.search(r"(\d+) passed", done.stdout)
    assert passed and int(passed[1]) >= 10, done.stdout[-2000:]  # the inventory tests ran, on the copy


def test_the_inventory_fails_on_a_scratch_fix_missing_from_the_release_map(tmp_path: Path, blocks) -> None:
    root = lab_copy(tmp_path / "lab")
    add_scratch_fix(root, [b for b in blocks if b[0] != "matrices/release-map.toml"])
    done = inventory(root)
    assert done.returncode == 1, done.stdout[-4000:]
    assert "example-door" in done.stdout and "release-map.toml" in done.stdout, done.stdout[-4000:]
