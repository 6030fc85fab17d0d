"""Benchmark: the lab against the naive way, side by side in one run. A script, not a test.

    .venv/bin/python bench/bench_lab.py [--quick] [--fix N] [--env-build] [--with-subprocess]
                                        [--warm-runs N] [--against REF] [--cache DIR] [--json FILE]
    .venv/bin/python bench/bench_lab.py --render FILE      # the README table from a measurement

Measuring writes every number into one JSON document (``--json``, default
``results/bench.json``); the tables are rendered from that document, so the README's
table can be made again from the file without measuring again.

Phases, each over the same probe jobs (every selected fix, both sides, every probe),
built by the lab's own job builder from the lab's release source:

(a) naive: what asv-style tools do. Per SGLang version a fresh virtualenv gets the
    lab's pinned requirements and the release wheel (``pip install --no-deps``), from
    a local wheelhouse so pip works as usual but the network does not count; then one
    fresh process per probe (``workers`` = cores at once).
(b) lab cold: ``difflab run --no-bundle`` with an empty result cache, empty bytecode
    cache, no learned hub preload list, fresh warm servers. The shared environment and
    the unpacked sources exist (their one-off cost is reported separately).
(c) lab warm: ``--no-cache`` after (b): warm runner, bytecode cached, hub preload list
    learned, OS page cache hot; every probe runs again (no result is reused). Run
    ``--warm-runs`` times (the median is its number, held to the 10 s budget); with
    ``--against REF`` the lab's code at that commit runs the same, turn about with it.
(d) lab cache hit: the same command as (b) again; every result comes from the cache.
(e) with ``--with-subprocess``: ``--backend subprocess --no-cache``.

Then the release watch, ``difflab contains --all`` over every release in the release lock:
once to fill the result cache (and warm every release's bytecode), then warm with
``--no-cache`` (every probe on every release runs again: the budget number), then each
release alone with ``--no-cache`` (what one more release costs), then a full cache hit.

The lab phases run the real CLI in a subprocess whose ``DIFFLAB_CACHE`` is a scratch
cache whose ``envs``, ``sources`` and ``wheels`` link to the real ones (``--cache``);
the in-process measurements get the same scratch cache passed in. Memory is sampled
every 0.2 s over the measured process tree: peak sum of RSS (counts the pages forked
processes share once per process, so it overstates the warm runner) and peak sum of
PSS (shared pages split between their sharers: the honest total).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import venv
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from difflab.environment.shared import NODEPS_REQUIREMENTS, REQUIREMENTS, SharedEnvironment, spec_text
from difflab.matrix import Fix, load_matrix
from difflab.paths import cache_root, default_matrix
from difflab.report.markdown import table
from difflab.runner.base import ProbeJob
from difflab.runner.jobs import build_jobs
from difflab.runner.subprocess import SubprocessRunner
from difflab.runner.warm import WarmRunner
from difflab.source import tree
from difflab.source.release import ReleaseSource, sha256_file, unpack_sglang
from difflab.source.sides import materialise_sides

MB = 1024 * 1024
PAGE = os.sysconf("SC_PAGE_SIZE")
LAST_RUN = Path(__file__).resolve().parents[1] / "results" / "bench.json"
WARM_BUDGET_S = 10.0
"""(c) on the full default matrix, on 2 cores: the budget a warm run is held to."""
PHASES = {
    "a": "naive: a venv per version with sglang installed, a process per probe",
    "b": "lab cold (empty result cache, fresh warm servers)",
    "c": "lab warm (no result cache)",
    "d": "lab, full cache hit",
    "e": "lab `--backend subprocess`",
}
"""Each phase as the README's table names it."""


# -- measuring -----------------------------------------------------------------------
def _children_map() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry.name}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        kids.setdefault(ppid, []).append(int(entry.name))
    return kids


def tree_memory(root: int) -> tuple[int, int]:
    """(sum of RSS, sum of PSS) in bytes over ``root`` and all its descendants."""
    kids = _children_map()
    todo, rss, pss = [root], 0, 0
    while todo:
        pid = todo.pop()
        todo += kids.get(pid, [])
        try:
            rss += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    pss += int(line.split()[1]) * 1024
                    break
        except (OSError, ValueError, IndexError):
            continue
    return rss, pss


@dataclass
class Sampler:
    """Peak memory of a process tree, sampled in a background thread."""

    root: int
    interval_s: float = 0.2
    peak_rss: int = 0
    peak_pss: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> Sampler:
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join()

    def _loop(self) -> None:
        while not self._stop.is_set():
            rss, pss = tree_memory(self.root)
            self.peak_rss, self.peak_pss = max(self.peak_rss, rss), max(self.peak_pss, pss)
            self._stop.wait(self.interval_s)


