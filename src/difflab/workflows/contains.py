"""``difflab contains``: which release carries which fix, decided by behaviour rather than version strings.

Every fix's probes run on every chosen release: the matrix's hand-pinned releases, or with
``--all`` every release in ``matrices/releases.lock`` (what ``difflab releases --lock``
pinned). Each cell is judged like a backport of the fix (:mod:`difflab.diff.containment`); a
fix present in a release and absent or partial in a later one is a regression, listed first,
and makes the exit code 1. Releases run on the fewest environments that cover their needs
(:mod:`difflab.environment.plan`; today all share one). The run folder holds contains.json,
contains.md, contains.html, junit.xml and every observation, and is sealed like every run.
"""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.version import Version

from difflab.diff.containment import ContainmentTable, ReleaseColumn, find_regressions, judge_cell, release_order
from difflab.environment.plan import EnvironmentPlan, Need, load_needs, pin_versions, plan_environments
from difflab.environment.shared import SharedEnvironment, pinned_texts
from difflab.errors import ConfigError
from difflab.matrix import Fix, Matrix
from difflab.matrix.model import ReleasePin
from difflab.observation import Observation
from difflab.paths import default_release_lock, default_results
from difflab.preflight.defaults import read_defaults
from difflab.progress import Reporter
from difflab.provenance import probes_record
from difflab.report.containment import write_files
from difflab.report.family import write_family
from difflab.report.grid import write_html
from difflab.report.record import folder_stamp, matrix_reference, stamp, utc_now
from difflab.report.upstream_tests import section
from difflab.report.upstream_tests import write_files as write_upstream_files
from difflab.runner import Runner
from difflab.source import releases
from difflab.source.base import MaterialisedSource
from difflab.source.release_lock import ReleaseLock, agree_with_matrix, load_lock, parse_floor
from difflab.upstream_tests import agree_on_side, for_sources, release_reference, tests_dir, with_flag
from difflab.workflows.observe import observe
from difflab.workflows.session import Outcome, ProbeOptions, Session, close_runner

LOCK_COPY = "releases.lock"


@dataclass(kw_only=True)
class ContainsRequest(ProbeOptions):
    """``difflab contains``: which fixes on which releases (default: every release the matrix pins)."""

    releases: list[str] | None = None
    all_releases: bool = False
    """Every release in the lock (``--all``) instead of the matrix's own ``[releases]``."""
    lock: Path = field(default_factory=default_release_lock)
    since: str | None = None
    upstream_tests: Path | None = None
    """A folder laid out like SGLang's repository with the fixes' own test files (else ``$DIFFLAB_UPSTREAM_TESTS``)."""


@dataclass
class ContainsOutcome(Outcome):
    table: ContainmentTable
    environments: list[EnvironmentPlan] = field(default_factory=list)


EnvironmentFactory = Callable[[tuple[str, ...]], SharedEnvironment]
RunnerFactory = Callable[[SharedEnvironment], Runner]


def default_out() -> Path:
    return default_results() / f"contains-{folder_stamp(utc_now())}"


def _available(req: ContainsRequest, matrix: Matrix) -> tuple[dict[str, ReleasePin], str, ReleaseLock | None]:
    """The pins to choose from (the lock's with ``--all``, else the matrix's), where they come from, the lock."""
    if not req.all_releases:
        return dict(matrix.releases), f"{matrix.path} [releases]", None
    lock = load_lock(req.lock, missing_ok=False)
    agree_with_matrix(lock, matrix.releases, matrix.path)
    available = {v: lock.releases[v].pin() for v in lock.versions}
    return available, f"{lock.path} (run `difflab releases --lock` to pin new releases)", lock


def _column(version: str, pin: ReleasePin, matrix: Matrix, lock: ReleaseLock | None) -> ReleaseColumn:
    """One release's column: new when the matrix does not pin it by hand; the lock says when it was seen."""
    locked = lock.releases.get(version) if lock else None
    return ReleaseColumn(
        version=version,
        file=pin.file,
        sha256=pin.sha256,
        new=version not in matrix.releases,
        first_seen=locked.first_seen if locked else None,
        yanked=locked.yanked if locked else None,
        prerelease=locked.prerelease if locked else Version(version).is_prerelease,
    )


