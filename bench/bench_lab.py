"""Benchmark: the lab against the naive way, side by side in one run. A script, not a test.

    .venv/bin/python bench/bench_lab.py [--quick] [--fix N] [--env-build] [--with-subprocess]

Phases, each over the same probe jobs (every selected fix, both sides, every probe):

(a) naive: what asv-style tools do. Per SGLang version a fresh virtualenv gets the
    lab's pinned requirements and the release wheel (``pip install --no-deps``), from
    a local wheelhouse so pip works as usual but the network does not count; then one
    fresh process per probe (``workers`` = cores at once).
(b) lab cold: ``difflab run --no-bundle`` with an empty result cache, empty bytecode
    cache, no learned hub preload list, fresh warm servers. The shared environment and
    the unpacked sources exist (their one-off cost is reported separately).
(c) lab warm: ``--no-cache`` after (b): warm runner, bytecode cached, hub preload list
    learned, OS page cache hot; every probe runs again (no result is reused).
(d) lab cache hit: the same command as (b) again; every result comes from the cache.

The lab phases run the real CLI in a subprocess with ``DIFFLAB_CACHE`` pointing at a
scratch cache whose ``envs``, ``sources`` and ``wheels`` link to the real ones. Memory
is sampled every 0.2 s over the measured process tree: peak sum of RSS (counts the
pages forked processes share once per process, so it overstates the warm runner) and
peak sum of PSS (shared pages split between their sharers: the honest total).
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
import zipfile
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from difflab.environment.shared import NODEPS_REQUIREMENTS, REQUIREMENTS, SharedEnvironment
from difflab.matrix import Fix, load_matrix
from difflab.paths import cache_root, default_matrix, probes_dir
from difflab.runner.base import ProbeJob
from difflab.runner.subprocess import SubprocessRunner
from difflab.runner.warm import WarmRunner
from difflab.source.base import MaterialisedSource
from difflab.source.release import ReleaseSource

MB = 1024 * 1024
PAGE = os.sysconf("SC_PAGE_SIZE")


# -- measuring -----------------------------------------------------------------------
def spec_text(name: str) -> str:
    """The shared environment's pinned requirement files (the naive venvs get the same pins)."""
    return resources.files("difflab.environment").joinpath(name).read_text()


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
    label: str
    wall_s: float
    peak_rss: int
    peak_pss: int
    disk: int
    note: str = ""
    observations: dict[tuple[str, str, str], tuple[str, Any]] = field(default_factory=dict)


def say(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def run(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if proc.returncode != 0:
        raise SystemExit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-3000:]}")
    return proc


# -- the jobs ------------------------------------------------------------------------
def select_fixes(matrix_path: Path, wanted: list[str] | None, quick: bool) -> list[Fix]:
    fixes = [f for f in load_matrix(matrix_path).select(wanted) if f.probes]
    if not fixes:
        raise SystemExit(f"{matrix_path}: no selected fix declares probes")
    return fixes[:1] if quick else fixes


def bench_jobs(fixes: list[Fix], sources: dict[str, MaterialisedSource], logs: Path) -> list[ProbeJob]:
    jobs = []
    for fix in fixes:
        for side in ("base", "head"):
            release = getattr(fix, side).release
            if not release:
                continue
            for spec in fix.probes:
                jobs.append(
                    ProbeJob(
                        fix_id=fix.id,
                        probe=spec.name,
                        side=side,
                        source=sources[release],
                        probe_file=probes_dir() / f"{spec.name}.py",
                        log_path=logs / fix.id / side / f"{spec.name}.log",
                    )
                )
    return jobs


# -- (a) the naive way -----------------------------------------------------------------
@dataclass
class NaiveEnvironment:
    """A per-version virtualenv with SGLang installed, in the shape the runners expect."""

    path: Path
    digest: str = "naive"

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"


def wheelhouse(env: SharedEnvironment) -> Path:
    """The pinned requirements as wheels on local disk (built once, not timed)."""
    folder = cache_root() / "bench" / "wheelhouse"
    stamp = folder / ".complete"
    if stamp.exists():
        return folder
    say(f"building the wheelhouse {folder} (once, not timed)")
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        req, nodeps = Path(tmp) / REQUIREMENTS, Path(tmp) / NODEPS_REQUIREMENTS
        req.write_text(spec_text(REQUIREMENTS))
        nodeps.write_text(spec_text(NODEPS_REQUIREMENTS))
        pip = [str(env.python), "-m", "pip", "wheel", "--quiet", "-w", str(folder), *env.pip_args]
        run([*pip, "-r", str(req)])
        run([*pip, "--no-deps", "-r", str(nodeps)])
    stamp.write_text("ok\n")
    return folder


