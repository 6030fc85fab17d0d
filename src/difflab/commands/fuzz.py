"""``difflab fuzz``: seeded schedules over a CPU prefill/decode pair of a build; can decode read a stranger's KV?"""

from __future__ import annotations

import argparse

from difflab.commands import _args
from difflab.progress import Reporter
from difflab.workflows.fuzz import TRANSFER_BACKENDS, FuzzRequest, execute

NAME = "fuzz"
HELP = "search seeded schedules (admit, reject, abort, failed and late writes, page reuse) for a KV page leak"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--release", metavar="X.Y.Z", help="a release the matrix pins")
    _args.repo(parser)
    parser.add_argument("--ref", help="with --repo: the commit, branch or tag to search")
    parser.add_argument("--schedules", type=int, default=200, help="schedules to generate (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="the same seed gives the same schedules and leaks")
    parser.add_argument(
        "--transfer-backend",
        choices=TRANSFER_BACKENDS,
        default="mooncake",
        help="the PD transfer back end the loopback stands in for (default: %(default)s)",
    )
    _args.matrix(parser)
    _args.out(parser, "results/fuzz-<timestamp>")
    _args.backend(parser, local_only=True)
    parser.add_argument("--timeout", type=float, default=600.0, help="per-chunk timeout in seconds")


def main(args: argparse.Namespace) -> int:
    reporter = Reporter()
    req = FuzzRequest(
        out=args.out,
        force=args.force,
        release=args.release,
        repo=args.repo,
        ref=args.ref,
        matrix=args.matrix,
        runner=args.runner,
        transfer_backend=args.transfer_backend,
        schedules=args.schedules,
        seed=args.seed,
        timeout_s=args.timeout,
    )
    outcome = execute(req, reporter)
    rate = outcome.runs / outcome.cpu_seconds if outcome.cpu_seconds else 0.0
    reporter.print(
        f"{outcome.runs} schedules run (with shrinking) in {outcome.seconds:.1f} s "
        f"({outcome.cpu_seconds:.1f} CPU s): {rate:.0f}/s per core"
    )
    for leak in outcome.leaks:
        reporter.print(
            f"LEAK: {leak['victim']} read {leak['owner']}'s KV (pages {leak['pages']}, canary {leak['canary']}); "
            f"shrunk schedule ({len(leak['schedule'])} steps):"
        )
        for step in leak["schedule"]:
            reporter.print(f"    {step}")
    if not outcome.leaks:
        reporter.print("no leak found")
    reporter.print(f"results: {outcome.out_dir} (fuzz.json)")
    return outcome.exit_code
