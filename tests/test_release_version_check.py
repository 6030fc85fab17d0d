"""A release's observations must import as the release their label names, or nothing is judged (exit 2).

:func:`difflab.workflows.observe.check_versions` on observations shaped as the runners write them: a
release side carries its label, file and sha256 in ``source``; a git side carries a commit, no label.
"""

from __future__ import annotations

import re

import pytest

from difflab.errors import SourceError
from difflab.observation import Observation
from difflab.workflows.observe import check_versions

WHEEL = "sglang-0.5.21-cp311-cp311-manylinux_2_34_x86_64.whl"


def release(version: str, imported: str | None, side: str = "head") -> Observation:
    source = {"kind": "release", "version": version, "file": WHEEL, "sha256": "96c0" * 16}
    return Observation("38935", "pr38935_prefill_door", side, source, "ok", fields={}, sglang_version=imported)


def git(imported: str) -> Observation:
    source = {"kind": "git", "repo": "https://github.com/sgl-project/sglang", "commit": "8f3d" * 10, "tree": "ab" * 20}
    return Observation("38935", "pr38935_prefill_door", "head", source, "ok", fields={}, sglang_version=imported)


def test_releases_that_import_as_their_label_pass_beside_git_sides_and_errors() -> None:
    check_versions([git("0.5.22.dev0"), release("0.5.21", None, "base"), release("0.5.21", "0.5.21")])
    check_versions([release("0.5.21", "0.5.21.0")])  # the same version, written differently


def test_a_release_that_imports_as_another_version_is_refused_after_sides_it_skipped() -> None:
    """The git side and the errored side (no version) come first: every observation is checked, not up to a skip."""
    observed = [git("0.5.22.dev0"), release("0.5.21", None, "base"), release("0.5.21", "0.5.20")]
    message = (
        f"release 0.5.21 ({WHEEL}): its sglang imports as version 0.5.20, not 0.5.21; fix the lock or matrix entry"
    )
    with pytest.raises(SourceError, match=f"^{re.escape(message)}$"):
        check_versions(observed)


def test_an_imported_version_that_is_no_version_at_all_is_refused() -> None:
    with pytest.raises(SourceError, match="its sglang imports as version not a version, not 0.5.21"):
        check_versions([release("0.5.21", "not a version")])
