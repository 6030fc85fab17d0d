"""The default matrix's inventory: every fix is whole, and the release map is written out once, here.

``matrices/release-map.toml`` says which pinned release first carries each fix (and, per
transport back end, from which release its machinery exists). These checks hold for every fix
the matrix lists, read from the matrix itself: a new fix is checked by adding its probe, its
``[[fixes]]`` entry and its line in the map, with no edit here. ``tests/test_scratch_fix.py``
runs this file (every test marked ``inventory``) on a copy with a scratch fix added.

The slow tier checks the same map against ``difflab contains --all`` on the real releases
(``tests/test_release_probes.py``).
"""

from __future__ import annotations

import ast

import pytest
from packaging.version import Version

from difflab.matrix import Matrix
from difflab.paths import probes_dir
from difflab.runner.jobs import check_probe_files
from release_map import load_release_map

pytestmark = pytest.mark.inventory


@pytest.fixture(scope="module")
def release_map():
    return load_release_map()


def test_the_release_map_lists_exactly_the_matrix_fixes(matrix: Matrix, release_map) -> None:
    assert list(release_map) == [f.id for f in matrix.fixes], "matrices/release-map.toml: one entry per fix, in order"


def test_each_fix_is_first_carried_by_its_head_release(matrix: Matrix, release_map) -> None:
    """The matrix's head pin and the map agree: a release head is the first release carrying the fix."""
    oldest = min(matrix.releases, key=Version)
    for fix in matrix.fixes:
        first = release_map[fix.id].first
        if release_map[fix.id].older:  # predates every pin: no base to show the bug, the oldest pin as head
            assert fix.base.unavailable and fix.head.release == oldest, (fix.id, fix.base, fix.head)
            continue
        assert fix.base.release or fix.base.commit, fix.id
        if fix.head.release:
            assert first == fix.head.release, (fix.id, first, fix.head.release)
            assert Version(fix.base.release or "0") < Version(first), (fix.id, "base before head")
        else:
            assert first is None, (fix.id, "a fix no pinned release carries declares a git head or unavailable")
            assert fix.head.commit or fix.head.unavailable, fix.id
        if first is not None:
            assert first in matrix.releases, (fix.id, first)


def test_each_fix_names_its_back_ends_in_the_map(matrix: Matrix, release_map) -> None:
    for fix in matrix.fixes:
        declared = list(dict.fromkeys(b for p in fix.probes for b in p.backends))
        since = release_map[fix.id].backends
        assert sorted(since) == sorted(declared), (fix.id, since, declared)
        assert all(v in matrix.releases for v in since.values()), (fix.id, since)


def test_every_probe_file_exists_and_defines_observe(matrix: Matrix) -> None:
    check_probe_files(list(matrix.fixes), matrix.path)
    for fix in matrix.fixes:
        for spec in fix.probes:
            tree = ast.parse((probes_dir() / f"{spec.name}.py").read_text())
            names = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
            assert "observe" in names, (fix.id, spec.name)
        if fix.throughput:
            tree = ast.parse((probes_dir() / "throughput" / f"{fix.throughput}.py").read_text())
            assert "workloads" in {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}, fix.id


def test_every_fix_a_release_can_show_has_hunks_and_reverting_mutations(matrix: Matrix) -> None:
    """selfcheck's hunk coverage needs ``[[fixes.hunks]]``; the loader makes each hunk name a mutation.

    A fix older than every pinned release (base unavailable) may have no probe yet: no release shows
    its bug, and the family report names it as not checked by behaviour.
    """
    for fix in matrix.fixes:
        if fix.base.unavailable:
            continue
        assert fix.probes, fix.id
        if fix.head.release:
            assert fix.hunks, f"fix {fix.id}: declare its [[fixes.hunks]] (selfcheck requires them)"
            assert fix.mutations, fix.id
            reverted = {h for m in fix.mutations for h in m.hunks}
            assert {h.id for h in fix.hunks} <= reverted, fix.id


def test_every_family_member_is_a_fix_and_every_family_is_used(matrix: Matrix) -> None:
    ids = [f.id for f in matrix.fixes]
    for family in matrix.families.values():
        assert family.members and set(family.members) <= set(ids), family.name
        assert list(family.members) == [f.id for f in matrix.fixes if f.family == family.name]
