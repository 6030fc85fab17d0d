"""`difflab backport` of one fork, warm: a hub started per command against the kept hub, turn about.

    python bench/bench_backport.py [--release 0.5.23] [--runs 3]

The fork is a git repository holding the release's cached ``sglang/`` tree (as
``python/sglang``) on a branch. Each turn runs the same ``difflab backport --no-cache``
twice, once with ``DIFFLAB_HUB_IDLE_S=0`` (the hub imports torch & co. for this command and
ends with it) and once with the kept hub (started by a warm-up command), alternating which
goes first; it prints each wall time, the medians and their ratio, and checks that both give
the same verdicts. The release must be in the cache already (any earlier run of it).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def release_tree(cache: Path, version: str) -> Path:
    found = sorted((cache / "sources" / "release").glob(f"{version}-*/sglang"))
    if not found:
        raise SystemExit(f"release {version} is not in {cache}: run e.g. `difflab contains --release {version}` first")
    return found[-1]


def make_fork(tree: Path, into: Path) -> Path:
    """A fork as an operator has one: the release's code in ``python/sglang`` on a branch ``my``."""
    fork = into / "fork"
    shutil.copytree(tree, fork / "python" / "sglang", ignore=shutil.ignore_patterns("__pycache__"))
    env = {**os.environ, "GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@x", "GIT_COMMITTER_NAME": "b"}
    env["GIT_COMMITTER_EMAIL"] = "b@x"
    for cmd in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-qm", "release tree"], ["branch", "my"]):
        subprocess.run(["git", *cmd], cwd=fork, env=env, check=True)
    return fork


def backport(fork: Path, out: Path, keep: bool) -> tuple[float, dict[str, str]]:
    env = dict(os.environ)
    if not keep:
        env["DIFFLAB_HUB_IDLE_S"] = "0"
    else:
        env.pop("DIFFLAB_HUB_IDLE_S", None)
    cmd = [sys.executable, "-m", "difflab", "backport", "--repo", str(fork), "--ref", "my", "--no-cache"]
    started = time.perf_counter()
    proc = subprocess.run([*cmd, "--out", str(out)], env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if proc.returncode not in (0, 1):
        raise SystemExit(f"backport failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return wall, verdicts(out)


def verdicts(out: Path) -> dict[str, str]:
    """Fix id -> verdict, from the run's ``backport.json``."""
    data = json.loads((out / "backport.json").read_text())
    return {str(f["id"]): str(f["verdict"]) for f in data["fixes"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--release", default="0.5.23")
    parser.add_argument("--runs", type=int, default=3, help="turns; each runs both ways once (default 3)")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    from difflab.paths import cache_root

    scratch = Path(tempfile.mkdtemp(prefix="bench-backport-"))
    try:
        fork = make_fork(release_tree(cache_root(), args.release), scratch)
        subprocess.run([sys.executable, "-m", "difflab", "hub", "stop"], check=True, capture_output=True)
        first, expected = backport(fork, scratch / "warm-up", keep=True)  # starts the kept hub
        times: dict[bool, list[float]] = {False: [], True: []}
        for turn in range(args.runs):
            for keep in (False, True) if turn % 2 == 0 else (True, False):
                wall, got = backport(fork, scratch / f"t{turn}-{'kept' if keep else 'own'}", keep)
                if got != expected:
                    raise SystemExit(f"verdicts differ ({'kept' if keep else 'own'} hub, turn {turn}): {got}")
                times[keep].append(wall)
        subprocess.run([sys.executable, "-m", "difflab", "hub", "stop"], check=True, capture_output=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    own, kept = statistics.median(times[False]), statistics.median(times[True])
    print(f"difflab backport of one fork ({args.release} tree, {len(expected)} fixes, --no-cache), {args.runs} turns")
    print("| hub | wall s, each turn | median |")
    print("|---|---|---:|")
    labels = ((False, "started by the command (DIFFLAB_HUB_IDLE_S=0)"), (True, "kept from an earlier command"))
    for keep, label in labels:
        print(f"| {label} | {', '.join(f'{t:.1f}' for t in times[keep])} | {(kept if keep else own):.1f} |")
    print(f"ratio kept/own: {kept / own:.2f}; warm-up command (started the kept hub): {first:.1f} s")
    print(f"verdicts identical both ways: {json.dumps(expected, sort_keys=True)}")
    print(f"load average after: {', '.join(f'{x:.1f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