def choose_releases(
    req: ContainsRequest, matrix: Matrix
) -> tuple[dict[str, ReleasePin], list[ReleaseColumn], ReleaseLock | None]:
    """The pins to judge, and each one's column (new: not pinned by hand in the matrix)."""
    available, where, lock = _available(req, matrix)
    if req.since:
        floor = Version(parse_floor(req.since))
        available = {v: p for v, p in available.items() if Version(v) >= floor}
    wanted = req.releases or release_order(list(available))
    unknown = [r for r in wanted if r not in available]
    if unknown:
        raise ConfigError(f"release(s) {unknown} are not pinned in {where}")
    if not wanted:
        raise ConfigError(f"no release to check in {where}" + (f" from {req.since}" if req.since else ""))
    columns = [_column(version, available[version], matrix, lock) for version in release_order(wanted)]
    return {c.version: available[c.version] for c in columns}, columns, lock


def shared_pins() -> dict[str, Version]:
    """Every exact pin of the shared environment (both requirement files)."""
    main, nodeps = pinned_texts()
    return pin_versions([*main.splitlines(), *nodeps.splitlines()])


@dataclass
class _Observed:
    """Every release's observations, and the environments and runners they ran on (one per plan)."""

    observed: list[Observation] = field(default_factory=list)
    environments: list[dict[str, Any]] = field(default_factory=list)
    runners: list[dict[str, Any]] = field(default_factory=list)
    env_of: dict[str, str] = field(default_factory=dict)
    """Release -> the digest of the environment it ran in."""

    def environment(self) -> dict[str, Any]:
        """environment.json: the first environment, with every planned one listed."""
        return {**self.environments[0], "environments": self.environments}

    def planned(self) -> list[dict[str, Any]]:
        return [
            {"digest": d["digest"], "pins": d.get("pins", []), "releases": d["releases"]} for d in self.environments
        ]


@dataclass
class _Plans:
    """How the releases run: the planned environments, and how an environment and its runner are built."""

    plans: list[EnvironmentPlan]
    make_env: EnvironmentFactory
    make_runner: RunnerFactory


def observe_releases(session: Session, plans: _Plans, sources: dict[str, MaterialisedSource], work: Path) -> _Observed:
    """Every fix on every release, plan by plan: each plan's environment made ready, its runner closed after."""
    ran = _Observed()
    fixes = session.fixes
    for plan in plans.plans:
        env = plans.make_env(plan.pins)
        env.ensure(progress=session.say)
        runner = plans.make_runner(env)
        try:
            jobs = {(fix.id, v): sources[v] for v in plan.releases for fix in fixes}
            ran.observed += observe(fixes, jobs, runner, work, session.reporter, session.options.timeout_s)
            ran.runners.append(runner.describe())
        finally:
            close_runner(runner)
        ran.environments.append(env.document() | {"releases": list(plan.releases)})
        ran.env_of |= dict.fromkeys(plan.releases, env.digest)
    return ran


def _details(
    table: ContainmentTable, ran: _Observed, sources: dict[str, MaterialisedSource], lock: ReleaseLock | None
) -> dict[str, Any]:
    return {
        "releases": [c.version for c in table.releases],
        "new_releases": [c.version for c in table.new_releases],
        "regressions": len(table.regressions),
        "source_kind": "release",
        "runner": ran.runners[0] if ran.runners else {},
        "runners": ran.runners,
        "sources": {v: s.identity for v, s in sources.items()},
        "environment_digest": ran.environments[0]["digest"],
        "lock": _lock_reference(lock),
        "probes": probes_record(),
    }


def _write(
    session: Session, work: Path, table: ContainmentTable, ran: _Observed, lock: ReleaseLock | None, appendix: list[str]
) -> None:
    write_files(work, table, {"environments": ran.planned(), "lock": _lock_reference(lock)}, appendix)
    write_html(work, table, {"started": stamp(session.record.started), "exit_code": table.exit_code})
    if lock is not None:
        shutil.copyfile(lock.path, work / LOCK_COPY)


def _family(session: Session, work: Path, table: ContainmentTable, sources: dict[str, MaterialisedSource]) -> list[str]:
    """The family's answer per release, beside the build's switch defaults (read from each tree)."""
    per_release = {v: {x.fix: x.verdict for x in table.cells if x.release == v} for v in sources}
    defaults = {v: read_defaults(s.root) for v, s in sources.items()}
    return write_family(work, session.matrix, per_release, defaults)