def du(*paths: Path) -> int:
    """Bytes on disk under ``paths``, each hard-linked file once."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for top in paths:
        if not top.exists():
            continue
        for dirpath, _dirs, files in os.walk(top):
            for name in files:
                try:
                    st = os.lstat(os.path.join(dirpath, name))
                except OSError:
                    continue
                if (st.st_dev, st.st_ino) not in seen:
                    seen.add((st.st_dev, st.st_ino))
                    total += st.st_blocks * 512
    return total


@dataclass
class Phase:
    key: str
    wall_s: float
    peak_rss: int
    peak_pss: int
    disk: int
    note: str = ""
    observations: dict[tuple[str, str, str], tuple[str, Any]] = field(default_factory=dict)
    runs: list[float] = field(default_factory=list)
    """Every wall time of a repeated phase (``wall_s`` is their median)."""

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in dataclasses.asdict(self).items() if k != "observations"}


def say(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def run(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if proc.returncode != 0:
        raise SystemExit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-3000:]}")
    return proc


def requirement_files(into: Path) -> tuple[Path, Path]:
    """The shared environment's pinned requirement files (the naive venvs get the same pins)."""
    req, nodeps = into / REQUIREMENTS, into / NODEPS_REQUIREMENTS
    req.write_text(spec_text(REQUIREMENTS))
    nodeps.write_text(spec_text(NODEPS_REQUIREMENTS))
    return req, nodeps


# -- the jobs ------------------------------------------------------------------------
def select_fixes(matrix_path: Path, wanted: list[str] | None, quick: bool) -> list[Fix]:
    fixes = [f for f in load_matrix(matrix_path).select(wanted) if f.probes]
    if not fixes:
        raise SystemExit(f"{matrix_path}: no selected fix declares probes")
    return fixes[:1] if quick else fixes


def bench_jobs(fixes: list[Fix], backend: ReleaseSource, logs: Path) -> list[ProbeJob]:
    """The lab's own jobs for both sides of every fix (a side without a release has none)."""
    sources = materialise_sides(fixes, backend, lambda _m: None)
    return build_jobs(fixes, sources, lambda fix, side: logs / fix / side)[0]


# -- (a) the naive way -----------------------------------------------------------------
@dataclass
class NaiveEnvironment:
    """A per-version virtualenv with SGLang installed, in the shape the runners expect."""

    path: Path
    digest: str = "naive"

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"


def wheelhouse(env: SharedEnvironment, cache: Path) -> Path:
    """The pinned requirements as wheels on local disk (built once, not timed)."""
    folder = cache / "bench" / "wheelhouse"
    stamp = folder / ".complete"
    if stamp.exists():
        return folder
    say(f"building the wheelhouse {folder} (once, not timed)")
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        req, nodeps = requirement_files(Path(tmp))
        pip = [str(env.python), "-m", "pip", "wheel", "--quiet", "-w", str(folder), *env.pip_args]
        run([*pip, "-r", str(req)])
        run([*pip, "--no-deps", "-r", str(nodeps)])
    stamp.write_text("ok\n")
    return folder


def naive_venv(into: Path, wheels: Path, wheel: Path) -> dict[str, float]:
    """What a per-version tool does before its first probe: venv, requirements, SGLang."""
    times: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        req, nodeps = requirement_files(Path(tmp))
        t = time.perf_counter()
        venv.EnvBuilder(with_pip=True, clear=True).create(into)
        pip = [
            str(into / "bin" / "python"),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-index",
            "--find-links",
            str(wheels),
        ]
        run([*pip, "-r", str(req)])
        run([*pip, "--no-deps", "-r", str(nodeps)])
        times["requirements_s"] = time.perf_counter() - t
        t = time.perf_counter()
        run([*pip, "--no-deps", str(wheel)])
        times["sglang_s"] = time.perf_counter() - t
    return times


