"""Find the first commit whose behaviour changed, with ``git bisect run`` and a fix's probes.

Terms: ``--good`` is a commit with the *old* behaviour, ``--bad`` one with
the *new* behaviour, as git means them. Both endpoints are probed first and
must behave differently, one like the fix's base (bug) and one like its head
(fixed). The usual case, good = base-like and bad = head-like, finds the
commit that brought the fix; the reverse finds the commit that lost it (a
regression or a bad merge in a fork). Each step runs
:mod:`difflab.workflows.bisect_step` in a throwaway sparse worktree of the
mirror; a commit the probes cannot place is skipped (exit 125).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from difflab.environment.shared import SharedEnvironment
from difflab.errors import ConfigError, SourceError
from difflab.matrix.model import Fix, ProbeSpec
from difflab.runner.base import DEFAULT_TIMEOUT_S
from difflab.source.git import GitSource
from difflab.source.worktree import remove, scratch
from difflab.workflows.bisect_step import behaviours, select_probes

Say = Callable[[str], None]


@dataclass
class BisectResult:
    """The first commit with the bad (new) behaviour, or the candidates when skips left it open."""

    good: str
    bad: str
    good_like: str
    bad_like: str
    first: str | None
    subject: str | None
    candidates: list[str] = field(default_factory=list)
    steps: list[dict[str, Any]] = field(default_factory=list)
    output: str = ""


def _endpoints(
    source: GitSource,
    fix: Fix,
    probes: list[ProbeSpec],
    revs: dict[str, str],
    env: SharedEnvironment,
    timeout_s: float,
    say: Say,
) -> dict[str, tuple[str, str]]:
    """``{"good"|"bad": (sha, like)}``; each endpoint must behave like the fix's base or head."""
    srcs = {which: source.rev(rev, what=f"--{which} {rev}") for which, rev in revs.items()}
    found = behaviours(fix, probes, srcs, env, timeout_s)
    out = {}
    for which, (like, verdict) in found.items():
        sha = srcs[which].identity["commit"]
        say(f"--{which} {sha[:12]} behaves like {like} ({verdict.reason})")
        if like not in ("base", "head"):
            raise ConfigError(
                f"--{which} {revs[which]}: behaviour is {verdict.verdict} for fix {fix.id!r} "
                f"({verdict.reason}); it must behave like the fix's base or head"
            )
        out[which] = (sha, like)
    return out


@dataclass(frozen=True)
class BisectRequest:
    """``difflab bisect``: which fix's probes decide, between which two commits."""

    fix: Fix
    matrix_path: Path
    good: str
    bad: str
    probe_names: list[str] | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S


def _step_command(req: BisectRequest, probes: list[ProbeSpec], good_like: str, log: Path) -> list[str]:
    """What ``git bisect run`` runs at each commit: :mod:`difflab.workflows.bisect_step` with this fix's probes."""
    step = [sys.executable, "-m", "difflab.workflows.bisect_step", "--matrix", str(req.matrix_path)]
    step += ["--fix", req.fix.id, "--good-like", good_like, "--timeout", str(req.timeout_s), "--log", str(log)]
    for p in probes:
        step += ["--probe", p.name]
    return step


Git = Callable[..., subprocess.CompletedProcess[str]]


def _git_in(path: Path) -> Git:
    """``git`` in the scratch worktree, never prompting; a failure is a :class:`SourceError` unless ``check=False``."""
    git_env = {**os.environ, "GIT_TERMINAL_PROMPT": "0"}

    def git(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(["git", *args], cwd=path, env=git_env, capture_output=True, text=True)
        if check and proc.returncode != 0:
            raise SourceError(f"git {' '.join(args)}: {(proc.stderr or proc.stdout).strip()}")
        return proc

    return git


def run_bisect(req: BisectRequest, source: GitSource, say: Say = print) -> BisectResult:
    """Both endpoints probed first (they must behave differently), then ``git bisect run`` in a scratch worktree."""
    fix = req.fix
    probes = select_probes(fix, req.probe_names)
    env = SharedEnvironment().ensure(progress=say)
    ends = _endpoints(source, fix, probes, {"good": req.good, "bad": req.bad}, env, req.timeout_s, say)
    (good_sha, good_like), (bad_sha, bad_like) = ends["good"], ends["bad"]
    if good_like == bad_like:
        raise ConfigError(f"--good and --bad both behave like the fix's {good_like}: nothing changed between them")
    mirror = source.mirror
    path = scratch(mirror, bad_sha, f"bisect-{os.getpid()}")
    log = path.with_name(path.name + ".steps.jsonl")
    log.unlink(missing_ok=True)
    try:
        git = _git_in(path)
        git("bisect", "start", bad_sha, good_sha)
        say(f"git bisect run: good = behaves like {good_like}, bad = behaves like {bad_like}")
        proc = git("bisect", "run", *_step_command(req, probes, good_like, log), check=False)
        output = (proc.stdout or "") + (proc.stderr or "")
        steps = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
        first, candidates = _first_bad(git, output)
        if proc.returncode != 0 and first is None and not candidates:
            raise SourceError(f"git bisect run failed (exit {proc.returncode}): {output.strip()[-2000:]}")
        subject = mirror.subject(first) if first else None
        git("bisect", "reset", check=False)
    finally:
        log.unlink(missing_ok=True)
        remove(mirror, path)
    return BisectResult(good_sha, bad_sha, good_like, bad_like, first, subject, candidates, steps, output)


def _first_bad(git: Git, output: str) -> tuple[str | None, list[str]]:
    """The first bad commit (``refs/bisect/bad`` once bisect settles), or the skipped candidates."""
    if "is the first bad commit" in output:
        proc = git("rev-parse", "refs/bisect/bad", check=False)
        return (proc.stdout.strip() or None), []
    if "only 'skip'ped commits left" in output:
        cands = [line.split()[0] for line in output.splitlines() if len(line.split()) == 1 and len(line.strip()) == 40]
        return None, cands
    return None, []
