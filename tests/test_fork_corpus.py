"""``difflab backport`` on the fork corpus (``fork_corpus.py``): every fork's verdict per fix, asserted.

One ``difflab backport`` per fork, with only the fixes its spec lists, through
``difflab.cli.main`` against the corpus repository built from the real release
trees. A failure prints the fix's reason and its per-path (or per-probe) table.
The corpus is split over two xdist groups, so two workers share it; each
worker's backports share one warm runner (the result cache applies as usual).

Set ``DIFFLAB_CORPUS_REPORT=DIR`` to also write each fork's expected and
actual verdicts to ``DIR/<fork>.json``, and ``DIFFLAB_CORPUS_NO_CACHE=1`` to run
every probe afresh (``backport --no-cache``), e.g. to time a cold run.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from difflab.cli import main as cli
from difflab.matrix import load_matrix
from difflab.paths import default_matrix
from fork_corpus import (
    CLASSES,
    CORPUS,
    CORPUS_RELEASES,
    FIXES,
    RELEASE_MAP,
    VERDICTS,
    Corpus,
    CorpusError,
    Edit,
    ForkSpec,
    apply_edits,
    corpus_repos,
    new_module,
)
from test_git_support import matrix_copy

GROUPS = 2
MIN_FORKS = 30


def _params() -> list[Any]:
    return [
        pytest.param(spec, id=spec.name, marks=pytest.mark.xdist_group(f"corpus-{i % GROUPS}"))
        for i, spec in enumerate(CORPUS)
    ]


@pytest.fixture(scope="session")
def corpus() -> Corpus:
    return corpus_repos()


@pytest.fixture(scope="session")
def corpus_matrix(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The default matrix as it is now (probes, hunks, expectations), without upstream's commit pins.

    The corpus upstream has none of upstream's SHAs, and verdicts never depend on the git
    evidence; without pins ``backport`` notes that and skips patch-id scans of whole releases.
    """
    return matrix_copy(tmp_path_factory.mktemp("corpus-matrix"))


@pytest.fixture(scope="session")
def runners_of_this_worker() -> Iterator[Callable[..., Any]]:
    """A ``build_runner`` that builds each kind of runner once per worker and closes them all at the end."""
    from difflab.runner import build_runner

    built: dict[tuple[Any, ...], Any] = {}

    def shared(name: str, environment: Any, use_cache: bool, say: Any = None, **options: Any) -> Any:
        key = (name, use_cache, environment.digest, tuple(sorted(options.items())))
        if key not in built:
            built[key] = build_runner(name, environment, use_cache, say, **options)
        return built[key]

    try:
        yield shared
    finally:
        for runner in built.values():
            close = getattr(getattr(runner, "inner", runner), "close", None)
            if close:
                close()