def phase_naive(
    jobs: list[ProbeJob], env: SharedEnvironment, wheel_of: dict[str, Path], scratch: Path, cache: Path, keep: bool
) -> tuple[Phase, dict[str, Any]]:
    wheels = wheelhouse(env, cache)
    releases = sorted({j.source.label for j in jobs}, key=lambda v: [int(x) for x in v.split(".")])
    empty = scratch / "empty-root"
    empty.mkdir(exist_ok=True)
    builds: dict[str, dict[str, float]] = {}
    disk = 0
    observations = {}
    wall = 0.0  # building and probing only: measuring the disk and deleting the venvs are not timed
    with Sampler(os.getpid()) as mem:
        for release in releases:
            path = scratch / f"naive-{release}"
            say(f"(a) naive: virtualenv for {release}")
            builds[release] = naive_venv(path, wheels, wheel_of[release])
            own = [
                dataclasses.replace(j, source=dataclasses.replace(j.source, root=empty))
                for j in jobs
                if j.source.label == release
            ]
            say(f"(a) naive: {len(own)} probe process(es) on {release}")
            naive = NaiveEnvironment(path)
            runner = SubprocessRunner(environment=naive, workers=os.cpu_count() or 1, cache=scratch)  # type: ignore[arg-type]
            t = time.perf_counter()
            for obs in runner.run(own):
                observations[(obs.fix, obs.side, obs.probe)] = (obs.status, obs.fields)
            builds[release]["probes_s"] = time.perf_counter() - t
            wall += sum(builds[release].values())
            disk += du(path)
            if not keep:
                shutil.rmtree(path, ignore_errors=True)
    note = f"{len(releases)} venvs, {len(jobs)} probe processes"
    return Phase("a", wall, mem.peak_rss, mem.peak_pss, disk, note, observations), {"venv_builds": builds}


# -- (b)-(e) the lab -----------------------------------------------------------------
def scratch_cache(scratch: Path, cache: Path) -> Path:
    """A cache that shares the real environment, sources and wheels, and nothing else."""
    shared = scratch / "cache"
    shared.mkdir()
    for name in ("envs", "sources", "wheels"):
        (cache / name).mkdir(parents=True, exist_ok=True)
        (shared / name).symlink_to(cache / name)
    return shared


def phase_cli(
    key: str, args: list[str], cache: Path, out: Path, disk: int, note: str, lab: Path | None = None
) -> Phase:
    """One real ``difflab run`` in a subprocess, timed end to end; ``lab``: another checkout's code."""
    cmd = [sys.executable, "-m", "difflab", "run", "--no-bundle", "--out", str(out), *args]
    say(f"({key}) {' '.join(cmd[2:])}" + (f"  [lab code: {lab}]" if lab else ""))
    started = time.perf_counter()
    env = dict(os.environ, DIFFLAB_CACHE=str(cache))  # the child's environment only
    if lab is not None:
        env["PYTHONPATH"] = str(lab / "src")
    cwd = lab or None
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=cwd)
    with Sampler(proc.pid) as mem:
        output, _ = proc.communicate()
    wall = time.perf_counter() - started
    if proc.returncode not in (0, 1) or not (out / "run.json").exists():
        raise SystemExit(f"difflab run failed ({proc.returncode}):\n{output[-4000:]}")
    observations, cached = {}, 0
    for path in (out / "observations").glob("*/*/*.json"):
        o = json.loads(path.read_text())
        cached += bool(o.get("cached"))
        if o["status"] != "unavailable":
            observations[(o["fix"], o["side"], o["probe"])] = (o["status"], o["fields"])
    return Phase(key, wall, mem.peak_rss, mem.peak_pss, disk, f"{note}; {cached} cached", observations)


def phase_warm(
    args: list[str], fixes: list[str], cache: Path, scratch: Path, disk: int, runs: int, against: Path | None
) -> tuple[Phase, dict[str, Any] | None]:
    """(c) ``runs`` times, and with ``against`` the other lab code's (c) in alternation with it.

    A warm run is CPU-bound and a shared machine's speed drifts by tens of percent within
    minutes, so one run says little: the median of several does, and a ratio against other
    code measured turn about, in the same minutes, says most.
    """
    ours: list[Phase] = []
    theirs: list[float] = []
    for i in range(runs):
        if against is not None:
            # The other code reads its own default matrix (its schema may differ), for the same fixes.
            other = phase_cli("c'", ["--no-cache", *fixes], cache, scratch / f"out-c-ref{i}", disk, "", against)
            theirs.append(other.wall_s)
        ours.append(phase_cli("c", [*args, "--no-cache"], cache, scratch / f"out-c{i}", disk, "all probes re-run"))
    walls = [p.wall_s for p in ours]
    phase = dataclasses.replace(ours[0], wall_s=statistics.median(walls), runs=walls)
    if against is None:
        return phase, None
    ratios = [mine / other for mine, other in zip(walls, theirs, strict=True)]
    return phase, {
        "runs": theirs,
        "median_s": statistics.median(theirs),
        "ratio_median": statistics.median(ratios),
        "ratios": ratios,
    }


