"""Replay a fix's own SGLang unit tests on the sources a workflow judged, beside the probes' verdicts.

Supporting evidence, never a verdict: SGLang's tests drift with the code (their fakes go
stale), so they say less than a probe, but they are not the lab's, which makes them an
independent witness. A :class:`Plan` names the fix, the sides (``base``/``head`` for a run,
each release for ``contains``, the fork for ``backport``), the trees the test files come
from and the fix's base and head sources (to tell a name the fix adds from drift). Every
side runs every file of the fix; its tests are read into :class:`Outcome` s, and with a
base/head pair each test gets its change.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from difflab.environment.shared import SharedEnvironment
from difflab.matrix.model import Fix
from difflab.source.base import MaterialisedSource
from difflab.upstream_tests.agreement import Agreement
from difflab.upstream_tests.files import TestFile, Tree, locate
from difflab.upstream_tests.outcomes import Outcome, Reference, change, read_test
from difflab.upstream_tests.process import Job, plan, run_jobs

Say = Callable[[str], None]


@dataclass(frozen=True)
class Plan:
    """What to replay for one fix: its sides in order, where files come from, the fix's own base and head."""

    fix: Fix
    sides: dict[str, MaterialisedSource | str]
    trees: list[Tree]
    reference: Reference
    pair: tuple[str, str] | None = None


@dataclass
class SideRun:
    """Every test of the fix on one side, or why they could not run."""

    side: str
    source: dict[str, Any]
    status: str  # ok | error | unavailable
    error: str | None = None
    tests: dict[str, Outcome] = field(default_factory=dict)
    runner: dict[str, Any] = field(default_factory=dict)
    log: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "side": self.side,
            "source": self.source,
            "status": self.status,
            "error": self.error,
            "runner": self.runner,
            "tests": {tid: o.to_dict() for tid, o in self.tests.items()},
        }


@dataclass
class Row:
    """One test across the sides."""

    id: str
    own: bool
    outcomes: dict[str, Outcome]
    change: str | None = None

    def outcome(self, side: str) -> str | None:
        found = self.outcomes.get(side)
        return found.outcome if found else None

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"id": self.id, "own": self.own}
        data["outcomes"] = {side: o.to_dict() for side, o in self.outcomes.items()}
        if self.change is not None:
            data["change"] = self.change
        return data


@dataclass
class FixReplay:
    fix: Fix
    files: list[TestFile]
    not_found: list[str]
    sides: dict[str, SideRun]
    rows: list[Row]
    pair: tuple[str, str] | None
    note: str | None = None
    agreement: Agreement | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "fix": self.fix.id,
            "label": self.fix.label,
            "files": [f.to_dict() for f in self.files],
            "not_found": self.not_found,
            "own": [f"{t.file}::{o}" for t in self.fix.upstream_tests for o in t.own],
            "note": self.note,
            "sides": {name: s.to_dict() for name, s in self.sides.items()},
            "tests": [r.to_dict() for r in self.rows],
            "pair": list(self.pair) if self.pair else None,
            "summary": self.summary(),
            "agreement": self.agreement.to_dict() if self.agreement else None,
        }

    def summary(self) -> dict[str, list[str]]:
        """Test ids by change (a pair) or by outcome per side."""
        out: dict[str, list[str]] = {}
        for row in self.rows:
            if self.pair:
                out.setdefault(row.change or "", []).append(row.id)
            else:
                for side, o in row.outcomes.items():
                    out.setdefault(f"{side}: {o.outcome}", []).append(row.id)
        return out


def _locate(fix: Fix, trees: list[Tree]) -> tuple[list[TestFile], list[str]]:
    found, missing = [], []
    for entry in fix.upstream_tests:
        file = locate(entry.file, trees)
        (found.append(file) if file else missing.append(entry.file))
    return found, missing


