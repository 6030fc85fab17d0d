"""The JUnit cases a run writes, read back with junitparser as CI reads them.

A fix with no probe to run is one case: skipped with its reason when the matrix declared it
unavailable, an error otherwise; a character XML 1.0 cannot hold is written as an escape a reader can
see; a report folder that does not exist yet is made; an outcome the writer does not know is refused.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from junitparser import JUnitXml

from difflab.diff.verdict import FixVerdict
from difflab.report.junit import Case, verdict_cases, write_cases, xml_text


def verdict(verdict: str, expected_unavailable: bool, reason: str = "0.5.19 carries it") -> FixVerdict:
    return FixVerdict(7, "7", None, "a fix", verdict, reason, expected_unavailable, {}, {})


def read(path: Path) -> list:
    (suite,) = list(JUnitXml.fromfile(str(path)))
    return list(suite)


def test_a_declared_unavailable_fix_without_probes_is_one_skipped_case_with_its_reason(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "er" / "junit.xml"  # the folders are made
    write_cases(path, "difflab", verdict_cases([verdict("unavailable", True)]))
    (case,) = read(path)
    assert (case.classname, case.name, case.is_skipped) == ("fix.7", "(no probes)", True)
    assert case.result[0].message == "0.5.19 carries it"


@pytest.mark.parametrize(("outcome", "expected"), [("unavailable", False), ("not-fixed", True), ("error", False)])
def test_any_other_fix_without_probes_is_an_error_case(tmp_path: Path, outcome: str, expected: bool) -> None:
    write_cases(tmp_path / "junit.xml", "difflab", verdict_cases([verdict(outcome, expected, "no source")]))
    (case,) = read(tmp_path / "junit.xml")
    assert (case.classname, case.name, case.is_skipped, case.is_passed) == ("fix.7", "(no probes)", False, False)
    assert (case.result[0].message, case.result[0].type) == ("no source", "error")


def test_characters_xml_cannot_hold_are_written_as_visible_escapes(tmp_path: Path) -> None:
    text = "a\x1b[31mb\x00c\ufffed\uffffe\x7f"
    assert xml_text(text) == "a\\x1b[31mb\\x00c\\ufffed\\uffffe\\x7f"
    assert xml_text("\u0100 ok \u00e9") == "\u0100 ok \u00e9"  # what XML holds is kept
    write_cases(tmp_path / "junit.xml", "suite\x1b", [Case("c", "n", "failed", text, "kind")])
    (case,) = read(tmp_path / "junit.xml")
    assert case.result[0].message == "a\\x1b[31mb\\x00c\\ufffed\\uffffe\\x7f"


def test_an_outcome_the_writer_does_not_know_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(ValueError) as refused:
        write_cases(tmp_path / "junit.xml", "difflab", [Case("c", "n", "flaky")])
    assert str(refused.value) == "unknown JUnit outcome 'flaky'"
    assert not (tmp_path / "junit.xml").exists()
