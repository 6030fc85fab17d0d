"""Replay a fix's own upstream CPU unit tests at base and at head, and diff the outcomes.

Supporting evidence beside the probes, never a verdict: upstream tests
drift with the code (their fakes go stale), so they say less than a probe.
The test files are taken from one checkout, the head's ``test/`` tree when
it has one (the fix's tests usually arrive with the fix), and run against
each side's ``python/`` in a fresh process of the shared environment
(:mod:`difflab.probe.upstream_child`). Written into the run folder:
``upstream-tests/<fix>/<side>.xml`` (JUnit) and ``.json``/``.log`` beside
it, and ``upstream-tests.json`` with the per-test diff for every fix.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from difflab.environment.shared import SharedEnvironment
from difflab.matrix.model import Fix
from difflab.observation import SCHEMA_VERSION, SIDES
from difflab.probe import upstream_child
from difflab.report.junit import Case, write_cases
from difflab.report.record import write_json
from difflab.runner import childlib
from difflab.runner.base import tail
from difflab.runner.subprocess import probe_env
from difflab.source.base import MaterialisedSource

DEFAULT_TIMEOUT_S = 300.0
CHILD = upstream_child.__name__


@dataclass
class TestOutcome:
    """One upstream test on one side."""

    __test__ = False  # not a pytest class

    id: str
    outcome: str  # passed | failed | error | skipped
    error_type: str | None = None
    message: str | None = None
    stale_fake: bool = False
    duration_s: float = 0.0
    traceback: str | None = None

    @property
    def label(self) -> str:
        if self.outcome == "error":
            return "error (stale fake)" if self.stale_fake else "error"
        return self.outcome


@dataclass
class SideRun:
    """All of a fix's upstream tests on one side, or why they could not run."""

    side: str
    source: dict[str, Any]
    status: str  # ok | error | unavailable
    error: str | None = None
    tests: list[TestOutcome] = field(default_factory=list)
    duration_s: float = 0.0

    def ids(self, outcome: str) -> list[str]:
        return sorted(t.id for t in self.tests if t.outcome == outcome)


@dataclass
class TestChange:
    """One test across the two sides."""

    __test__ = False

    id: str
    base: str
    head: str
    change: str  # fixed | regressed | pass | fail | error | skipped | only-base | only-head


@dataclass
class FixReplay:
    fix: str
    files: list[str]
    tests_from: dict[str, Any] | None
    sides: dict[str, SideRun]
    changes: list[TestChange]
    note: str | None = None

    def to_dict(self) -> dict[str, Any]:
        sides = {}
        for name, run in self.sides.items():
            sides[name] = {
                "source": run.source,
                "status": run.status,
                "error": run.error,
                "duration_s": round(run.duration_s, 3),
                "passed": run.ids("passed"),
                "failed": run.ids("failed"),
                "skipped": run.ids("skipped"),
                "errors": [
                    {"id": t.id, "stale_fake": t.stale_fake, "error_type": t.error_type, "message": t.message}
                    for t in run.tests
                    if t.outcome == "error"
                ],
            }
        by_change: dict[str, list[str]] = {}
        for c in self.changes:
            by_change.setdefault(c.change, []).append(c.id)
        return {
            "fix": self.fix,
            "files": self.files,
            "tests_from": self.tests_from,
            "note": self.note,
            "sides": sides,
            "tests": [asdict(c) for c in self.changes],
            "summary": by_change,
        }


def _change(base: TestOutcome | None, head: TestOutcome | None) -> str:
    if base is None or head is None:
        return "only-head" if base is None else "only-base"
    outcomes = {base.outcome, head.outcome}
    if "error" in outcomes:
        return "error"
    if outcomes == {"passed"}:
        return "pass"
    if base.outcome == "failed" and head.outcome == "passed":
        return "fixed"
    if base.outcome == "passed" and head.outcome == "failed":
        return "regressed"
    if outcomes == {"failed"}:
        return "fail"
    return "skipped"


def diff_sides(base: SideRun, head: SideRun) -> list[TestChange]:
    b = {t.id: t for t in base.tests}
    h = {t.id: t for t in head.tests}
    return [
        TestChange(
            i, b[i].label if i in b else "absent", h[i].label if i in h else "absent", _change(b.get(i), h.get(i))
        )
        for i in sorted(set(b) | set(h))
    ]


