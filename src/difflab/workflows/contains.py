"""Which release carries which fix, decided by behaviour rather than version strings.

Every fix's probes run on every listed release; each cell says whether that
release behaves like the fix's head (``fixed``), its base (``bug``), a mix
(``partial``), could not be judged (``error``) or lacks the code path
(``n/a``). The matrix's base/head pins give the release map it is expected
to reproduce; any disagreement is reported next to the table.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from difflab.diff.likeness import judge_backport
from difflab.environment.shared import SharedEnvironment
from difflab.errors import ConfigError
from difflab.files.atomic import check_out, results_folder
from difflab.matrix import Fix, load_matrix
from difflab.observation import Observation
from difflab.paths import repo_root
from difflab.progress import Reporter
from difflab.report.record import RunRecord, folder_stamp, is_run_folder, utc_now, write_json
from difflab.runner import Runner, build_runner
from difflab.runner.jobs import check_probe_files
from difflab.source.release import ReleaseSource
from difflab.upstream_tests import (
    agree_on_side,
    for_sources,
    release_reference,
    section,
    tests_dir,
    with_flag,
    write_files,
)
from difflab.workflows.observe import Selection, observe


@dataclass
class Cell:
    """One fix on one release."""

    fix: str
    release: str
    verdict: str
    expected: str | None
    probes: dict[str, str] = field(default_factory=dict)
    detail: str = ""
    upstream: dict[str, Any] | None = None
    """What SGLang's own tests said on this release, when they were replayed (``--upstream-tests``)."""

    @property
    def agrees(self) -> bool:
        return self.expected is None or self.expected == self.verdict


def expected_cell(fix: Fix, release: str, order: list[str]) -> str | None:
    """What the matrix's pins imply: releases from the head release on are fixed, before it bug."""
    if fix.head.release and fix.head.release in order and release in order:
        return "fixed" if order.index(release) >= order.index(fix.head.release) else "bug"
    if fix.head.unavailable and fix.base.release:
        return "bug"  # no release carries the head: every release shows the base behaviour
    return None


CELL = {"present": "fixed", "absent": "bug", "partial": "partial", "error": "error"}
"""The shared likeness verdict (:mod:`difflab.diff.likeness`), in a release table's words."""


def judge_cell(fix: Fix, release: str, obs: dict[str, Observation], expected: str | None) -> Cell:
    """One release's cell: its probes judged like a backport of the fix, except a missing code path (``n/a``)."""
    if not fix.probes:
        return Cell(fix=fix.id, release=release, verdict="n/a", expected=expected, detail="no probes declared")
    if all(o.status == "n/a" for o in obs.values()) and len(obs) == len(fix.probes):
        detail = "; ".join(f"{n}: {o.error}" for n, o in obs.items())
        return Cell(
            fix=fix.id,
            release=release,
            verdict="n/a",
            expected=expected,
            probes=dict.fromkeys(obs, "n/a"),
            detail=detail,
        )
    judged = judge_backport(fix, obs)
    verdict = CELL[judged.verdict]
    return Cell(
        fix=fix.id,
        release=release,
        verdict=verdict,
        expected=expected,
        probes={p.probe: p.like for p in judged.probes},
        detail="" if verdict in ("fixed", "bug") else judged.reason,
    )


def render_markdown(fixes: list[Fix], releases: list[str], cells: list[Cell]) -> str:
    by = {(c.fix, c.release): c for c in cells}
    lines = [
        "# Release containment by behaviour",
        "",
        "| fix | " + " | ".join(releases) + " |",
        "|---|" + "---|" * len(releases),
    ]
    for fix in fixes:
        row = []
        for r in releases:
            c = by[(fix.id, r)]
            row.append(c.verdict + ("" if c.agrees else f" (expected {c.expected})"))
        lines.append(f"| {fix.label} | " + " | ".join(row) + " |")
    notes = [c for c in cells if c.detail]
    if notes:
        lines += ["", "## Details", ""] + [f"- {c.fix} @ {c.release}: {c.detail}" for c in notes]
    return "\n".join(lines) + "\n"


