"""Benchmark: how often the throughput A/B calls identical code different. A script, not a test.

    .venv/bin/python bench/bench_throughput_aa.py [--experiments 20] [--rounds 10] [--fix N]
                                                  [--load alone,busy] [--json FILE]
    .venv/bin/python bench/bench_throughput_aa.py --rejudge FILE   # judge saved samples again

Head against head (A/A): for every fix of the default matrix with a throughput probe, both
sides are the fix's head release, and ``--experiments`` independent A/Bs run exactly as
``difflab run --throughput`` runs them (:func:`difflab.workflows.throughput.measure`: fresh
bench processes per experiment, warm-up, interleaved rounds, the same judgment). Any mark
other than ``~`` is wrong: ``+``/``-`` are false positives, ``?`` (unstable) says the
machine was too noisy to tell. Counted for every fix's mark and every workload's mark.
Beside them, ``--power`` A/Bs (default 5) of #38935's head against a copy whose prefill
door scans every waiting request (the mutation ``difflab selfcheck`` would apply): a
method that never says anything would pass the A/A; this shows it still sees a slowdown.

Load conditions: ``alone`` (whatever else the machine runs) and ``busy`` (one CPU-bound
busy-loop process per core beside the bench, started before and killed after it).

Every per-round sample goes into the JSON document (``--json``, default
``results/throughput-aa.json``); ``--rejudge FILE`` judges those samples again with this
checkout's :func:`difflab.diff.throughput.judge_throughput`, so two judging methods can be
compared on the very same measurements.

Runtime on 2 cores shared with other jobs, default settings (20 experiments of 10 pairs,
sizes 10, 100, 1000, four fixes, 5 power A/Bs): about 12 min alone and 11 min busy.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from difflab.diff.throughput import ThroughputResult, judge_throughput
from difflab.environment.shared import SharedEnvironment
from difflab.matrix import load_matrix
from difflab.matrix.model import Mutation
from difflab.paths import default_matrix
from difflab.progress import Reporter
from difflab.runner.warm import WarmRunner
from difflab.source.release import ReleaseSource
from difflab.workflows.selfcheck import mutated_copy
from difflab.workflows.throughput import ThroughputOptions, measure_each

SCAN = Mutation(
    name="bench-scan-at-prefill-door",
    file="sglang/srt/disaggregation/prefill.py",
    find="if is_unadmitted_reject(req):",
    replace="if any(waiting.rid == req.rid for waiting in self.queue) or is_unadmitted_reject(req):",
    targets=(),
)
"""The power check: a duplicate-request check that scans every waiting request (an O(n) door)."""
SCAN_FIX = "38935"
LAST_RUN = Path(__file__).resolve().parents[1] / "results" / "throughput-aa.json"
LOADS = ("alone", "busy")
TARGET = 0.01
"""The most marks other than ``~`` an A/A may give (a fraction of all marks)."""


def say(message: str) -> None:
    print(f"[aa {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


class BusyLoops:
    """One CPU-bound process per core while the block runs (killed by their own pids after it)."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.procs: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> BusyLoops:
        for _ in range(self.count):
            self.procs.append(subprocess.Popen([sys.executable, "-c", "while True: pass"]))
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in self.procs:
            proc.kill()
        for proc in self.procs:
            proc.wait()


def _marks(result: ThroughputResult) -> dict[str, Any]:
    return {
        "fix": result.fix,
        "status": result.status,
        "reason": result.reason.splitlines()[0] if result.reason else "",
        "mark": result.mark,
        "ratio": result.ratio,
        "workloads": {w.name: w.mark for w in result.workloads},
        "described": [{"name": w.name, "unit": w.unit, "what": w.what} for w in result.workloads],
        "samples": result.samples,
        "detail": result.to_dict() | {"samples": None},
    }


def run_load(load: str, args: argparse.Namespace, doc: dict[str, Any]) -> dict[str, Any]:
    """``args.experiments`` A/A experiments of every selected fix under ``load``, saved one by one into ``doc``."""
    matrix = load_matrix(args.matrix)
    releases = ReleaseSource(matrix.releases)
    fixes = [f for f in matrix.fixes if f.throughput and (not args.fixes or f.id in args.fixes)]
    options = ThroughputOptions(rounds=args.rounds)
    copies, sources = [], {}
    for k in range(args.experiments):  # fix by fix within an experiment: a drift spreads over every fix
        for fix in fixes:
            head = releases.release(fix.head.release)
            copy = dataclasses.replace(fix, id=f"{fix.id}.aa{k:02d}")
            copies.append(copy)
            sources[(copy.id, "base")] = sources[(copy.id, "head")] = head
    door = matrix.fix(SCAN_FIX)
    pristine = releases.release(door.head.release)
    scanning = mutated_copy(pristine, SCAN) if args.power else None
    for k in range(args.power):
        copy = dataclasses.replace(door, id=f"{door.id}.scan{k:02d}")
        copies.append(copy)
        sources[(copy.id, "base")], sources[(copy.id, "head")] = pristine, scanning
    say(f"{load}: {len(fixes)} fix(es) x {args.experiments} experiments, {args.rounds} rounds per side")
    busy = BusyLoops((os.cpu_count() or 1) if load == "busy" else 0)
    started = time.monotonic()
    part: dict[str, Any] = {
        "load": load,
        "busy_loops": busy.count,
        "load_before": os.getloadavg(),
        "options": options.record(),
        "experiments": [],
    }
    doc["loads"].append(part)

    def keep(result: ThroughputResult) -> None:
        part["experiments"].append(_marks(result))
        part["wall_s"] = round(time.monotonic() - started, 1)
        part["load_after"] = os.getloadavg()
        args.json.write_text(json.dumps(doc, indent=1))

    with busy, WarmRunner(environment=SharedEnvironment().ensure()) as runner:
        for result in measure_each(copies, sources, runner, args.scratch / load, Reporter(), options):
            if result.comparison is not None or result.status == "error":  # measured (or tried): kept at once
                keep(result)
    say(f"{load}: {time.monotonic() - started:.0f} s")
    return part


