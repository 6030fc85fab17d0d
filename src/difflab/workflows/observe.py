"""The step every probing workflow shares: run the jobs, write each observation into the run folder.

``observations/<fix>/<side>/<probe>.json`` with the probe's log beside it, whatever the side
is called (base/head, a release, ``fork``).
"""

from __future__ import annotations

from pathlib import Path

from difflab.matrix import Fix
from difflab.observation import Observation
from difflab.progress import Reporter
from difflab.runner import Runner
from difflab.runner.base import DEFAULT_TIMEOUT_S
from difflab.runner.jobs import Sources, build_jobs, observation_logs


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
    for obs in observed:
        obs.write(work / "observations" / obs.fix / obs.side / f"{obs.probe}.json")
    return observed