def naive_venv(into: Path, wheels: Path, wheel: Path) -> dict[str, float]:
    """What a per-version tool does before its first probe: venv, requirements, SGLang."""
    times: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        req, nodeps = Path(tmp) / REQUIREMENTS, Path(tmp) / NODEPS_REQUIREMENTS
        req.write_text(spec_text(REQUIREMENTS))
        nodeps.write_text(spec_text(NODEPS_REQUIREMENTS))
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
    jobs: list[ProbeJob], env: SharedEnvironment, wheel_of: dict[str, Path], scratch: Path, keep: bool
) -> tuple[Phase, dict[str, Any]]:
    wheels = wheelhouse(env)
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
            runner = SubprocessRunner(environment=NaiveEnvironment(path), workers=os.cpu_count() or 1)  # type: ignore[arg-type]
            t = time.perf_counter()
            for obs in runner.run(own):
                observations[(obs.fix, obs.side, obs.probe)] = (obs.status, obs.fields)
            builds[release]["probes_s"] = time.perf_counter() - t
            wall += sum(builds[release].values())
            disk += du(path)
            if not keep:
                shutil.rmtree(path, ignore_errors=True)
    note = f"{len(releases)} venvs, {len(jobs)} probe processes"
    return Phase(
        "a", "naive: venv per version + process per probe", wall, mem.peak_rss, mem.peak_pss, disk, note, observations
    ), {"venv_builds": builds}


# -- (b)-(d) the lab -----------------------------------------------------------------
def scratch_cache(scratch: Path) -> Path:
    """A cache that shares the real environment, sources and wheels, and nothing else."""
    cache = scratch / "cache"
    cache.mkdir()
    real = cache_root()
    for name in ("envs", "sources", "wheels"):
        (real / name).mkdir(parents=True, exist_ok=True)
        (cache / name).symlink_to(real / name)
    return cache


def phase_cli(key: str, label: str, args: list[str], cache: Path, out: Path, disk: int, note: str) -> Phase:
    cmd = [sys.executable, "-m", "difflab", "run", "--no-bundle", "--out", str(out), *args]
    env = dict(os.environ, DIFFLAB_CACHE=str(cache))
    say(f"({key}) {' '.join(cmd[2:])}")
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    with Sampler(proc.pid) as mem:
        output, _ = proc.communicate()
    wall = time.perf_counter() - started
    if proc.returncode not in (0, 1) or not (out / "run.json").exists():
        raise SystemExit(f"difflab run failed ({proc.returncode}):\n{output[-4000:]}")
    observations = {}
    for path in (out / "observations").glob("*/*/*.json"):
        o = json.loads(path.read_text())
        if o["status"] != "unavailable":
            observations[(o["fix"], o["side"], o["probe"])] = (o["status"], o["fields"])
    cached = sum(1 for p in (out / "observations").glob("*/*/*.json") if json.loads(p.read_text()).get("cached"))
    return Phase(key, label, wall, mem.peak_rss, mem.peak_pss, disk, f"{note}; {cached} cached", observations)


def marginal(jobs: list[ProbeJob], env: SharedEnvironment, cache: Path, logs: Path, reps: int = 5) -> dict[str, Any]:
    """Seconds one more probe adds on a warm server: the steady-state gap between two probes finishing.

    One server, ``reps`` copies of the probes of the release with the most probes: the time from
    the first probe's result to the last one's, over the probes in between, so the server import
    and the first fork are not in it.
    """
    os.environ["DIFFLAB_CACHE"] = str(cache)
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
        with WarmRunner(environment=env, workers=1, parallel=parallel) as runner:
            observed = runner.run(batch, on_done=lambda _obs, done=done: done.append(time.perf_counter()))
            walls = [w for w in runner.stats["probe_wall_s"] if w is not None]
        out[f"per_probe_s_parallel{parallel}"] = (done[-1] - done[0]) / (len(done) - 1)
        if parallel == 1:
            out["fork_to_exit_mean_s"] = statistics.mean(walls)
            out["observe_mean_s"] = statistics.mean(o.duration_s for o in observed)
    os.environ.pop("DIFFLAB_CACHE", None)
    return out


