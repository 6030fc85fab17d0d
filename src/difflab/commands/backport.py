"""``difflab backport``: does a fork's ref carry each fix? Judged by behaviour, with git evidence."""

from __future__ import annotations

import argparse

from difflab.backport.evidence import DEFAULT_SCAN_LIMIT
from difflab.commands import _args
from difflab.progress import Reporter
from difflab.report.family import answer_lines
from difflab.source.mirror import REPO_ENV
from difflab.workflows.backport import BackportRequest, execute

NAME = "backport"
HELP = "run each fix's probes on a fork's ref: present, absent, partial or error (exit 0 only if all present)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repo", required=True, help="the fork: git URL or local path")
    parser.add_argument("--ref", required=True, help="branch, tag or commit of the fork to check")
    _args.add_session(parser, "results/backport-<timestamp>", sources=False)
    parser.add_argument(
        "--upstream",
        help=f"where upstream fix commits come from, for the evidence (default: ${REPO_ENV} or SGLang upstream)",
    )
    _args.upstream_tests(parser)
    parser.add_argument(
        "--scan-limit",
        type=int,
        default=DEFAULT_SCAN_LIMIT,
        help="fork commits scanned for a patch-equivalent commit (default: %(default)s)",
    )


def main(args: argparse.Namespace) -> int:
    fork = {"ref": args.ref, "upstream": args.upstream, "scan_limit": args.scan_limit}
    fork["upstream_tests"] = args.upstream_tests
    req = BackportRequest(**fork, **_args.probe_options(args))  # --repo (the fork) is a session option
    reporter = Reporter()
    outcome = execute(req, reporter)
    for v in outcome.verdicts:
        reporter.say(f"#{v.fix}{f'({v.part})' if v.part else ''}: {v.verdict} - {v.reason}")
        if v.backends:
            reporter.say("    back ends: " + "; ".join(f"{b} {own}" for b, own in v.backends.items()))
    for line in answer_lines(outcome.out_dir):  # the family's question for this fork, in one line
        reporter.say(line)
    return outcome.exit_code
