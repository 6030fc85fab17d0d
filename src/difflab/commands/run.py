"""``difflab run``: diff every selected fix's base against its head."""

from __future__ import annotations

import argparse

from difflab.commands import _args
from difflab.progress import Reporter
from difflab.workflows.run import RunRequest, execute

NAME = "run"
HELP = "run the fixes' probes on base and head sources and write verdicts"


def add_probe_arguments(parser: argparse.ArgumentParser) -> None:
    """What ``run`` and ``observe`` share: which fixes, from where, on which back end."""
    _args.add_selection(parser, "results/<timestamp>")
    _args.source(parser)
    _args.timeout(parser)
    selfcheck = "also apply each fix's reverting mutations to its head (causality self-check)"
    parser.add_argument("--selfcheck", action="store_true", help=selfcheck)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_probe_arguments(parser)
    _args.upstream_tests(parser)
    _args.bundle(parser)


def request(args: argparse.Namespace, **overrides: object) -> RunRequest:
    fields = _args.probe_options(args) | {"source_kind": args.source_kind, "repo": args.repo}
    fields["upstream_tests"] = getattr(args, "upstream_tests", None)
    return RunRequest(**(fields | {"selfcheck": args.selfcheck} | overrides))


def main(args: argparse.Namespace) -> int:
    reporter = Reporter()
    outcome = execute(request(args), reporter)
    reporter.table(outcome.verdicts, outcome.out_dir)
    return outcome.exit_code