def profile_warm(jobs: list[ProbeJob], env: SharedEnvironment, cache: Path) -> dict[str, Any]:
    """Where a warm run's time goes: the same jobs in-process, with the runner's own timings."""
    os.environ["DIFFLAB_CACHE"] = str(cache)
    t = time.perf_counter()
    with WarmRunner(environment=env) as runner:
        observed = runner.run(jobs)
        total = time.perf_counter() - t
        stats = runner.stats
    os.environ.pop("DIFFLAB_CACHE", None)
    return {
        "total_s": total,
        "hub": stats["hubs"][0],
        "servers": stats["servers"],
        "probes_fork_to_exit_s": sum(w for w in stats["probe_wall_s"] if w),
        "observe_s": sum(o.duration_s for o in observed),
    }


def unpack_time(wheels: list[Path], scratch: Path) -> float:
    """What materialising the sources costs once they are downloaded (``sglang/`` out of each wheel)."""
    t = time.perf_counter()
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as zf:
            zf.extractall(scratch / "unpack" / wheel.stem, [n for n in zf.namelist() if n.startswith("sglang/")])
    return time.perf_counter() - t


def env_build_time(env: SharedEnvironment, scratch: Path) -> float:
    """The one-off shared environment, built by the lab's own code from the local wheelhouse."""
    wheels = wheelhouse(env)
    fresh = SharedEnvironment(cache=scratch / "envcache", pip_args=["--no-index", "--find-links", str(wheels)])
    t = time.perf_counter()
    fresh.ensure()
    took = time.perf_counter() - t
    shutil.rmtree(scratch / "envcache", ignore_errors=True)
    return took


