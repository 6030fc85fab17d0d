"""``difflab backport``'s replay of SGLang's own tests, through its seams: what each verdict gains.

The replay itself (the test child on the fork) is :mod:`difflab.upstream_tests`' and is tested there;
here its results are given, and the step is judged by what it writes onto each verdict: the
agreement, the flag in the reason, and the disagreement added to the git evidence's own.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from difflab.diff.likeness import BackportVerdict
from difflab.upstream_tests.agreement import Agreement
from difflab.workflows import backport as backport_workflow


def verdict(fix_id: str, disagreements: list[str]) -> BackportVerdict:
    return BackportVerdict(
        fix=int(fix_id),
        id=fix_id,
        part=None,
        title="t",
        verdict="present",
        reason="as head",
        probes=[],
        disagreements=list(disagreements),
    )


def test_a_disagreement_of_sglangs_tests_is_added_to_the_git_evidences_own(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    said: list[str] = []
    written: list[Any] = []
    contradicted = Agreement("p", "probe: present; SGLang's tests: failed", False, ["test_fix failed on the fork"])
    quiet = Agreement("p", "probe: present; SGLang's tests: passed", True)
    found = {("1", backport_workflow.SIDE): contradicted, ("2", backport_workflow.SIDE): quiet}
    monkeypatch.setattr(backport_workflow, "releases", lambda table: "backend")
    monkeypatch.setattr(backport_workflow, "release_reference", lambda fix, backend: f"ref-{fix.id}")
    monkeypatch.setattr(backport_workflow, "for_sources", lambda *a: ["replay"])
    monkeypatch.setattr(backport_workflow, "agree_on_side", lambda replays, verdicts: found)
    monkeypatch.setattr(backport_workflow, "write_upstream_files", lambda *a: written.append(a))
    monkeypatch.setattr(backport_workflow, "section", lambda replays: ["## SGLang's tests"])
    fixes = [SimpleNamespace(id="1"), SimpleNamespace(id="2"), SimpleNamespace(id="3")]
    session = SimpleNamespace(fixes=fixes, say=said.append, matrix=SimpleNamespace(releases={}))
    verdicts = [verdict("1", ["cherry-picked, then reverted"]), verdict("2", ["not an ancestor"]), verdict("3", [])]
    folder = tmp_path / "tests"
    lines = backport_workflow.replay_upstream_tests(session, tmp_path, "fork", verdicts, "env", folder)  # type: ignore[arg-type]
    first, second, third = verdicts
    assert first.disagreements == ["cherry-picked, then reverted", contradicted.flag]
    assert first.reason == f"as head; {contradicted.flag}" and first.upstream_tests == contradicted.to_dict()
    assert second.disagreements == ["not an ancestor"] and second.reason == "as head"
    assert third.upstream_tests is None and third.disagreements == []
    assert said == [f"upstream tests #1: {contradicted.text}", f"upstream tests #2: {quiet.text}"]
    assert written == [(tmp_path, ["replay"], folder)] and lines == ["## SGLang's tests"]