def rejudge(doc: dict[str, Any]) -> dict[str, Any]:
    """The same samples judged by this checkout's judgment."""
    for part in doc["loads"]:
        for exp in part["experiments"]:
            if exp["status"] != "ok":
                continue
            result = ThroughputResult(fix=exp["fix"], label=exp["fix"], status="error")
            samples = exp["samples"]
            seed = part["options"].get("seed", 1)
            wall = {"base": samples["wall"]["base"], "head": samples["wall"]["head"]} if "wall" in samples else None
            judge_throughput(result, exp["described"], samples["base"], samples["head"], seed, wall)
            exp.update(_marks(result))
    return doc


def tally(part: dict[str, Any]) -> dict[str, Any]:
    """A/A marks counted per fix and over every fix and workload; the scanning head's apart."""
    per_fix: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    total: collections.Counter[str] = collections.Counter()
    power: collections.Counter[str] = collections.Counter()
    errors = sorted({exp["reason"] for exp in part["experiments"] if exp["status"] != "ok"})
    for exp in part["experiments"]:
        if ".scan" in exp["fix"]:
            power[exp["mark"] if exp["status"] == "ok" else "!"] += 1
            continue
        fix = exp["fix"].split(".aa")[0]
        marks = [exp["mark"] if exp["status"] == "ok" else "!", *exp["workloads"].values()]
        per_fix[fix].update(marks)
        total.update(marks)
    n = sum(total.values())
    wrong = n - total["~"]
    return {
        "per_fix": {f: dict(c) for f, c in per_fix.items()},
        "marks": dict(total),
        "n": n,
        "not_same": wrong,
        "false_positive": total["+"] + total["-"],
        "rate": wrong / n if n else float("nan"),
        "power": dict(power),
        "errors": errors,
    }


def render(doc: dict[str, Any]) -> str:
    lines = [
        f"A/A, head against head: {doc.get('note', '')}".rstrip(),
        "",
        "| load | fix | marks (fix + workloads) | not `~` |",
        "|---|---|---|---:|",
    ]
    for part in doc["loads"]:
        t = tally(part)
        for fix, counts in t["per_fix"].items():
            n = sum(counts.values())
            shown = ", ".join(f"`{m}` {c}" for m, c in sorted(counts.items()))
            lines.append(f"| {part['load']} | {fix} | {shown} | {n - counts.get('~', 0)}/{n} |")
        verdict = "within" if t["rate"] <= TARGET else "OVER"
        if t["power"]:
            shown = ", ".join(f"`{m}` {c}" for m, c in sorted(t["power"].items()))
            lines.append(f"| {part['load']} | {SCAN_FIX} head with a scanning door (A/B, not A/A) | {shown} | |")
        for reason in t["errors"]:
            lines.append(f"| {part['load']} | error | {reason} | |")
        lines.append(
            f"| **{part['load']}** | all ({part.get('wall_s', '?')} s, load {part['load_before'][0]:.1f}) "
            f"| `+`/`-` {t['false_positive']}, other {t['not_same'] - t['false_positive']} "
            f"| **{t['not_same']}/{t['n']} = {t['rate']:.1%}** ({verdict} {TARGET:.0%}) |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--matrix", type=Path, default=default_matrix())
    parser.add_argument("--fix", action="append", dest="fixes", metavar="ID")
    parser.add_argument("--experiments", type=int, default=20, metavar="N", help="A/As per fix and load")
    parser.add_argument("--rounds", type=int, default=10, metavar="N", help="rounds per side of one A/A")
    parser.add_argument("--load", default=",".join(LOADS), help="alone, busy or both (default: %(default)s)")
    parser.add_argument("--json", type=Path, default=LAST_RUN, help="where the samples go (default: %(default)s)")
    parser.add_argument(
        "--power", type=int, default=5, metavar="N", help=f"A/Bs of #{SCAN_FIX} against a scanning door (0: none)"
    )
    parser.add_argument("--rejudge", type=Path, metavar="FILE", help="judge a saved run's samples again")
    parser.add_argument("--note", default="", help="a line kept with the numbers (which code, which machine)")
    args = parser.parse_args(argv)
    if args.rejudge:
        doc = rejudge(json.loads(args.rejudge.read_text()))
        print(render(doc))
        return 0
    loads = [x.strip() for x in args.load.split(",") if x.strip()]
    if not loads or set(loads) - set(LOADS) or args.experiments < 1:
        parser.error(f"--load is a list of {', '.join(LOADS)}; --experiments at least 1")
    import tempfile

    with tempfile.TemporaryDirectory(prefix="difflab-aa-") as scratch:
        args.scratch = Path(scratch)
        doc: dict[str, Any] = {"cores": os.cpu_count(), "note": args.note, "loads": []}
        args.json.parent.mkdir(parents=True, exist_ok=True)
        for load in loads:
            run_load(load, args, doc)
    print(render(doc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