# -- report ----------------------------------------------------------------------------
def table(phases: list[Phase], naive: Phase | None) -> str:
    lines = [
        "| phase | wall s | vs naive | peak ΣRSS MB | peak ΣPSS MB | disk MB | note |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for p in phases:
        ratio = f"{p.wall_s / naive.wall_s:.1%}" if naive and p is not naive else ""
        lines.append(
            f"| ({p.key}) {p.label} | {p.wall_s:.1f} | {ratio} | {p.peak_rss / MB:.0f} | "
            f"{p.peak_pss / MB:.0f} | {p.disk / MB:.0f} | {p.note} |"
        )
    return "\n".join(lines)


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
    parser.add_argument("--keep", action="store_true", help="keep the scratch folder (venvs, runs)")
    parser.add_argument("--json", type=Path, help="write all numbers here too")
    args = parser.parse_args(argv)

    fixes = select_fixes(args.matrix, args.fixes, args.quick)
    matrix = load_matrix(args.matrix)
    releases = sorted({getattr(f, s).release for f in fixes for s in ("base", "head") if getattr(f, s).release})
    say(f"{len(fixes)} fix(es), releases {', '.join(releases)}; {os.cpu_count()} cores; load {os.getloadavg()[0]:.1f}")
    backend = ReleaseSource(matrix.releases)
    sources = {r: backend.release(r) for r in releases}
    wheel_of = {r: cache_root() / "wheels" / matrix.releases[r].file for r in releases}
    env = SharedEnvironment().ensure()
    scratch = Path(tempfile.mkdtemp(prefix="difflab-bench-"))
    fix_args = [a for f in fixes for a in ("--fix", f.id)]
    try:
        jobs = bench_jobs(fixes, sources, scratch / "logs")
        phases: list[Phase] = []
        extra: dict[str, Any] = {
            "cores": os.cpu_count(),
            "jobs": len(jobs),
            "releases": releases,
            "load_before": os.getloadavg(),
        }
        naive = None
        if not args.skip_naive:
            naive, info = phase_naive(jobs, env, wheel_of, scratch, args.keep)
            phases.append(naive)
            extra |= info
        cache = scratch_cache(scratch)
        common = ["--matrix", str(args.matrix), *fix_args]
        disk_static = du(env.path, *(s.root for s in sources.values()))
        cold = phase_cli(
            "b",
            "lab cold (empty caches, fresh servers)",
            common,
            cache,
            scratch / "out-b",
            0,
            "shared env + sources exist",
        )
        lab_disk = disk_static + du(cache / "pycache", cache / "results", cache / "warm", cache / "childlib")
        cold.disk = lab_disk
        phases.append(cold)
        phases.append(
            phase_cli(
                "c",
                "lab warm (bytecode + preload list hot, no result cache)",
                [*common, "--no-cache"],
                cache,
                scratch / "out-c",
                lab_disk,
                "all probes re-run",
            )
        )
        phases.append(
            phase_cli("d", "lab full cache hit", common, cache, scratch / "out-d", lab_disk, "nothing re-runs")
        )
        if args.with_subprocess:
            phases.append(
                phase_cli(
                    "e",
                    "lab --backend subprocess (old default)",
                    [*common, "--no-cache", "--backend", "subprocess"],
                    cache,
                    scratch / "out-e",
                    lab_disk,
                    "a fresh process per probe",
                )
            )
        say("profile of a warm run, and the marginal cost per probe on a warm server")
        # The sources as the lab phases saw them (through the scratch cache), so their bytecode is warm.
        seen = ReleaseSource(matrix.releases, cache=cache)
        lab_jobs = bench_jobs(fixes, {r: seen.release(r) for r in releases}, scratch / "logs-lab")
        extra["profile"] = profile_warm(lab_jobs, env, cache)
        extra["marginal"] = marginal(lab_jobs, env, cache, scratch / "logs-lab")
        extra["unpack_s"] = unpack_time(list(wheel_of.values()), scratch)
        if args.env_build:
            say("one-off: building a shared environment from the wheelhouse")
            extra["env_build_s"] = env_build_time(env, scratch)
        extra["load_after"] = os.getloadavg()

        reference = phases[-1] if args.skip_naive else naive
        same = {p.key: p.observations == reference.observations for p in phases if p is not reference and reference}
        print(table(phases, naive))
        print()
        m = extra["marginal"]
        print(
            f"jobs: {len(jobs)} probe runs over {len(releases)} release(s); cores: {os.cpu_count()}; load average "
            f"{extra['load_before'][0]:.1f} before, {extra['load_after'][0]:.1f} after"
        )
        print(
            f"observations identical to ({reference.key}): "
            + ", ".join(f"({k}) {'yes' if v else 'NO'}" for k, v in same.items())
        )
        print(
            f"per-probe marginal cost on a warm server ({m['release']}, {m['probes']} probes): "
            f"{m['per_probe_s_parallel1'] * 1000:.0f} ms serial, "
            f"{m[f'per_probe_s_parallel{os.cpu_count() or 1}'] * 1000:.0f} ms with {os.cpu_count()} at once; "
            f"of the serial cost, observe() itself {m['observe_mean_s'] * 1000:.0f} ms, fork to exit "
            f"{(m['fork_to_exit_mean_s'] - m['observe_mean_s']) * 1000:.0f} ms more, lab/hub/server round trip "
            f"{(m['per_probe_s_parallel1'] - m['fork_to_exit_mean_s']) * 1000:.0f} ms (means)"
        )
        prof = extra["profile"]
        servers = prof["servers"]
        print(
            f"warm run profile (in-process, {prof['total_s']:.1f} s): hub import {prof['hub']['import_s']:.1f} s "
            f"({prof['hub']['import_cpu_s']:.1f} s CPU, {prof['hub']['preloaded']} modules, serial); "
            f"{len(servers)} server imports {sum(x['import_s'] for x in servers):.1f} s "
            f"({sum(x['import_cpu_s'] for x in servers):.1f} s CPU, {os.cpu_count()} at once); "
            f"probes fork-to-exit {prof['probes_fork_to_exit_s']:.1f} s (observe() {prof['observe_s']:.1f} s)"
        )
        if naive:
            builds = extra["venv_builds"]
            per = statistics.mean(b["requirements_s"] + b["sglang_s"] for b in builds.values())
            probe_s = sum(b["probes_s"] for b in builds.values()) / len(jobs) * (os.cpu_count() or 1)
            print(
                f"naive: {per:.1f} s per virtualenv on average (requirements + sglang), "
                f"{naive.disk / MB / len(builds):.0f} MB each; ~{probe_s:.1f} s per probe process"
            )
        print(
            f"one-off: unpacking {len(releases)} release(s) {extra['unpack_s']:.1f} s"
            + (f"; shared environment build {extra['env_build_s']:.1f} s" if "env_build_s" in extra else "")
        )
        cold_fresh = cold.wall_s + extra["unpack_s"] + extra.get("env_build_s", 0.0)
        if "env_build_s" in extra:
            print(f"cold run on a fresh machine (env build + unpack + lab cold, no downloads): {cold_fresh:.0f} s")
        if args.json:
            args.json.write_text(
                json.dumps(
                    {
                        "phases": [
                            {k: v for k, v in dataclasses.asdict(p).items() if k != "observations"} for p in phases
                        ],
                        **extra,
                        "identical": same,
                    },
                    indent=2,
                    default=str,
                )
                + "\n"
            )
    finally:
        if args.keep:
            say(f"kept {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