def lab_at(ref: str, into: Path) -> Path:
    """The lab's own code at a git commit (``src``, ``probes``, ``matrices``), for a side-by-side run."""
    repo = Path(__file__).resolve().parents[1]
    found = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"],
        capture_output=True,
        text=True,
    )
    if found.returncode != 0:
        raise SystemExit(f"--against {ref}: no such commit in {repo}")
    into.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(repo), "archive", "--format=tar", found.stdout.strip(), "src", "probes", "matrices"],
        capture_output=True,
    )
    if archive.returncode != 0:
        raise SystemExit(f"--against {ref}: git archive failed: {archive.stderr.decode(errors='replace').strip()}")
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


def contains_cli(args: list[str], cache: Path, out: Path) -> tuple[float, dict[str, Any]]:
    """Wall seconds of one ``difflab contains --no-bundle`` and its contains.json."""
    cmd = [sys.executable, "-m", "difflab", "contains", "--no-bundle", "--out", str(out), *args]
    say(" ".join(cmd[2:]))
    env = dict(os.environ, DIFFLAB_CACHE=str(cache))
    started = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if proc.returncode not in (0, 1) or not (out / "contains.json").exists():
        raise SystemExit(f"difflab contains failed ({proc.returncode}):\n{(proc.stdout + proc.stderr)[-4000:]}")
    return wall, json.loads((out / "contains.json").read_text())


def phase_contains(matrix: Path, cache: Path, scratch: Path) -> dict[str, Any]:
    """``contains --all``: fill, warm without the result cache (total and per release), full cache hit."""
    common = ["--matrix", str(matrix), "--all"]
    fill_s, doc = contains_cli(common, cache, scratch / "contains-fill")
    releases = [r["version"] for r in doc["releases"]]
    warm_s, warm_doc = contains_cli([*common, "--no-cache"], cache, scratch / "contains-warm")
    per_release = {}
    for release in releases:
        wall, _ = contains_cli([*common, "--no-cache", "--release", release], cache, scratch / f"contains-{release}")
        per_release[release] = wall
    hit_s, _ = contains_cli(common, cache, scratch / "contains-hit")
    return {
        "releases": releases,
        "cells": len(warm_doc["cells"]),
        "verdicts": {f"{c['fix']}@{c['release']}": c["verdict"] for c in warm_doc["cells"]},
        "fill_s": fill_s,
        "warm_s": warm_s,
        "per_release_s": per_release,
        "cache_hit_s": hit_s,
        "load": os.getloadavg(),
    }


def marginal(jobs: list[ProbeJob], env: SharedEnvironment, cache: Path, logs: Path, reps: int = 5) -> dict[str, Any]:
    """Seconds one more probe adds on a warm server: the steady-state gap between two probes finishing.

    One server, ``reps`` copies of the probes of the release with the most probes: the time from
    the first probe's result to the last one's, over the probes in between, so the server import
    and the first fork are not in it.
    """
    by_release: dict[str, list[ProbeJob]] = {}
    for j in jobs:
        by_release.setdefault(j.source.label, []).append(j)
    release, own = max(by_release.items(), key=lambda kv: len(kv[1]))
    batch = [
        dataclasses.replace(j, side=f"{j.side}-{k}", log_path=logs / "marginal" / f"{k}-{i}.log")
        for k in range(reps)
        for i, j in enumerate(own)
    ]
    out: dict[str, Any] = {"release": release, "probes": len(batch)}
    for parallel in sorted({1, os.cpu_count() or 1}):
        done: list[float] = []
        with WarmRunner(environment=env, workers=1, parallel=parallel, cache=cache) as runner:
            observed = runner.run(batch, on_done=lambda _obs, done=done: done.append(time.perf_counter()))
            walls = [w for w in runner.stats["probe_wall_s"] if w is not None]
        out[f"per_probe_s_parallel{parallel}"] = (done[-1] - done[0]) / (len(done) - 1)
        if parallel == 1:
            out["fork_to_exit_mean_s"] = statistics.mean(walls)
            out["observe_mean_s"] = statistics.mean(o.duration_s for o in observed)
    return out


def profile_warm(jobs: list[ProbeJob], env: SharedEnvironment, cache: Path) -> dict[str, Any]:
    """Where a warm run's time goes: the same jobs in-process, with the runner's own timings."""
    t = time.perf_counter()
    with WarmRunner(environment=env, cache=cache) as runner:
        observed = runner.run(jobs)
        total = time.perf_counter() - t
        stats = runner.stats
    return {
        "total_s": total,
        "hub": stats["hubs"][0],
        "servers": stats["servers"],
        "probes_fork_to_exit_s": sum(w for w in stats["probe_wall_s"] if w),
        "observe_s": sum(o.duration_s for o in observed),
    }


