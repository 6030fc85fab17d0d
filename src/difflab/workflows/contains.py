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

from difflab.bundle import seal
from difflab.diff.containment import ContainmentTable, ReleaseColumn, find_regressions, judge_cell, release_order
from difflab.environment.plan import EnvironmentPlan, Need, load_needs, pin_versions, plan_environments
from difflab.environment.shared import SharedEnvironment, pinned_texts
from difflab.errors import ConfigError
from difflab.files.atomic import check_out, results_folder
from difflab.matrix import Matrix, load_matrix
from difflab.matrix.model import ReleasePin
from difflab.observation import Observation
from difflab.paths import default_release_lock, default_results
from difflab.preflight.defaults import read_defaults
from difflab.progress import Reporter
from difflab.provenance import probes_record
from difflab.report.containment import write_files
from difflab.report.family import write_family
from difflab.report.grid import write_html
from difflab.report.record import RunRecord, folder_stamp, is_run_folder, matrix_reference, stamp, utc_now
from difflab.runner import Runner, build_runner
from difflab.runner.jobs import check_probe_files
from difflab.source.base import MaterialisedSource
from difflab.source.release import ReleaseSource
from difflab.source.release_lock import ReleaseLock, agree_with_matrix, load_lock, parse_floor
from difflab.upstream_tests import agree_on_side, for_sources, release_reference, section, tests_dir, with_flag
from difflab.upstream_tests import write_files as write_upstream_files
from difflab.workflows.observe import ProbeOptions, observe

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
class ContainsOutcome:
    table: ContainmentTable
    out_dir: Path
    exit_code: int
    environments: list[EnvironmentPlan]


EnvironmentFactory = Callable[[tuple[str, ...]], SharedEnvironment]
RunnerFactory = Callable[[SharedEnvironment], Runner]


def default_out() -> Path:
    return default_results() / f"contains-{folder_stamp(utc_now())}"


def choose_releases(
    req: ContainsRequest, matrix: Matrix
) -> tuple[dict[str, ReleasePin], list[ReleaseColumn], ReleaseLock | None]:
    """The pins to judge, and each one's column (new: not pinned by hand in the matrix)."""
    lock: ReleaseLock | None = None
    if req.all_releases:
        lock = load_lock(req.lock, missing_ok=False)
        agree_with_matrix(lock, matrix.releases, matrix.path)
        available = {v: lock.releases[v].pin() for v in lock.versions}
        where = f"{lock.path} (run `difflab releases --lock` to pin new releases)"
    else:
        available = dict(matrix.releases)
        where = f"{matrix.path} [releases]"
    if req.since:
        floor = Version(parse_floor(req.since))
        available = {v: p for v, p in available.items() if Version(v) >= floor}
    wanted = req.releases or release_order(list(available))
    unknown = [r for r in wanted if r not in available]
    if unknown:
        raise ConfigError(f"release(s) {unknown} are not pinned in {where}")
    if not wanted:
        raise ConfigError(f"no release to check in {where}" + (f" from {req.since}" if req.since else ""))
    columns = []
    for version in release_order(wanted):
        pin = available[version]
        locked = lock.releases.get(version) if lock else None
        columns.append(
            ReleaseColumn(
                version=version,
                file=pin.file,
                sha256=pin.sha256,
                new=version not in matrix.releases,
                first_seen=locked.first_seen if locked else None,
                yanked=locked.yanked if locked else None,
                prerelease=locked.prerelease if locked else Version(version).is_prerelease,
            )
        )
    return {c.version: available[c.version] for c in columns}, columns, lock


def shared_pins() -> dict[str, Version]:
    """Every exact pin of the shared environment (both requirement files)."""
    main, nodeps = pinned_texts()
    return pin_versions([*main.splitlines(), *nodeps.splitlines()])


