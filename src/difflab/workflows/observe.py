"""The step every probing workflow shares: run the jobs, write each observation into the run folder.

``observations/<fix>/<side>/<probe>.json`` with the probe's log beside it, whatever the side
is called (base/head, a release, ``fork``).
"""

from __future__ import annotations

from pathlib import Path

from packaging.version import InvalidVersion, Version

from difflab.errors import SourceError
from difflab.files.names import printable
from difflab.matrix import Fix
from difflab.observation import Observation
from difflab.progress import Reporter
from difflab.runner import Runner
from difflab.runner.base import DEFAULT_TIMEOUT_S
from difflab.runner.jobs import Sources, build_jobs, observation_logs
from difflab.workflows.session import ProbeOptions, Selection  # where every workflow's request starts


def observe(
    fixes: list[Fix],
    sources: Sources,
    runner: Runner,
    work: Path,
    reporter: Reporter,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> list[Observation]:
    """Every probe of every fix on every side in ``sources``; what could not run is an observation too."""
    jobs, known = build_jobs(fixes, sources, observation_logs(work), timeout_s)
    for obs in known:
        if obs.status == "error":
            reporter.say(f"{obs.fix} {obs.side} {obs.probe}: {obs.error}")
    observed = known + reporter.track(runner, jobs)
    check_versions(observed)
    for obs in observed:
        obs.write(work / "observations" / obs.fix / obs.side / f"{obs.probe}.json")
    return observed


def check_versions(observed: list[Observation]) -> None:
    """A release's label is what its imported ``sglang.__version__`` says, or nothing is judged (exit 2).

    A lock or matrix entry names a release and a wheel by hash; the hash proves the file, not that the
    file is the release its label claims.
    """
    for obs in observed:
        label = obs.source.get("version") if obs.source.get("kind") == "release" else None
        if not label or not obs.sglang_version:
            continue
        try:
            same = Version(str(obs.sglang_version)) == Version(str(label))
        except InvalidVersion:
            same = False
        if not same:
            raise SourceError(
                f"release {label} ({obs.source.get('file')}): its sglang imports as version "
                f"{printable(str(obs.sglang_version))}, not {label}; fix the lock or matrix entry"
            )


__all__ = ["ProbeOptions", "Selection", "check_versions", "observe"]
