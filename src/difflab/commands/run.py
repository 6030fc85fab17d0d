"""``difflab run``: diff every selected fix's base against its head."""

from __future__ import annotations

import argparse
from pathlib import Path

from difflab.paths import default_matrix
from difflab.workflows.run import RunRequest, execute

NAME = "run"
HELP = "run the fixes' probes on base and head sources and write verdicts"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--matrix", type=Path, default=default_matrix(), help="matrix file (default: %(default)s)")
    parser.add_argument(
        "--fix", action="append", dest="fixes", metavar="N", help="fix id or PR number (repeatable; default: all)"
    )
    parser.add_argument("--out", type=Path, help="results folder (default: results/<timestamp>)")
    parser.add_argument(
        "--source",
        dest="source_kind",
        choices=["release", "git"],
        default="release",
        help="where base/head come from (default: release wheels)",
    )
    parser.add_argument("--repo", help="git repository URL or path for --source git")
    parser.add_argument(
        "--backend",
        dest="runner",
        choices=["subprocess", "warm", "docker"],
        default="warm",
        help="how probes are executed (default: %(default)s)",
    )
    parser.add_argument("--timeout", type=float, default=180.0, help="per-probe timeout in seconds")
    parser.add_argument("--no-bundle", dest="bundle", action="store_false", help="do not seal a signed bundle")
    parser.add_argument("--key", type=Path, help="Ed25519 private key (PEM) for signing the bundle")
    parser.add_argument(
        "--selfcheck",
        action="store_true",
        help="also apply each fix's reverting mutations to its head (causality self-check)",
    )
    parser.add_argument("--no-cache", dest="use_cache", action="store_false", help="ignore cached probe results")


def main(args: argparse.Namespace) -> int:
    req = RunRequest(
        matrix=args.matrix,
        fixes=args.fixes,
        out=args.out,
        source_kind=args.source_kind,
        repo=args.repo,
        runner=args.runner,
        bundle=args.bundle,
        key=args.key,
        timeout_s=args.timeout,
        use_cache=args.use_cache,
        selfcheck=getattr(args, "selfcheck", False),
    )
    return execute(req).exit_code