def _side(name: str, src: MaterialisedSource | str, files: list[TestFile], jobs: list[Job], ref: Reference) -> SideRun:
    if isinstance(src, str):
        return SideRun(name, {}, "unavailable", src)
    run = SideRun(name, dict(src.identity), "ok")
    for file in files:
        job = next(j for j in jobs if file in j.files and j.source.root == src.root)
        run.runner, run.log = job.runner, job.log
        if job.status != "ok":
            run.status, run.error = "error", job.error
            continue
        for raw in job.records(file.id):
            run.tests[raw["id"]] = read_test(raw, ref)
    return run


def _import_only(run: SideRun, file_id: str) -> Outcome | None:
    """The outcome every test of a file shares on a side where the file did not import, else None."""
    mine = [o for tid, o in run.tests.items() if tid.startswith(f"{file_id}::")]
    return mine[0] if mine and all(o.phase == "import" for o in mine) else None


def _rows(fix: Fix, files: list[TestFile], sides: dict[str, SideRun], pair: tuple[str, str] | None) -> list[Row]:
    """One row per test seen on any side; a side where the file did not import fails each test the same way."""
    own = {f"{t.file}::{o}" for t in fix.upstream_tests for o in t.own}
    ids: list[str] = []
    for run in sides.values():
        ids += [tid for tid in run.tests if tid not in ids]
    for file in files:
        ids = _spread_import_failure(file, ids, sides)
    return [_row(tid, tid in own, sides, pair) for tid in ids]


def _spread_import_failure(file: TestFile, ids: list[str], sides: dict[str, SideRun]) -> list[str]:
    """A side where ``file`` failed to import fails each of its tests seen elsewhere, not one ``(import)`` test."""
    real = [tid for tid in ids if tid.startswith(f"{file.id}::") and not tid.endswith("::(import)")]
    if not real:
        return ids
    for run in sides.values():
        shared = _import_only(run, file.id)
        if shared is None:
            continue
        run.tests.pop(f"{file.id}::(import)", None)
        for tid in real:
            run.tests.setdefault(tid, shared)
    return [tid for tid in ids if tid != f"{file.id}::(import)"]


def _row(tid: str, own: bool, sides: dict[str, SideRun], pair: tuple[str, str] | None) -> Row:
    outcomes = {name: run.tests[tid] for name, run in sides.items() if tid in run.tests}
    row = Row(tid, own, outcomes)
    if pair and all(sides[s].status == "ok" for s in pair):
        row.change = change(outcomes.get(pair[0]), outcomes.get(pair[1]))
    elif pair:
        row.change = "only-base" if pair[0] in outcomes else "only-head"
    return row


Located = dict[str, tuple[list[TestFile], list[str]]]
"""Per fix: the test files found, and the ones named but found nowhere."""


def jobs_for(plans: list[Plan]) -> tuple[Located, list[Job]]:
    """Every plan's files located, and the processes (one per source) that run them on every available side."""
    located = {p.fix.id: _locate(p.fix, p.trees) for p in plans}
    needs = [
        (src, file)
        for p in plans
        for src in p.sides.values()
        if isinstance(src, MaterialisedSource)
        for file in located[p.fix.id][0]
    ]
    return located, plan(needs)


def read(plans: list[Plan], located: Located, jobs: list[Job]) -> list[FixReplay]:
    """Each plan's replay from the jobs once they ran: every side's outcomes, a row per test, its change."""
    replays = []
    for p in plans:
        files, missing = located[p.fix.id]
        if not files:
            where = " or ".join(t.origin for t in p.trees) or "no test tree"
            replays.append(FixReplay(p.fix, [], missing, {}, [], p.pair, f"no test file found in {where}"))
            continue
        sides = {name: _side(name, src, files, jobs, p.reference) for name, src in p.sides.items()}
        note = f"not found: {', '.join(missing)}" if missing else None
        replays.append(FixReplay(p.fix, files, missing, sides, _rows(p.fix, files, sides, p.pair), p.pair, note))
    return replays


def replay(plans: list[Plan], env: SharedEnvironment, say: Say | None = None) -> list[FixReplay]:
    """Run every plan's files on every available side (one process per source) and read the outcomes."""
    located, jobs = jobs_for(plans)
    return read(plans, located, run_jobs(jobs, env, say))
