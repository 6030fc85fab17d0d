"""Matrix validation: good files load, and every bad input names file, fix and field."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from difflab.errors import ConfigError
from difflab.matrix import load_matrix
from difflab.matrix.gpu import load_gpu_plans
from difflab.paths import default_matrix
from matrix_samples import FIX, RELEASES


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "m.toml"
    path.write_text(text)
    return path


@pytest.mark.inventory
def test_default_matrix_records_what_public_material_confirms() -> None:
    """Facts about named fixes; which fixes the matrix lists is tests/test_default_matrix.py's (from the matrix)."""
    m = load_matrix(default_matrix())
    parts = {f.id: f for f in m.fixes}
    assert parts["43719b"].head.unavailable and "no release" in parts["43719b"].head.unavailable
    assert parts["43719a"].head.release == "0.5.22"
    assert parts["38935"].commits["head"].confirmed is True
    assert parts["38935"].commits["base"].confirmed is False
    assert len(m.releases) == 5 and all(len(r.sha256) == 64 for r in m.releases.values())


def test_valid_matrix_loads(tmp_path: Path) -> None:
    m = load_matrix(write(tmp_path, RELEASES + FIX))
    (fix,) = m.fixes
    assert fix.probes[0].expect == {"rejected.enqueued": (True, False)}
    assert fix.probes[0].controls == {"valid.enqueued": True}
    assert m.select(["#38935"]) == [fix]


@pytest.mark.parametrize(
    ("mutate", "pattern"),
    [
        (lambda t: t.replace("pr = 38935", 'pr = "x"'), r"fix '38935'\.pr"),
        (
            lambda t: t.replace('head = { release = "0.5.21" }', 'head = { release = "9.9.9" }'),
            r"fix '38935'\.head\.release: release '9\.9\.9' is not pinned",
        ),
        (
            lambda t: t.replace('"rejected.enqueued" = [true, false]', '"rejected.enqueued" = [true]'),
            r"fix '38935'\.probes\[0\]\.expect\.'rejected\.enqueued'",
        ),
        (
            lambda t: t.replace('"rejected.enqueued" = [true, false]', '"rejected.enqueued" = [true, true]'),
            r"that is a control",
        ),
        (lambda t: t.replace('sha256 = "1573', 'sha256 = "XX73'), r"releases\.'0\.5\.20'\.sha256"),
        (lambda t: t.replace('title = "t"', 'title = "t"\nbogus = 1'), r"fix '38935': unknown field\(s\) \['bogus'\]"),
        (lambda t: t.replace('base = { release = "0.5.20" }', ""), r"fix '38935'\.base: missing"),
        (
            lambda t: t.replace('head = { release = "0.5.21" }', 'head = { release = "0.5.21", commit = "abcdef1" }'),
            r"fix '38935'\.head: give exactly one",
        ),
        (lambda t: t.replace("schema = 1", "schema = 7"), r"schema"),
        (
            lambda t: t + "[[fixes.mutations]]\nname='m'\nfile='sglang/a.py'\nfind='x'\nreplace=''\ntargets=['nope']\n",
            r"fix '38935'\.mutations\[0\]\.targets: 'nope' is not one of this fix's probes",
        ),
        (
            lambda t: (
                t + "[[fixes.mutations]]\nname='m'\nfile='../a.py'\nfind='x'\nreplace=''\n"
                "targets=['pr38935_prefill_door']\n"
            ),
            r"mutations\[0\]\.file",
        ),
    ],
)
def test_bad_matrix_names_file_fix_and_field(tmp_path: Path, mutate, pattern: str) -> None:
    path = write(tmp_path, mutate(RELEASES + FIX))
    with pytest.raises(ConfigError) as err:
        load_matrix(path)
    message = str(err.value)
    assert str(path) in message
    assert re.search(pattern, message), message


def test_not_toml_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_matrix(write(tmp_path, "schema = = 1"))
    with pytest.raises(ConfigError, match="cannot read matrix"):
        load_matrix(tmp_path / "absent.toml")


def test_unknown_fix_is_named(tmp_path: Path) -> None:
    m = load_matrix(write(tmp_path, RELEASES + FIX))
    with pytest.raises(ConfigError, match=r"unknown fix '99999'.*known: 38935"):
        m.select(["99999"])


def test_an_exact_id_wins_over_the_pr_number_and_a_pr_number_names_every_part(tmp_path: Path) -> None:
    """``--fix 38935`` is that fix alone though a counterpart shares its PR; a PR without such an id names all."""
    counterpart = FIX.replace('id = "38935"', 'id = "38935-mori"')
    part_a = FIX.replace('id = "38935"', 'id = "38935a"')
    m = load_matrix(write(tmp_path, RELEASES + FIX + counterpart))
    assert [f.id for f in m.select(["38935"])] == ["38935"]
    assert [f.id for f in m.select(["#38935-mori"])] == ["38935-mori"]
    parts = load_matrix(write(tmp_path, RELEASES + part_a + counterpart))
    assert [f.id for f in parts.select(["38935"])] == ["38935a", "38935-mori"]


def test_duplicate_fix_ids(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"duplicate fix id\(s\) \['38935'\]"):
        load_matrix(write(tmp_path, RELEASES + FIX + FIX))


@pytest.mark.inventory
def test_default_matrix_carries_the_gpu_plans() -> None:
    matrix = load_matrix(default_matrix())
    plans = load_gpu_plans(matrix)
    assert {"36988", "38935", "41404"} <= set(plans) <= {f.id for f in matrix.fixes}
    assert [p.name for p in plans["38935"].probes] == ["gpu_oversized_prompt", "gpu_canary_leak"]
    assert plans["41404"].throughput and not plans["36988"].throughput
    assert plans["36988"].probes[0].expect == {"abort.prefill_kv_back_to_baseline": (False, True)}


@pytest.mark.parametrize(
    ("gpu", "pattern"),
    [
        ('[[gpu."99999".probes]]\nname = "gpu_abort_storm"\nexpect = { "a.b" = [false, true] }\n', "no fix '99999'"),
        (
            '[gpu."38935"]\nthroughput = "yes"\n[[gpu."38935".probes]]\nname = "x"\nexpect = { "a.b" = [1, 2] }\n',
            r"gpu\.'38935'\.throughput: expected true or false",
        ),
        ('[gpu."38935"]\nthroughput = true\n', r"gpu\.'38935'\.probes: expected at least one"),
        ('[[gpu."38935".probes]]\nname = "x"\nexpect = { "a.b" = [1, 1] }\n', "that is a control"),
    ],
)
def test_bad_gpu_table_names_file_fix_and_field(tmp_path: Path, gpu: str, pattern: str) -> None:
    path = write(tmp_path, RELEASES + FIX + gpu)
    with pytest.raises(ConfigError, match=re.escape(str(path)) + ".*" + pattern):
        load_gpu_plans(load_matrix(path))