def run_tests(
    env: SharedEnvironment,
    source: MaterialisedSource,
    tests_root: Path,
    files: list[str],
    side: str,
    out_dir: Path,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> SideRun:
    """One fresh process of the shared environment runs every file against ``source``."""
    started = time.perf_counter()
    run = SideRun(side=side, source=dict(source.identity), status="ok")
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="difflab-upstream-") as tmp:
        result = Path(tmp) / "result.json"
        # run from an empty folder: nothing but the source and the staged package can be imported
        cmd = [str(env.python), "-m", CHILD, str(result), str(tests_root), *files]
        try:
            proc = subprocess.run(
                cmd,
                env=probe_env(source.root, childlib.stage(env.cache)),
                cwd=tmp,
                capture_output=True,
                text=True,
                timeout=timeout_s,
            )
            log = (proc.stdout or "") + (proc.stderr or "")
        except subprocess.TimeoutExpired:
            run.status, run.error, log = "error", f"upstream tests hung: killed after {timeout_s:.0f} s", ""
        (out_dir / f"{side}.log").write_text(log)
        if run.status == "ok":
            if result.exists():
                raw = json.loads(result.read_text())
                run.tests = [TestOutcome(**t) for t in raw["tests"]]
                shutil.copyfile(result, out_dir / f"{side}.json")
            else:
                run.status, run.error = "error", f"test process died (exit {proc.returncode})\n{tail(log)}"
    run.duration_s = time.perf_counter() - started
    return run


def side_cases(fix_id: str, run: SideRun) -> Iterator[Case]:
    """One case per upstream test (plus one for the run itself when it could not run)."""
    if run.status != "ok":
        yield Case(f"upstream.{fix_id}.{run.side}", "(run)", "error", run.error or run.status, run.status)
    for t in run.tests:
        file, _, name = t.id.partition("::")
        stale = "stale-fake" if t.stale_fake else (t.error_type or "error")
        message, kind = {
            "failed": (t.message or "", t.error_type or "AssertionError"),
            "error": (f"{stale}: {t.error_type}: {t.message}", stale),
            "skipped": (t.message or "", ""),
        }.get(t.outcome, ("", ""))
        outcome = t.outcome if t.outcome in ("failed", "error", "skipped") else "passed"
        classname = file.removesuffix(".py").replace("/", ".")
        yield Case(classname, name or t.id, outcome, message, kind, t.duration_s, stderr=t.traceback or None)


def write_side_junit(path: Path, fix_id: str, run: SideRun) -> None:
    write_cases(path, f"upstream-tests.{fix_id}.{run.side}", side_cases(fix_id, run))


def replay_fix(
    fix: Fix,
    sources: dict[str, MaterialisedSource | str],
    env: SharedEnvironment,
    out_dir: Path,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> FixReplay:
    """Run the fix's ``upstream_tests`` on each available side; ``out_dir`` is ``upstream-tests/<fix>``."""
    files = list(fix.upstream_tests)
    order = [s for s in ("head", "base") if not isinstance(sources.get(s), str) and sources.get(s) is not None]
    tests_src = next((sources[s] for s in order if sources[s].tests_root), None)  # type: ignore[union-attr]
    if not files or tests_src is None:
        note = (
            "the matrix names no upstream_tests for this fix"
            if not files
            else "no side has SGLang's test/ tree (only the git source checks it out)"
        )
        return FixReplay(fix.id, files, None, {}, [], note)
    assert isinstance(tests_src, MaterialisedSource) and tests_src.tests_root is not None
    runs: dict[str, SideRun] = {}
    for side in SIDES:
        src = sources.get(side)
        if src is None or isinstance(src, str):
            runs[side] = SideRun(side=side, source={}, status="unavailable", error=src or "no source")
        else:
            runs[side] = run_tests(env, src, tests_src.tests_root, files, side, out_dir, timeout_s)
        write_side_junit(out_dir / f"{side}.xml", fix.id, runs[side])
    return FixReplay(fix.id, files, dict(tests_src.identity), runs, diff_sides(runs["base"], runs["head"]))


def replay_run(
    work: Path,
    fixes: list[Fix],
    sources: dict[tuple[str, str], MaterialisedSource | str],
    env: SharedEnvironment,
    say: Callable[[str], None] | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> Path:
    """Replay every fix's upstream tests into a run folder; returns ``upstream-tests.json``."""
    replays = []
    for fix in fixes:
        if not fix.upstream_tests:
            continue
        per_side = {side: sources[(fix.id, side)] for side in SIDES if (fix.id, side) in sources}
        replay = replay_fix(fix, per_side, env, work / "upstream-tests" / fix.id, timeout_s)
        if say:
            summary = ", ".join(f"{k}: {len(v)}" for k, v in replay.to_dict()["summary"].items())
            say(f"upstream tests {fix.label}: {summary or replay.note}")
        replays.append(replay.to_dict())
    path = work / "upstream-tests.json"
    return write_json(path, {"schema": SCHEMA_VERSION, "fixes": replays})
