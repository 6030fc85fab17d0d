"""The one job builder: which probe runs against which source, and what is known without running it.

Every workflow (run, observe, contains, selfcheck, backport, bisect) and the benchmark
build their jobs here, so a missing probe file or an unavailable side reads the same in all
of them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

from difflab.errors import ConfigError
from difflab.matrix.model import Fix
from difflab.observation import Observation
from difflab.paths import probes_dir
from difflab.runner.base import DEFAULT_TIMEOUT_S, ProbeJob
from difflab.source.base import MaterialisedSource

Sources = Mapping[tuple[str, str], MaterialisedSource | str]
"""``(fix id, side) -> source``, or the reason the side has none."""

LogDir = Callable[[str, str], Path]
"""``(fix id, side) -> folder`` for the probes' ``<probe>.log`` files."""


def observation_logs(work: Path) -> LogDir:
    """``<work>/observations/<fix>/<side>/``, beside the observations themselves."""
    return lambda fix, side: work / "observations" / fix / side


def check_probe_files(fixes: list[Fix], matrix_path: Path | str, probe_dir: Path | None = None) -> None:
    """Every probe the matrix names has its file; a missing one is the matrix's error (exit 2), found early."""
    pdir = probe_dir or probes_dir()
    for fix in fixes:
        for index, spec in enumerate(fix.probes):
            if not (pdir / f"{spec.name}.py").is_file():
                raise _no_probe_file(fix, index, pdir / f"{spec.name}.py", matrix_path)


def _no_probe_file(fix: Fix, index: int, probe_file: Path, matrix_path: Path | str = "matrix") -> ConfigError:
    name = fix.probes[index].name
    return ConfigError(f"{matrix_path}: fix {fix.id!r}.probes[{index}].name: probe {name!r} has no file {probe_file}")


def build_jobs(
    fixes: list[Fix],
    sources: Sources,
    logs: LogDir | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    probe_dir: Path | None = None,
) -> tuple[list[ProbeJob], list[Observation]]:
    """One job per fix x side x probe (sides in the order ``sources`` lists them), plus the
    observations already known: an unavailable side. A probe without a file is a configuration
    error (:func:`check_probe_files` finds it earlier, naming the matrix)."""
    pdir = probe_dir or probes_dir()
    jobs: list[ProbeJob] = []
    known: list[Observation] = []
    for fix in fixes:
        for (fix_id, side), src in sources.items():
            if fix_id != fix.id:
                continue
            for index, spec in enumerate(fix.probes):
                probe_file = pdir / f"{spec.name}.py"
                if not probe_file.is_file():
                    raise _no_probe_file(fix, index, probe_file)
                if isinstance(src, str):
                    known.append(Observation.unavailable(fix.id, spec.name, side, src))
                    continue
                log_path = logs(fix.id, side) / f"{spec.name}.log" if logs else None
                jobs.append(ProbeJob(fix.id, spec.name, side, src, probe_file, log_path, timeout_s))
    return jobs, known
