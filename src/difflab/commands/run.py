"""``difflab run``: diff every selected fix's base against its head."""

from __future__ import annotations

import argparse

from difflab.commands import _args
from difflab.errors import ConfigError
from difflab.progress import Reporter
from difflab.workflows.run import RunRequest, execute
from difflab.workflows.throughput import DEFAULT_ROUNDS, DEFAULT_SIZES, MIN_SIGNIFICANT_ROUNDS, ThroughputOptions

NAME = "run"
HELP = "run the fixes' probes on base and head sources and write verdicts"


def add_probe_arguments(parser: argparse.ArgumentParser, sealed: bool = True) -> None:
    """What ``run`` and ``observe`` share: the session's arguments (which fixes, from where, on which back end)."""
    _args.add_session(parser, "results/<timestamp>", sealed=sealed)
    selfcheck = "also apply each fix's reverting mutations to its head (causality self-check)"
    parser.add_argument("--selfcheck", action="store_true", help=selfcheck)


def _sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(s) for s in text.split(",") if s.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected sizes like 10,100,1000, got {text!r}") from None
    return sizes


def add_throughput_arguments(parser: argparse.ArgumentParser) -> None:
    """``--throughput`` and how it runs (defaults: :class:`~difflab.workflows.throughput.ThroughputOptions`)."""
    group = parser.add_argument_group("throughput (CPU hot paths, base vs head)")
    group.add_argument(
        "--throughput",
        action="store_true",
        help="also time each fix's hot path on base and head in interleaved rounds (needs the [stats] extra)",
    )
    group.add_argument(
        "--rounds", type=int, default=DEFAULT_ROUNDS, help="rounds per side after the warm-up (default: %(default)s)"
    )
    group.add_argument(
        "--throughput-sizes",
        type=_sizes,
        default=DEFAULT_SIZES,
        metavar="N,N,...",
        help=f"load sizes: requests waiting / rooms held (default: {','.join(map(str, DEFAULT_SIZES))})",
    )
    group.add_argument(
        "--throughput-fail-above",
        type=float,
        metavar="FACTOR",
        help="fail the run (exit 1) on a significant slowdown beyond FACTOR, e.g. 1.10 (default: informational)",
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_probe_arguments(parser)
    _args.upstream_tests(parser)
    add_throughput_arguments(parser)


def request(args: argparse.Namespace, **overrides: object) -> RunRequest:
    fields = _args.probe_options(args)
    fields["upstream_tests"] = getattr(args, "upstream_tests", None)
    if getattr(args, "throughput", False):
        fields["throughput"] = ThroughputOptions(
            rounds=args.rounds, sizes=args.throughput_sizes, fail_above=args.throughput_fail_above
        )
    elif getattr(args, "throughput_fail_above", None) is not None:
        raise ConfigError("--throughput-fail-above needs --throughput")
    return RunRequest(**(fields | {"selfcheck": args.selfcheck} | overrides))


def main(args: argparse.Namespace) -> int:
    reporter = Reporter()
    req = request(args)
    if req.throughput is not None and req.throughput.rounds < MIN_SIGNIFICANT_ROUNDS:
        few = req.throughput.rounds
        reporter.say(f"--rounds {few}: with fewer than {MIN_SIGNIFICANT_ROUNDS} rounds per side no p reaches 0.002")
    outcome = execute(req, reporter)
    reporter.table(outcome.verdicts, outcome.out_dir if not outcome.throughput else None)
    if outcome.throughput:
        reporter.throughput_table(outcome.throughput, req.throughput.fail_above if req.throughput else None)
        reporter.console.print(f"results: {outcome.out_dir}")
    return outcome.exit_code
