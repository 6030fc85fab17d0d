"""Families: declared in the matrix, judged per build, written beside the per-fix table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from difflab.diff.family import SAFE, judge_families
from difflab.errors import ConfigError
from difflab.matrix import load_matrix
from difflab.report.family import answer_lines, write_family
from matrix_samples import FIX, RELEASES

FAMILY = '\n[families.kv-safety]\ntitle = "KV safety"\n'


def _second(fix_id: str, family: str | None = "kv-safety") -> str:
    """Another fix shaped like the sample, in ``family``."""
    text = FIX.replace('id = "38935"', f'id = "{fix_id}"').replace('title = "t"', f'title = "t {fix_id}"')
    return text.replace('title = "t', f'family = "{family}"\ntitle = "t', 1) if family else text


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "m.toml"
    path.write_text(text)
    return path


def matrix_of(tmp_path: Path, *fixes: str, families: str = FAMILY):
    return load_matrix(write(tmp_path, RELEASES + families + "".join(fixes)))


def test_members_are_the_fixes_that_name_the_family_in_matrix_order(tmp_path: Path) -> None:
    m = matrix_of(tmp_path, _second("a"), _second("b", None), _second("c"))
    (family,) = m.families.values()
    assert (family.name, family.title, family.members) == ("kv-safety", "KV safety", ("a", "c"))
    assert m.fix("b").family is None and m.fix("a").family == "kv-safety"


def test_the_default_matrix_declares_its_family() -> None:
    from difflab.paths import default_matrix

    m = load_matrix(default_matrix())
    assert "kv-safety" in m.families
    assert set(m.families["kv-safety"].members) <= {f.id for f in m.fixes}


@pytest.mark.parametrize(
    ("families", "fixes", "message"),
    [
        (FAMILY, [_second("a", "kv-safty")], r"fix 'a'\.family: 'kv-safty' is not a declared \[families\] table"),
        (FAMILY + '[families.other]\ntitle = "x"\n', [_second("a")], r"families\.other: no fix names it"),
        ('\n[families.KV]\ntitle = "x"\n', [_second("a", "KV")], r"families\.KV: 'KV': use lowercase"),
        ('\n[families.kv-safety]\ntitle = "x"\nmembers = []\n', [_second("a")], r"unknown field\(s\) \['members'\]"),
        ("\n[families.kv-safety]\n", [_second("a")], r"families\.kv-safety\.title: expected a non-empty string"),
        ("", [_second("a")], r"known: none declared"),
    ],
)
def test_a_bad_family_is_refused_naming_file_and_field(tmp_path: Path, families, fixes, message) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        matrix_of(tmp_path, *fixes, families=families)
    assert str(tmp_path / "m.toml") in str(info.value)


def test_families_that_are_not_a_table_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"m\.toml: families: expected a table"):
        load_matrix(write(tmp_path, "families = 3\n" + RELEASES + _second("a", None)))


def test_safe_only_when_every_member_is_present(tmp_path: Path) -> None:
    m = matrix_of(tmp_path, _second("a"), _second("b"), _second("c"))
    builds = {
        "0.5.22": {"a": "present", "b": "present", "c": "present"},
        "0.5.21": {"a": "present", "b": "absent", "c": "partial"},
        "0.5.20": {"a": "error", "b": "not-applicable"},
    }
    (report,) = judge_families(m.families.values(), m.fixes, builds)
    lines = {b.build: b.line() for b in report.builds}
    assert lines["0.5.22"] == f"{SAFE} (3: #38935, #38935, #38935)"
    assert lines["0.5.21"] == "NOT safe: missing: #38935, #38935 (partial)"
    assert lines["0.5.20"] == "NOT safe: unknown: #38935, #38935 (not checked); n/a: #38935 (not-applicable)"
    assert [b.safe for b in report.builds] == [True, False, False]
    assert [m.standing for m in report.builds[2].members] == ["unknown", "n/a", "unknown"]


def _older(fix_id: str) -> str:
    """A member older than every pinned release: base unavailable with its reason, no probe."""
    text = _second(fix_id).split("[[fixes.probes]]", 1)[0]
    return text.replace('base = { release = "0.5.20" }', 'base = { unavailable = "0.5.19 already carries it" }')


def test_a_member_no_probe_judges_is_named_not_counted(tmp_path: Path) -> None:
    """Safe means safe from the members the lab checks; one it cannot check is named with the reason."""
    m = matrix_of(tmp_path, _second("a"), _older("old"))
    builds = {"0.5.22": {"a": "present", "old": "not-judged"}, "0.5.21": {"a": "absent", "old": "not-judged"}}
    (report,) = judge_families(m.families.values(), m.fixes, builds)
    lines = {b.build: b.line() for b in report.builds}
    unchecked = "not checked by behaviour: #38935 (0.5.19 already carries it)"
    assert lines["0.5.22"] == f"{SAFE} (1: #38935); {unchecked}"
    assert lines["0.5.21"] == f"NOT safe: missing: #38935; {unchecked}"
    assert [b.safe for b in report.builds] == [True, False]
    only = matrix_of(tmp_path, _older("old"))
    (alone,) = judge_families(only.families.values(), only.fixes, {"0.5.22": {"old": "not-judged"}})
    assert not alone.builds[0].safe  # nothing checked is never safe
    assert alone.builds[0].line() == f"NOT safe: no member is checked by behaviour; {unchecked}"


def test_a_family_none_of_whose_members_ran_is_not_reported(tmp_path: Path) -> None:
    m = matrix_of(tmp_path, _second("a"), _second("b", None))
    assert judge_families(m.families.values(), m.fixes, {"0.5.22": {"b": "present"}}) == []


class _Default:
    def describe(self) -> str:
        return "PD KV checksum (#39500): off"

    def to_dict(self) -> dict:
        return {"key": "kv-checksum", "protects": False}


def test_family_json_and_the_summary_lines(tmp_path: Path) -> None:
    m = matrix_of(tmp_path, _second("a"), _second("b"))
    folder = tmp_path / "run"
    folder.mkdir()
    lines = write_family(folder, m, {"fork abc": {"a": "present", "b": "absent"}}, {"fork abc": [_Default()]})
    doc = json.loads((folder / "family.json").read_text())
    (family,) = doc["families"]
    assert family["family"] == "kv-safety" and family["members"] == ["a", "b"]
    (build,) = family["builds"]
    assert (build["build"], build["safe"], build["line"]) == ("fork abc", False, "NOT safe: missing: #38935")
    assert doc["defaults"] == {"fork abc": [{"key": "kv-checksum", "protects": False}]}
    text = "\n".join(lines)
    assert "## Family `kv-safety`: KV safety" in text
    assert "| fork abc | ❌ NOT safe: missing: #38935 |" in text
    assert "- PD KV checksum (#39500): off" in text
    assert answer_lines(folder) == ["family kv-safety @ fork abc: NOT safe: missing: #38935"]  # what the CLI prints


def test_nothing_is_written_without_a_family_or_defaults(tmp_path: Path) -> None:
    m = load_matrix(write(tmp_path, RELEASES + FIX))
    assert write_family(tmp_path, m, {"0.5.21": {"38935": "present"}}) == []
    assert not (tmp_path / "family.json").exists() and answer_lines(tmp_path) == []


def test_each_build_gets_its_own_answer_and_family_json_without_defaults(tmp_path: Path) -> None:
    """A release that carries every member and a fork that lacks one: one line each, marked by its own answer."""
    m = matrix_of(tmp_path, _second("a"), _second("b"))
    per_build = {"0.5.21": {"a": "present", "b": "present"}, "fork abc": {"a": "present", "b": "absent"}}
    folder = tmp_path / "run"
    folder.mkdir()
    lines = write_family(folder, m, per_build)
    doc = json.loads((folder / "family.json").read_text())  # written with no defaults read
    assert doc["schema"] == 1 and doc["defaults"] == {}
    (report,) = judge_families(m.families.values(), m.fixes, per_build)
    safe, unsafe = report.builds
    assert (safe.safe, unsafe.safe) == (True, False) and safe.line() != unsafe.line()
    assert [b["line"] for b in doc["families"][0]["builds"]] == [safe.line(), unsafe.line()]
    assert lines == [
        "",
        "## Family `kv-safety`: KV safety",
        "",
        "| build | answer |",
        "|---|---|",
        f"| 0.5.21 | ✅ {safe.line()} |",
        f"| fork abc | ❌ {unsafe.line()} |",
    ]
    assert answer_lines(folder) == [
        f"family kv-safety @ 0.5.21: {safe.line()}",
        f"family kv-safety @ fork abc: {unsafe.line()}",
    ]


def test_every_family_gets_its_section(tmp_path: Path) -> None:
    families = FAMILY + '\n[families.pd-abort]\ntitle = "PD abort"\n'
    m = matrix_of(tmp_path, _second("a"), _second("b", "pd-abort"), families=families)
    lines = write_family(tmp_path, m, {"0.5.21": {"a": "present", "b": "absent"}})
    assert [line for line in lines if line.startswith("## ")] == [
        "## Family `kv-safety`: KV safety",
        "## Family `pd-abort`: PD abort",
    ]
    assert [f["family"] for f in json.loads((tmp_path / "family.json").read_text())["families"]] == [
        "kv-safety",
        "pd-abort",
    ]


def test_defaults_alone_are_written_with_a_section_per_build(tmp_path: Path) -> None:
    m = load_matrix(write(tmp_path, RELEASES + FIX))
    lines = write_family(tmp_path, m, {"0.5.21": {"38935": "present"}}, {"0.5.21": [_Default()], "fork": []})
    assert lines == [
        "",
        "### Configuration-only defences: 0.5.21's defaults",
        "",
        "- PD KV checksum (#39500): off",
        "",
        "### Configuration-only defences: fork's defaults",
        "",
    ]
    doc = json.loads((tmp_path / "family.json").read_text())
    assert doc == {"schema": 1, "families": [], "defaults": {"0.5.21": [_Default().to_dict()], "fork": []}}
    (tmp_path / "family.json").write_text(json.dumps({"schema": 1, "defaults": {}}))  # a file with no families key
    assert answer_lines(tmp_path) == []