@pytest.fixture
def one_runner_per_worker(runners_of_this_worker: Callable[..., Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """Every ``backport`` of this worker shares one runner: one warm hub imports SGLang's
    dependencies once for the whole corpus instead of once per fork (~6 s each).

    Patched for each corpus test only: a worker's later tests (a workflow that must build, and warn
    about, its own runner) get the real builder back.
    """
    from difflab.workflows import session as session_steps  # every workflow builds its runner there

    monkeypatch.setattr(session_steps, "build_runner", runners_of_this_worker)


def _fields(probe: dict[str, Any]) -> str:
    rows = []
    for check in probe.get("fields", []):
        if check["kind"] == "expect":
            rows.append(
                f"      {check['field']} = {check['observed']!r} (base {check['declared_base']!r}, "
                f"head {check['declared_head']!r}): {check['like']}"
            )
        elif check["like"] != "ok":
            rows.append(f"      control {check['field']} = {check['observed']!r} (declared {check['declared_base']!r})")
    return "\n".join(rows)


def describe(spec: ForkSpec, fix: dict[str, Any], want: str) -> str:
    """Why a fix's verdict is not the expected one: its reason and what each path / probe behaved like."""
    lines = [
        f"{spec.name} #{fix['id']}: expected {want}, got {fix['verdict']}",
        f"  fork: {spec.cls} on {spec.base_release}: {spec.why}",
        f"  reason: {fix['reason']}",
    ]
    if fix.get("paths"):
        lines.append("  paths:")
        lines += [f"    {p['hunk']:<32} {p['like']:<7} {p['where']}  [{', '.join(p['fields'])}]" for p in fix["paths"]]
    else:
        lines.append("  paths: none listed in the matrix for this fix; probes:")
    for probe in fix.get("probes", []):
        lines.append(f"    probe {probe['probe']}: {probe['like']} - {probe['reason']}")
        if detail := _fields(probe):
            lines.append(detail)
    if fix.get("forced"):
        lines.append("  forced: " + "; ".join(fix["forced"]))
    return "\n".join(lines)


def _record(spec: ForkSpec, fixes: dict[str, dict[str, Any]], rc: int) -> None:
    folder = os.environ.get("DIFFLAB_CORPUS_REPORT")
    if not folder:
        return
    Path(folder).mkdir(parents=True, exist_ok=True)
    doc = {
        "name": spec.name,
        "cls": spec.cls,
        "base": spec.base_release,
        "why": spec.why,
        "exit_code": rc,
        "fixes": {
            fix: {
                "expected": want,
                "actual": fixes[fix]["verdict"] if fix in fixes else None,
                "reason": fixes[fix]["reason"] if fix in fixes else None,
                "paths": fixes[fix].get("paths") if fix in fixes else None,
                "forced": fixes[fix].get("forced") if fix in fixes else None,
                "detail": describe(spec, fixes[fix], want) if fix in fixes else None,
            }
            for fix, want in spec.expect.items()
        },
    }
    (Path(folder) / f"{spec.name}.json").write_text(json.dumps(doc, indent=1, default=str) + "\n")


@pytest.mark.sglang
@pytest.mark.parametrize("spec", _params())
def test_fork_verdict(
    spec: ForkSpec, corpus: Corpus, corpus_matrix: Path, one_runner_per_worker: None, tmp_path: Path
) -> None:
    out = tmp_path / "backport"
    args = ["backport", "--repo", str(corpus.repo), "--ref", spec.branch]
    for fix in spec.expect:
        args += ["--fix", fix]
    args += ["--matrix", str(corpus_matrix), "--no-bundle", "--upstream", str(corpus.upstream), "--out", str(out)]
    if os.environ.get("DIFFLAB_CORPUS_NO_CACHE"):
        args.append("--no-cache")
    rc = cli(args)
    doc = json.loads((out / "backport.json").read_text())
    assert doc["fork"]["commit"] == corpus.branches[spec.name]
    fixes = {f["id"]: f for f in doc["fixes"]}
    _record(spec, fixes, rc)
    assert sorted(fixes) == sorted(spec.expect), "backport judged other fixes than asked"
    problems = [describe(spec, fixes[fix], want) for fix, want in spec.expect.items() if fixes[fix]["verdict"] != want]
    for fix, pattern in spec.forced_note.items():
        notes = fixes[fix].get("forced") or []
        if not any(re.search(pattern, note) for note in notes):
            problems.append(f"{spec.name} #{fix}: no forced note matches {pattern!r}; notes: {notes}")
    if problems:
        pytest.fail("\n\n".join(problems), pytrace=False)
    assert rc == (0 if all(v == "present" for v in spec.expect.values()) else 1)


# --- the corpus itself ------------------------------------------------------------------------
def test_corpus_covers_every_class_and_fix() -> None:
    assert len(CORPUS) >= MIN_FORKS
    names = [s.name for s in CORPUS]
    assert len(set(names)) == len(names), "fork names must be unique"
    assert {s.cls for s in CORPUS} == set(CLASSES), "every class covered, and only the declared ones"
    known = {f.id for f in load_matrix(default_matrix()).fixes}
    for spec in CORPUS:
        assert spec.base_release in CORPUS_RELEASES, spec.name
        assert spec.expect and set(spec.expect) <= set(FIXES) <= known, spec.name
        assert set(spec.expect.values()) <= set(VERDICTS), spec.name
        assert set(spec.forced_note) <= set(spec.expect), spec.name
        assert spec.why.startswith(spec.cls), f"{spec.name}: the why names its class first"
        assert (spec.cls == "unmodified") == (not spec.edits), spec.name
    # every released fix is checked by forks expecting each verdict, so neither answer passes by default
    for fix in ("36988", "38935", "41404", "43719a"):
        seen = Counter(s.expect[fix] for s in CORPUS if fix in s.expect)
        assert set(seen) == set(VERDICTS), f"#{fix}: {dict(seen)}"
    releases = {s.base_release: s for s in CORPUS if s.cls == "unmodified"}
    assert sorted(releases) == list(CORPUS_RELEASES)
    for version, spec in releases.items():
        assert dict(spec.expect) == RELEASE_MAP[version] and spec.expect["43719b"] == "absent"
    for spec in CORPUS:
        if spec.cls == "deferred-default-off":
            assert spec.forced_note and all(v == "present" for f, v in spec.expect.items() if f in spec.forced_note)


def test_an_edit_that_does_not_apply_fails_loudly_naming_fork_file_and_text() -> None:
    files = {"sglang/a.py": "x = 1\nx = 1\n"}
    read = files.get

    def spec(*edits: Edit) -> ForkSpec:
        return ForkSpec("acme-x", "refactor", "0.5.21", edits, {"38935": "present"}, "refactor: test")

    assert apply_edits(spec(Edit("sglang/a.py", "x = 1\n", "y = 2\n", count=2)), read) == {
        "sglang/a.py": "y = 2\ny = 2\n"
    }
    with pytest.raises(CorpusError, match=r"(?s)'acme-x'.*sglang/a\.py.*0 time\(s\), expected 1.*z = 3"):
        apply_edits(spec(Edit("sglang/a.py", "z = 3", "")), read)
    with pytest.raises(CorpusError, match=r"(?s)'acme-x'.*2 time\(s\), expected 1"):
        apply_edits(spec(Edit("sglang/a.py", "x = 1", "x = 2")), read)
    with pytest.raises(CorpusError, match=r"'acme-x'.*sglang/b\.py does not exist"):
        apply_edits(spec(Edit("sglang/b.py", "x", "y")), read)
    with pytest.raises(CorpusError, match=r"'acme-x'.*no longer parses"):
        apply_edits(spec(Edit("sglang/a.py", "x = 1\n", "x = (\n", count=2)), read)
    # a module the fork adds: an empty find creates it, and only a file the release lacks
    assert apply_edits(spec(new_module("sglang/c.py", "z = 3\n")), read) == {"sglang/c.py": "z = 3\n"}
    with pytest.raises(CorpusError, match=r"'acme-x'.*an empty find only creates a new file"):
        apply_edits(spec(Edit("sglang/a.py", "", "z = 3\n", count=0)), read)