PAIR_PROBES = ("pr36988_pd_incident", "pr41404_pd_in_flight", "pr41404_pd_failed_room_reuse")
"""The CPU prefill/decode pair's scenarios (docs/leak.md): at most 1 s per release on the warm default matrix."""
PAIR_BUDGET_S = 1.0
FUZZ_BUDGET = 50.0
"""`difflab fuzz`: schedules per second per core on the warm back end, at least."""


def release_jobs(matrix_path: Path, release: str, backend: ReleaseSource, logs: Path) -> list[ProbeJob]:
    """What `contains` runs on one release: every probe of every fix, on that release."""
    from difflab.paths import probes_dir

    matrix = load_matrix(matrix_path)
    source = backend.release(release)
    names = list(dict.fromkeys(spec.name for fix in matrix.fixes for spec in fix.probes))
    return [
        ProbeJob("contains", name, release, source, probes_dir() / f"{name}.py", logs / release / f"{name}.log")
        for name in names
        if (probes_dir() / f"{name}.py").is_file()
    ]


def pair_cost(matrix_path: Path, env: SharedEnvironment, cache: Path, logs: Path, reps: int = 3) -> dict[str, Any]:
    """Per release: the warm default matrix with and without the pair probes, turn about, side by side.

    ``added_s`` is the median difference of the two warm runs' walls (what the pair adds to the
    matrix); ``observe_s`` the pair probes' own ``observe`` time in the full run.
    """
    matrix = load_matrix(matrix_path)
    backend = ReleaseSource(matrix.releases, cache=cache)
    out: dict[str, Any] = {"budget_s": PAIR_BUDGET_S, "reps": reps, "releases": {}}
    for release in sorted(matrix.releases):
        full = release_jobs(matrix_path, release, backend, logs)
        without = [j for j in full if j.probe not in PAIR_PROBES]
        walls: dict[str, list[float]] = {"with": [], "without": []}
        observe: list[float] = []
        with WarmRunner(environment=env, cache=cache) as runner:
            runner.run(full)  # warm the hub for this release: imports and bytecode are not the pair's cost
            for _ in range(reps):
                for key, jobs in (("with", full), ("without", without)):
                    t = time.perf_counter()
                    observed = runner.run(jobs)
                    walls[key].append(time.perf_counter() - t)
                    if key == "with":
                        observe.append(sum(o.duration_s for o in observed if o.probe in PAIR_PROBES))
        added = statistics.median(w - wo for w, wo in zip(walls["with"], walls["without"], strict=True))
        out["releases"][release] = {
            "with_s": statistics.median(walls["with"]),
            "without_s": statistics.median(walls["without"]),
            "added_s": added,
            "observe_s": statistics.median(observe),
            "probes": len(full),
        }
    out["load"] = os.getloadavg()
    return out


def fuzz_rate(matrix_path: Path, releases: list[str], schedules: int, out: Path) -> dict[str, Any]:
    """`difflab fuzz` on the warm back end, per release: schedules per CPU second (per core) and per wall second."""
    from difflab.progress import Reporter
    from difflab.workflows.fuzz import FuzzRequest, execute

    rows: dict[str, Any] = {}
    for release in releases:
        req = FuzzRequest(release=release, schedules=schedules, seed=1, out=out / f"fuzz-{release}", matrix=matrix_path)
        req.argv = []
        outcome = execute(req, Reporter())
        doc = json.loads((outcome.out_dir / "fuzz.json").read_text())
        rows[release] = {
            "runs": doc["runs"],
            "per_core": doc["schedules_per_second_per_core"],
            "per_wall_s": doc.get("schedules_per_wall_second"),
            "leaks": len(doc["leaks"]),
        }
    return {"budget": FUZZ_BUDGET, "schedules": schedules, "releases": rows, "load": os.getloadavg()}


def render_pair(pair: dict[str, Any] | None, fuzz: dict[str, Any] | None) -> list[str]:
    """The pair's cost per release beside its budget, and the search's rate beside its budget."""
    lines: list[str] = []
    if pair:
        rows = [
            (
                r,
                f"{v['without_s']:.2f}",
                f"{v['with_s']:.2f}",
                f"{v['added_s']:+.2f}",
                f"{v['observe_s']:.2f}",
                "within" if v["added_s"] <= pair["budget_s"] else "OVER",
            )
            for r, v in pair["releases"].items()
        ]
        head = ("release", "matrix without pair s", "with pair s", "added s", "pair observe s", "1 s budget")
        lines += ["", *table(head, rows, ("---", "---:", "---:", "---:", "---:", "---"))]
    if fuzz:
        rows = [
            (
                r,
                str(v["runs"]),
                f"{v['per_core']:.0f}",
                f"{v['per_wall_s']:.0f}" if v.get("per_wall_s") else "",
                str(v["leaks"]),
                "within" if v["per_core"] >= fuzz["budget"] else "UNDER",
            )
            for r, v in fuzz["releases"].items()
        ]
        head = (
            "fuzz release",
            "schedules run",
            "per core /s",
            "per wall s /s",
            "leaks",
            f"{fuzz['budget']:.0f}/s budget",
        )
        lines += ["", *table(head, rows, ("---", "---:", "---:", "---:", "---:", "---"))]
    return lines


