"""``difflab bisect``: the first commit between --good and --bad whose behaviour changed for a fix."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from difflab.matrix import load_matrix
from difflab.paths import default_matrix
from difflab.runner.base import DEFAULT_TIMEOUT_S
from difflab.source.git import GitSource
from difflab.source.mirror import REPO_ENV
from difflab.workflows.bisect import run_bisect

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
    parser.add_argument("--repo", help=f"git repository URL or path (default: ${REPO_ENV} or SGLang upstream)")
    parser.add_argument("--matrix", type=Path, default=default_matrix(), help="matrix file (default: %(default)s)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="per-probe timeout in seconds")
    parser.add_argument("--json", action="store_true", help="print the result as JSON on stdout")


def main(args: argparse.Namespace) -> int:
    matrix = load_matrix(args.matrix)
    fix = matrix.fix(args.fix)
    source = GitSource(repo=args.repo)

    def say(message: str) -> None:
        print(f"· {message}", file=sys.stderr)

    result = run_bisect(
        fix, matrix.path, source, args.good, args.bad, probe_names=args.probes, timeout_s=args.timeout, say=say
    )
    for step in result.steps:
        say(f"step {step['commit'][:12]} like {step['like']}: {step['answer']}  {step['subject']}")
    if args.json:
        print(json.dumps(result.__dict__ | {"output": None}, indent=2, sort_keys=True))
    if result.first:
        if not args.json:
            print(
                f"{result.first} is the first commit behaving like {result.bad_like} for fix {fix.id}: {result.subject}"
            )
        return 0
    if not args.json:
        print("bisect could not settle: commits the probes cannot place were skipped; candidates:")
        for sha in result.candidates:
            print(f"  {sha}")
    return 1
