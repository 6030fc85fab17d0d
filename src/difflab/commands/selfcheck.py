"""``difflab selfcheck``: prove each probe observes the fix itself, not the release around it."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shutil
from pathlib import Path

from difflab.environment.shared import SharedEnvironment
from difflab.files.atomic import atomic_folder
from difflab.matrix import load_matrix
from difflab.paths import default_matrix, repo_root
from difflab.progress import Reporter
from difflab.source import backend_for
from difflab.workflows.run import RunRequest, make_runner, side_pin
from difflab.workflows.selfcheck import run_selfcheck, write_selfcheck

NAME = "selfcheck"
HELP = "apply each fix's reverting mutations to its head source; the probes must flip back to base"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--matrix", type=Path, default=default_matrix())
    parser.add_argument("--fix", action="append", dest="fixes", metavar="N")
    parser.add_argument("--out", type=Path, help="results folder (default: results/selfcheck-<timestamp>)")
    parser.add_argument("--backend", dest="runner", choices=["subprocess", "warm"], default="warm")
    parser.add_argument("--no-cache", dest="use_cache", action="store_false")


def main(args: argparse.Namespace) -> int:
    reporter = Reporter()
    matrix = load_matrix(args.matrix)
    fixes = matrix.select(args.fixes)
    backend = backend_for("release", releases=matrix.releases)
    heads = {}
    for fix in fixes:
        pin = side_pin(fix, "head", "release")
        if pin.unavailable:
            reporter.say(f"{fix.label}: head unavailable ({pin.unavailable}); nothing to revert")
            continue
        heads[fix.id] = backend.materialise(fix, "head", pin)
    env = SharedEnvironment().ensure(progress=reporter.say)
    runner = make_runner(RunRequest(runner=args.runner, use_cache=args.use_cache), env)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    out = (args.out or repo_root() / "results" / f"selfcheck-{stamp}").resolve()
    with atomic_folder(out) as work:
        results = run_selfcheck(fixes, heads, runner, work, reporter.track)
        write_selfcheck(work, results)
        shutil.copyfile(matrix.path, work / "matrix.toml")
        (work / "run.json").write_text(
            json.dumps(
                {
                    "schema": 1,
                    "tool": "sglang-difflab",
                    "command": "selfcheck",
                    "fixes": [f.id for f in fixes],
                    "started_at": stamp,
                    "exit_code": 0 if all(r.passed for r in results) else 1,
                },
                indent=2,
                sort_keys=True,
            )
            + "\n"
        )
    for r in results:
        colour = "green" if r.passed else "red"
        reporter.console.print(f"  {r.fix:>7} {r.mutation:<40} [{colour}]{r.outcome}[/{colour}]  {r.reason}")
    reporter.console.print(f"results: {out}")
    return 0 if results and all(r.passed for r in results) else 1