def source_check(releases: list[str], matrix: Any, cache: Path, reps: int = 5) -> dict[str, float]:
    """What checking the cached release trees before use costs per run, next to re-hashing them all.

    Both on the same trees, best of ``reps``: the stat-signature check every run does, and the
    full content comparison it replaces (which runs only when a signature moved).
    """
    backend = ReleaseSource(matrix.releases, cache=cache)
    trees = [(backend.release(r).root, matrix.releases[r].sha256) for r in releases]

    def best(work: Any) -> float:
        times = []
        for _ in range(reps):
            started = time.perf_counter()
            work()
            times.append(time.perf_counter() - started)
        return min(times)

    def check_all() -> None:
        for root, sha in trees:
            assert (found := tree.check(root, sha)) is not None and found.intact

    def rehash_all() -> None:
        for root, sha in trees:
            found = tree.check(root, sha)
            assert found is not None
            expected = tree.read_listing(root, found.digest)
            assert expected is not None and tree.compare(root, expected) == []

    return {"check_s": best(check_all), "rehash_s": best(rehash_all)}


def unpack_time(wheels: list[Path], scratch: Path) -> float:
    """What materialising the sources costs once downloaded: the release source's own unpacker."""
    t = time.perf_counter()
    for wheel in wheels:
        unpack_sglang(wheel, scratch / "unpack" / wheel.stem, sha256_file(wheel))
    return time.perf_counter() - t