def execute(
    req: ContainsRequest,
    reporter: Reporter | None = None,
    *,
    needs: list[Need] | None = None,
    environments: EnvironmentFactory | None = None,
    runners: RunnerFactory | None = None,
) -> ContainsOutcome:
    """Judge every fix on every chosen release and write the sealed run folder."""
    reporter = reporter or Reporter()
    record = RunRecord(command="contains", argv=req.argv)
    matrix = load_matrix(req.matrix)
    fixes = matrix.select(req.fixes)
    check_probe_files(fixes, matrix.path)
    folder = tests_dir(req.upstream_tests)  # a bad folder is refused before the environment is built
    record.fixes = [f.id for f in fixes]
    pins, columns, lock = choose_releases(req, matrix)
    plans = plan_environments(list(pins), load_needs() if needs is None else needs, shared_pins())
    make_env = environments or (lambda p: SharedEnvironment(pins=p))
    make_runner = runners or (lambda env: build_runner(req.runner, env, req.use_cache, reporter.say))
    for version in (v for v in pins if v not in matrix.releases):
        reporter.say(f"new release {version}: not pinned in the matrix; its expectations follow the pins' order")
    out = (req.out or default_out()).resolve()
    check_out(out, force=req.force, ours=is_run_folder)  # before the environment is built
    with results_folder(out, force=req.force, ours=is_run_folder) as work:
        backend = ReleaseSource(pins)
        sources: dict[str, MaterialisedSource] = {v: backend.release(v) for v in pins}
        observed: list[Observation] = []
        env_docs: list[dict[str, Any]] = []
        described: list[dict[str, Any]] = []
        env_of: dict[str, str] = {}
        for plan in plans:
            env = make_env(plan.pins)
            env.ensure(progress=reporter.say)
            runner = make_runner(env)
            try:
                jobs = {(fix.id, v): sources[v] for v in plan.releases for fix in fixes}
                observed += observe(fixes, jobs, runner, work, reporter, req.timeout_s)
                described.append(runner.describe())
            finally:
                close = getattr(runner, "close", None)
                if callable(close):
                    close()
            env_docs.append(env.document() | {"releases": list(plan.releases)})
            env_of |= dict.fromkeys(plan.releases, env.digest)
        columns = [dataclasses.replace(c, environment=env_of[c.version]) for c in columns]
        table = judge(fixes, columns, observed)
        appendix: list[str] = []
        if folder is not None:
            env = make_env(plans[0].pins) if plans else SharedEnvironment()
            matrix_backend = ReleaseSource({**matrix.releases, **pins})
            appendix = replay_upstream_tests(work, fixes, sources, matrix_backend, table, env, folder, reporter)
        planned = [{"digest": d["digest"], "pins": d.get("pins", []), "releases": d["releases"]} for d in env_docs]
        extra = {"environments": planned, "lock": _lock_reference(lock)}
        per_release = {c.version: {x.fix: x.verdict for x in table.cells if x.release == c.version} for c in columns}
        defaults = {v: read_defaults(s.root) for v, s in sources.items()}  # the family's answer, per release
        appendix = [*write_family(work, matrix, per_release, defaults), *appendix]
        write_files(work, table, extra, appendix)
        write_html(work, table, {"started": stamp(record.started), "exit_code": table.exit_code})
        if lock is not None:
            shutil.copyfile(lock.path, work / LOCK_COPY)
        record.details = {
            "releases": [c.version for c in columns],
            "new_releases": [c.version for c in table.new_releases],
            "regressions": len(table.regressions),
            "source_kind": "release",
            "runner": described[0] if described else {},
            "runners": described,
            "sources": {v: s.identity for v, s in sources.items()},
            "environment_digest": env_docs[0]["digest"],
            "lock": _lock_reference(lock),
            "probes": probes_record(),
        }
        environment = {**env_docs[0], "environments": env_docs}
        record.write(work, table.exit_code, matrix=(matrix.path, matrix.sha256), environment=environment)
        if req.bundle:
            seal(work, key=req.key, echo=reporter.say)
    return ContainsOutcome(table=table, out_dir=out, exit_code=table.exit_code, environments=plans)


def replay_upstream_tests(
    work: Path,
    fixes: list[Any],
    sources: dict[str, MaterialisedSource],
    backend: ReleaseSource,
    table: ContainmentTable,
    env: SharedEnvironment,
    folder: Path,
    reporter: Reporter,
) -> list[str]:
    """SGLang's own tests of each fix on every release, beside each cell; returns the Markdown section."""
    # ``backend`` knows the matrix's pins too: the fix's own base and head decide which names it adds
    references = {fix.id: release_reference(fix, backend) for fix in fixes}
    replays = for_sources(fixes, sources, references, env, folder, reporter.say)
    agreements = agree_on_side(replays, {(c.fix, c.release): c.verdict for c in table.cells})
    for c in table.cells:
        found = agreements.get((c.fix, c.release))
        if found is not None:
            c.upstream = found.to_dict()
            c.reason = with_flag(c.reason, found)
    write_upstream_files(work, replays, folder)
    return section(replays)


def judge(fixes: list[Any], columns: list[ReleaseColumn], observed: list[Observation]) -> ContainmentTable:
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