def replay_upstream_tests(
    work: Path,
    fixes: list[Fix],
    releases: list[str],
    backend: ReleaseSource,
    cells: list[Cell],
    env: SharedEnvironment,
    folder: Path,
    reporter: Reporter,
) -> list[str]:
    """SGLang's own tests of each fix on every release, beside each cell; returns the Markdown section."""
    sources = {r: backend.release(r) for r in releases}
    references = {fix.id: release_reference(fix, backend) for fix in fixes}
    replays = for_sources(fixes, sources, references, env, folder, reporter.say)
    agreements = agree_on_side(replays, {(c.fix, c.release): c.verdict for c in cells})
    for c in cells:
        found = agreements.get((c.fix, c.release))
        if found is not None:
            c.upstream = found.to_dict()
            c.detail = with_flag(c.detail, found)
    write_files(work, replays, folder)
    return section(replays)


def run_contains(
    matrix_path: Path,
    fix_ids: list[str] | None,
    releases: list[str] | None,
    out: Path | None,
    runner: Runner,
    env: SharedEnvironment,
    reporter: Reporter,
    upstream_tests: Path | None = None,
    force: bool = False,
) -> tuple[list[Fix], list[str], list[Cell], Path]:
    folder = tests_dir(upstream_tests)
    record = RunRecord(command="contains")
    matrix = load_matrix(matrix_path)
    fixes = matrix.select(fix_ids)
    check_probe_files(fixes, matrix.path)
    order = sorted(matrix.releases, key=lambda v: tuple(int(x) for x in v.split(".") if x.isdigit()))
    releases = releases or order
    unknown = [r for r in releases if r not in matrix.releases]
    if unknown:
        raise ConfigError(f"{matrix.path}: release(s) {unknown} are not pinned under [releases]")
    record.fixes = [f.id for f in fixes]
    out = (out or repo_root() / "results" / f"contains-{folder_stamp(utc_now())}").resolve()
    with results_folder(out, force=force, ours=is_run_folder) as work:
        env.ensure()
        backend = ReleaseSource(matrix.releases)
        sources = {(fix.id, r): backend.release(r) for r in releases for fix in fixes}
        observed = observe(fixes, sources, runner, work, reporter)
        by = {(o.fix, o.side, o.probe): o for o in observed}
        cells = [
            judge_cell(
                fix,
                r,
                {s.name: by[(fix.id, r, s.name)] for s in fix.probes if (fix.id, r, s.name) in by},
                expected_cell(fix, r, order),
            )
            for fix in fixes
            for r in releases
        ]
        appendix: list[str] = []
        if folder is not None:
            appendix = replay_upstream_tests(work, fixes, releases, backend, cells, env, folder, reporter)
        doc = {
            "schema": 1,
            "releases": releases,
            "fixes": [f.id for f in fixes],
            "cells": [asdict(c) | {"agrees": c.agrees} for c in cells],
            "agrees": all(c.agrees for c in cells),
        }
        write_json(work / "contains.json", doc)
        (work / "contains.md").write_text(render_markdown(fixes, releases, cells) + "".join(f"{a}\n" for a in appendix))
        record.details = {"releases": releases, "runner": runner.describe(), "environment_digest": env.digest}
        passed = all(c.agrees and c.verdict != "error" for c in cells)
        record.write(work, 0 if passed else 1, matrix=(matrix.path, matrix.sha256))
    return fixes, releases, cells, out


@dataclass(kw_only=True)
class ContainsRequest(Selection):
    """``difflab contains``: which fixes on which releases (default: every pinned release)."""

    releases: list[str] | None = None
    upstream_tests: Path | None = None
    """A folder laid out like SGLang's repository with the fixes' own test files (else ``$DIFFLAB_UPSTREAM_TESTS``)."""


def execute(req: ContainsRequest, reporter: Reporter) -> tuple[list[Fix], list[str], list[Cell], Path]:
    """The release table, on the shared environment with the chosen back end."""
    tests_dir(req.upstream_tests)  # a bad folder is refused before the environment is built
    if req.out is not None:
        check_out(req.out, force=req.force, ours=is_run_folder)  # before the environment is built
    env = SharedEnvironment().ensure(progress=reporter.say)
    runner = build_runner(req.runner, env, req.use_cache)
    return run_contains(
        req.matrix, req.fixes, req.releases, req.out, runner, env, reporter, req.upstream_tests, req.force
    )