def env_build_time(env: SharedEnvironment, cache: Path, scratch: Path) -> float:
    """The one-off shared environment, built by the lab's own code from the local wheelhouse."""
    wheels = wheelhouse(env, cache)
    fresh = SharedEnvironment(cache=scratch / "envcache", pip_args=["--no-index", "--find-links", str(wheels)])
    t = time.perf_counter()
    fresh.ensure()
    took = time.perf_counter() - t
    shutil.rmtree(scratch / "envcache", ignore_errors=True)
    return took


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Every phase and every side measurement, as one JSON-ready document."""
    cache = args.cache.resolve()
    fixes = select_fixes(args.matrix, args.fixes, args.quick)
    matrix = load_matrix(args.matrix)
    releases = sorted({getattr(f, s).release for f in fixes for s in ("base", "head") if getattr(f, s).release})
    say(f"{len(fixes)} fix(es), releases {', '.join(releases)}; {os.cpu_count()} cores; load {os.getloadavg()[0]:.1f}")
    backend = ReleaseSource(matrix.releases, cache=cache)
    wheel_of = {r: cache / "wheels" / matrix.releases[r].file for r in releases}
    env = SharedEnvironment(cache=cache).ensure()
    scratch = Path(tempfile.mkdtemp(prefix="difflab-bench-"))
    common = ["--matrix", str(args.matrix), *(a for f in fixes for a in ("--fix", f.id))]
    try:
        against = lab_at(args.against, scratch / "against") if args.against else None  # a bad ref stops it here
        jobs = bench_jobs(fixes, backend, scratch / "logs")
        results: dict[str, Any] = {"cores": os.cpu_count(), "jobs": len(jobs), "releases": releases}
        results["load_before"] = os.getloadavg()
        phases: list[Phase] = []
        if not args.skip_naive:
            naive, info = phase_naive(jobs, env, wheel_of, scratch, cache, args.keep)
            phases.append(naive)
            results |= info
        lab = scratch_cache(scratch, cache)
        disk_static = du(env.path, *{j.source.root for j in jobs})
        cold = phase_cli("b", common, lab, scratch / "out-b", 0, "shared env + sources exist")
        cold.disk = lab_disk = disk_static + du(*(lab / n for n in ("pycache", "results", "warm", "childlib")))
        phases.append(cold)
        fix_args = [a for f in fixes for a in ("--fix", f.id)]
        warm, side_by_side = phase_warm(common, fix_args, lab, scratch, lab_disk, args.warm_runs, against)
        phases.append(warm)
        results["warm_budget_s"] = WARM_BUDGET_S
        if side_by_side is not None:
            results["against"] = {"ref": args.against, **side_by_side}
        phases.append(phase_cli("d", common, lab, scratch / "out-d", lab_disk, "nothing re-runs"))
        if args.with_subprocess:
            e_args = [*common, "--no-cache", "--backend", "subprocess"]
            phases.append(phase_cli("e", e_args, lab, scratch / "out-e", lab_disk, "a fresh process per probe"))
        if not args.skip_contains:
            say("the release watch: contains --all over every locked release")
            results["contains"] = phase_contains(args.matrix, lab, scratch)
        say("profile of a warm run, and the marginal cost per probe on a warm server")
        # The sources as the lab phases saw them (through the scratch cache), so their bytecode is warm.
        lab_env = SharedEnvironment(cache=lab)
        lab_jobs = bench_jobs(fixes, ReleaseSource(matrix.releases, cache=lab), scratch / "logs-lab")
        results["profile"] = profile_warm(lab_jobs, lab_env, lab)
        results["marginal"] = marginal(lab_jobs, lab_env, lab, scratch / "logs-lab")
        results["unpack_s"] = unpack_time(list(wheel_of.values()), scratch)
        results["source_check"] = source_check(releases, matrix, cache)
        if not args.skip_pair:
            say("the CPU pair: its cost per release on the warm matrix, and the schedule search's rate")
            results["pair"] = pair_cost(args.matrix, lab_env, lab, scratch / "logs-pair")
            results["fuzz"] = fuzz_rate(args.matrix, FUZZ_RELEASES, FUZZ_SCHEDULES, scratch)
        if args.env_build:
            say("one-off: building a shared environment from the wheelhouse")
            results["env_build_s"] = env_build_time(env, cache, scratch)
        results["load_after"] = os.getloadavg()
        reference = phases[0]
        results["identical_to"] = reference.key
        results["identical"] = {p.key: p.observations == reference.observations for p in phases[1:]}
        results["phases"] = [p.as_dict() for p in phases]
        return results
    finally:
        if args.keep:
            say(f"kept {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)


FUZZ_RELEASES = ["0.5.19", "0.5.21"]  # one that leaks (shrinking included), one that does not
FUZZ_SCHEDULES = 100


def measure_pair(args: argparse.Namespace) -> dict[str, Any]:
    """``--pair-only``: the pair's cost per release and the search's rate, from the real caches."""
    cache = args.cache.resolve()
    env = SharedEnvironment(cache=cache).ensure()
    scratch = Path(tempfile.mkdtemp(prefix="difflab-bench-pair-"))
    try:
        results: dict[str, Any] = {"cores": os.cpu_count(), "load_before": os.getloadavg()}
        results["pair"] = pair_cost(args.matrix, env, cache, scratch / "logs")
        results["fuzz"] = fuzz_rate(args.matrix, FUZZ_RELEASES, FUZZ_SCHEDULES, scratch)
        return results
    finally:
        if not args.keep:
            shutil.rmtree(scratch, ignore_errors=True)


# -- rendering ---------------------------------------------------------------------------
def render(results: dict[str, Any]) -> str:
    """The README's table and the lines under it, from a measurement document."""
    phases = results["phases"]
    naive = next((p for p in phases if p["key"] == "a"), None)
    rows = [
        (
            f"({p['key']}) {PHASES[p['key']]}",
            f"{p['wall_s']:.1f}",
            f"{p['wall_s'] / naive['wall_s']:.1%}".replace("%", " %") if naive and p is not naive else "",
            f"{p['peak_pss'] / MB:.0f}",
            f"{p['disk'] / MB:.0f}",
        )
        for p in phases
    ]
    aligned = ("---", "---:", "---:", "---:", "---:")
    lines = table(("phase", "wall s", "vs naive", "peak ΣPSS MB", "disk MB"), rows, aligned)
    m, cores = results["marginal"], results["cores"]
    cost = f"Per-probe marginal cost {m['per_probe_s_parallel1'] * 1000:.0f} ms"
    if cores > 1 and f"per_probe_s_parallel{cores}" in m:
        cost += f" ({m[f'per_probe_s_parallel{cores}'] * 1000:.0f} ms {cores} at a time)"
    once = [f"unpacking {len(results['releases'])} release(s) {results['unpack_s']:.1f} s"]
    check = results.get("source_check")
    per_run = (
        f" Every run checks the cached release trees before use: {check['check_s'] * 1000:.0f} ms for "
        f"{len(results['releases'])} (re-hashing them would take {check['rehash_s'] * 1000:.0f} ms)."
        if check
        else ""
    )
    if "env_build_s" in results:
        once.insert(0, f"building the shared environment {results['env_build_s']:.1f} s")
    same = ", ".join(f"({k}) {'yes' if v else 'NO'}" for k, v in results["identical"].items())
    lines += [
        "",
        f"{cost}. One-off: {', '.join(once)}.{per_run}",
        "",
        f"Observations identical to ({results['identical_to']}): {same}",
    ]
    lines += render_warm(results)
    if "contains" in results:
        lines += ["", *render_contains(results["contains"])]
    lines += render_pair(results.get("pair"), results.get("fuzz"))
    return "\n".join(lines) + "\n"


