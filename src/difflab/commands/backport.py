"""``difflab backport``: does a fork's ref carry each fix? Judged by behaviour, with git evidence."""

from __future__ import annotations

import argparse
from pathlib import Path

from difflab.backport.evidence import DEFAULT_SCAN_LIMIT
from difflab.paths import default_matrix
from difflab.runner.base import DEFAULT_TIMEOUT_S
from difflab.source.mirror import REPO_ENV
from difflab.workflows.backport import BackportRequest, execute

NAME = "backport"
HELP = "run each fix's probes on a fork's ref: present, absent, partial or error (exit 0 only if all present)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repo", required=True, help="the fork: git URL or local path")
    parser.add_argument("--ref", required=True, help="branch, tag or commit of the fork to check")
    parser.add_argument(
        "--fix", action="append", dest="fixes", metavar="N", help="fix id or PR number (repeatable; default: all)"
    )
    parser.add_argument("--out", type=Path, help="results folder (default: results/backport-<timestamp>)")
    parser.add_argument("--matrix", type=Path, default=default_matrix(), help="matrix file (default: %(default)s)")
    parser.add_argument(
        "--upstream",
        help=f"where upstream fix commits come from, for the evidence (default: ${REPO_ENV} or SGLang upstream)",
    )
    parser.add_argument(
        "--backend",
        dest="runner",
        choices=["subprocess", "warm", "docker"],
        default="warm",
        help="how probes are executed (default: %(default)s)",
    )
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="per-probe timeout in seconds")
    parser.add_argument(
        "--scan-limit",
        type=int,
        default=DEFAULT_SCAN_LIMIT,
        help="fork commits scanned for a patch-equivalent commit (default: %(default)s)",
    )
    parser.add_argument("--no-bundle", dest="bundle", action="store_false", help="do not seal a signed bundle")
    parser.add_argument("--key", type=Path, help="Ed25519 private key (PEM) for signing the bundle")
    parser.add_argument("--no-cache", dest="use_cache", action="store_false", help="ignore cached probe results")


def main(args: argparse.Namespace) -> int:
    req = BackportRequest(
        repo=args.repo,
        ref=args.ref,
        matrix=args.matrix,
        fixes=args.fixes,
        out=args.out,
        upstream=args.upstream,
        runner=args.runner,
        bundle=args.bundle,
        key=args.key,
        timeout_s=args.timeout,
        use_cache=args.use_cache,
        scan_limit=args.scan_limit,
    )
    return execute(req).exit_code
