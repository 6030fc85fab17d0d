"""``difflab bisect``: the first commit between --good and --bad whose behaviour changed for a fix."""

from __future__ import annotations

import argparse
import json

from difflab.commands import _args
from difflab.matrix import load_matrix
from difflab.progress import Reporter
from difflab.source import repository
from difflab.workflows.bisect import BisectRequest, run_bisect

NAME = "bisect"
HELP = "git bisect run with a fix's probes: --good shows the old behaviour, --bad the new one"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--good", required=True, help="a commit with the old behaviour (e.g. before the fix)")
    parser.add_argument("--bad", required=True, help="a commit with the new behaviour (e.g. with the fix)")
    parser.add_argument("--fix", required=True, metavar="N", help="fix id or PR number whose probes decide")
    parser.add_argument(
        "--probe",
        action="append",
        dest="probes",
        metavar="NAME",
        help="use only this probe of the fix (repeatable; default: all)",
    )
    _args.repo(parser)
    _args.matrix(parser)
    _args.timeout(parser)
    parser.add_argument("--json", action="store_true", help="print the result as JSON on stdout")


def main(args: argparse.Namespace) -> int:
    matrix = load_matrix(args.matrix)
    fix = matrix.fix(args.fix)
    source = repository(args.repo)
    out = Reporter()
    req = BisectRequest(fix, matrix.path, args.good, args.bad, probe_names=args.probes, timeout_s=args.timeout)
    result = run_bisect(req, source, say=out.say)
    for step in result.steps:
        out.say(f"step {step['commit'][:12]} like {step['like']}: {step['answer']}  {step['subject']}")
    if args.json:
        out.print(json.dumps(result.__dict__ | {"output": None}, indent=2, sort_keys=True))
    if result.first:
        if not args.json:
            out.print(
                f"{result.first} is the first commit behaving like {result.bad_like} for fix {fix.id}: {result.subject}"
            )
        return 0
    if not args.json:
        out.print("bisect could not settle: commits the probes cannot place were skipped; candidates:")
        for sha in result.candidates:
            out.print(f"  {sha}")
    return 1