def render_warm(results: dict[str, Any]) -> list[str]:
    """(c)'s spread, its budget, and the side-by-side ratio against other lab code."""
    warm = next((p for p in results["phases"] if p["key"] == "c"), None)
    if warm is None or not warm.get("runs"):
        return []
    runs, budget = warm["runs"], results.get("warm_budget_s", WARM_BUDGET_S)
    spread = f"{min(runs):.1f}–{max(runs):.1f}"
    met = "within" if warm["wall_s"] < budget else "OVER"
    lines = ["", f"(c) median of {len(runs)} runs {warm['wall_s']:.1f} s ({spread}): {met} the {budget:.0f} s budget."]
    other = results.get("against")
    if other:
        lines.append(
            f"Turn about with the lab at {other['ref']}: {other['median_s']:.1f} s median; "
            f"this code / that code = {other['ratio_median']:.2f} (median of {len(other['ratios'])} pairs)."
        )
    return lines


def render_contains(c: dict[str, Any]) -> list[str]:
    """The release watch's lines: warm total, each release alone, the cache hit."""
    releases = c["releases"]
    rows = [(f"`contains --release {r} --no-cache`", f"{c['per_release_s'][r]:.1f}") for r in releases]
    rows.append((f"`contains --all --no-cache` ({len(releases)} releases, {c['cells']} cells)", f"{c['warm_s']:.1f}"))
    rows.append(("`contains --all`, full cache hit", f"{c['cache_hit_s']:.1f}"))
    lines = table(("release watch, warm", "wall s"), rows, ("---", "---:"))
    load = ", ".join(f"{x:.1f}" for x in c["load"])
    return [*lines, "", f"Releases {releases[0]}–{releases[-1]}; load average after: {load}."]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--matrix", type=Path, default=default_matrix())
    parser.add_argument("--fix", action="append", dest="fixes", metavar="N")
    parser.add_argument("--quick", action="store_true", help="one fix only")
    parser.add_argument("--skip-naive", action="store_true", help="lab phases only (no ratios)")
    parser.add_argument("--env-build", action="store_true", help="also time building the shared environment")
    parser.add_argument(
        "--with-subprocess",
        action="store_true",
        help="also time the lab's one-process-per-probe back end (--backend subprocess --no-cache)",
    )
    parser.add_argument("--skip-contains", action="store_true", help="skip the release watch (contains --all)")
    parser.add_argument("--skip-pair", action="store_true", help="skip the CPU pair's cost and the fuzz rate")
    parser.add_argument(
        "--pair-only",
        action="store_true",
        help="only the CPU pair's cost per release and `difflab fuzz`'s rate (no other phase)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the scratch folder (venvs, runs)")
    parser.add_argument("--warm-runs", type=int, default=5, metavar="N", help="(c) N times; its wall is the median")
    parser.add_argument(
        "--against",
        metavar="REF",
        help="also time the lab's code at git REF warm, turn about with (c), and print the ratio",
    )
    parser.add_argument(
        "--cache", type=Path, default=None, help="the lab cache to measure from (default: $DIFFLAB_CACHE)"
    )
    parser.add_argument("--json", type=Path, default=LAST_RUN, help="where the numbers go (default: %(default)s)")
    parser.add_argument("--render", type=Path, metavar="FILE", help="only render the tables from a measurement")
    args = parser.parse_args(argv)
    if args.warm_runs < 1:
        parser.error(f"--warm-runs must be at least 1, got {args.warm_runs}")
    if args.render:
        document = json.loads(args.render.read_text())
        text = (
            render(document)
            if "phases" in document
            else "\n".join(render_pair(document.get("pair"), document.get("fuzz")))
        )
        print(text.strip("\n") + "\n", end="")
        return 0
    args.cache = args.cache or cache_root()
    results = measure_pair(args) if args.pair_only else measure(args)
    args.json.write_text(json.dumps(results, indent=2, default=str) + "\n")
    say(f"numbers in {args.json}")
    print(
        render(results) if "phases" in results else "\n".join(render_pair(results["pair"], results["fuzz"])) + "\n",
        end="",
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