def execute(
    req: ContainsRequest,
    reporter: Reporter | None = None,
    *,
    needs: list[Need] | None = None,
    environments: EnvironmentFactory | None = None,
    runners: RunnerFactory | None = None,
) -> ContainsOutcome:
    """Judge every fix on every chosen release and write the sealed run folder."""
    if req.source_kind != "release":
        raise ConfigError(f"contains judges releases; --source {req.source_kind} does not apply")
    session = Session.open("contains", req, reporter, folder_prefix="contains-")
    folder = tests_dir(req.upstream_tests)  # a bad folder is refused before the environment is built
    pins, columns, lock = choose_releases(req, session.matrix)
    needed = load_needs() if needs is None else needs
    plans = _Plans(
        plan_environments(list(pins), needed, shared_pins()),
        environments or (lambda p: session.environment(p, ensure=False)),
        runners or session.runner,
    )
    for version in (v for v in pins if v not in session.matrix.releases):
        session.say(f"new release {version}: not pinned in the matrix; its expectations follow the pins' order")
    with session.folder() as work:
        backend = releases(pins)
        sources: dict[str, MaterialisedSource] = {v: backend.release(v) for v in pins}
        ran = observe_releases(session, plans, sources, work)
        columns = [dataclasses.replace(c, environment=ran.env_of[c.version]) for c in columns]
        table = judge(session.fixes, columns, ran.observed)
        appendix: list[str] = []
        if folder is not None:
            env = plans.make_env(plans.plans[0].pins) if plans.plans else SharedEnvironment()
            appendix = replay_upstream_tests(session, work, pins, sources, table, env, folder)
        appendix = [*_family(session, work, table, sources), *appendix]
        _write(session, work, table, ran, lock, appendix)
        session.record.details = _details(table, ran, sources, lock)
        session.finish(work, table.exit_code, environment=ran.environment())
    return ContainsOutcome(out_dir=session.out, exit_code=table.exit_code, table=table, environments=plans.plans)


def replay_upstream_tests(
    session: Session,
    work: Path,
    pins: dict[str, ReleasePin],
    sources: dict[str, MaterialisedSource],
    table: ContainmentTable,
    env: SharedEnvironment,
    folder: Path,
) -> list[str]:
    """SGLang's own tests of each fix on every release, beside each cell; returns the Markdown section."""
    fixes = session.fixes
    # the matrix's pins too: the fix's own base and head decide which names it adds
    backend = releases({**session.matrix.releases, **pins})
    references = {fix.id: release_reference(fix, backend) for fix in fixes}
    replays = for_sources(fixes, sources, references, env, folder, session.say)
    agreements = agree_on_side(replays, {(c.fix, c.release): c.verdict for c in table.cells})
    for c in table.cells:
        found = agreements.get((c.fix, c.release))
        if found is not None:
            c.upstream = found.to_dict()
            c.reason = with_flag(c.reason, found)
    write_upstream_files(work, replays, folder)
    return section(replays)


def judge(fixes: list[Fix], columns: list[ReleaseColumn], observed: list[Observation]) -> ContainmentTable:
    """Every cell from the observations, then the regressions across the release order."""
    by = {(o.fix, o.side, o.probe): o for o in observed}
    cells = []
    for fix in fixes:
        for column in columns:
            r = column.version
            obs = {s.name: by[(fix.id, r, s.name)] for s in fix.probes if (fix.id, r, s.name) in by}
            paths = {name: f"observations/{fix.id}/{r}/{name}.json" for name in obs}
            cells.append(judge_cell(fix, r, obs, paths))
    releases = [c.version for c in columns]
    table = ContainmentTable(fixes=fixes, releases=columns, cells=cells)
    table.regressions = find_regressions(fixes, releases, cells)
    return table


def _lock_reference(lock: ReleaseLock | None) -> dict[str, str] | None:
    """The lock as used: its copy in the run folder, where it came from, its sha256."""
    if lock is None:
        return None
    return {"copy": LOCK_COPY, **matrix_reference(lock.path, lock.sha256)}
