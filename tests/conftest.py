"""Shared fixtures.

Tests marked ``sglang`` run real probes on real SGLang releases: the first
run downloads the pinned wheels and builds the shared environment into the
cache (``$DIFFLAB_CACHE``); later runs reuse both. They are grouped on one
xdist worker (``xdist_group``) so the expensive fixtures are built once.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from difflab.matrix import load_matrix
from difflab.paths import default_matrix
from difflab.runner.kept_hub import IDLE_ENV

# No warm hub outlives the command that started it during a test run (a killed run leaves nothing
# behind); tests/test_kept_hub.py keeps hubs on purpose, for seconds, in folders of its own.
os.environ.setdefault(IDLE_ENV, "0")


@pytest.fixture(scope="session")
def matrix_path() -> Path:
    return default_matrix()


@pytest.fixture(scope="session")
def matrix(matrix_path: Path):
    return load_matrix(matrix_path)


MACHINERY_MATRIX = Path(__file__).resolve().parent / "fixtures" / "machinery" / "upstream.toml"


@pytest.fixture(scope="session")
def machinery_matrix():
    """A frozen matrix for tests of the judging machinery: its fixes' shapes do not move when the
    default matrix gains a fix, a probe or a back end (the default matrix's own tests read that)."""
    return load_matrix(MACHINERY_MATRIX)
