"""``difflab preflight``: Cloudflare's four gates, read from running prefill and decode engines.

``--build PATH|RELEASE`` reads instead what a build ships: the defaults of the family's
configuration-only defences, from its own tree (:mod:`difflab.preflight.defaults`).

Exit codes: 0 every gate passes (or does not apply); 1 a gate fails or cannot be
judged (each one is named on stderr); 2 bad input. The JSON report goes to stdout,
or to ``--json FILE`` (then stdout gets the human summary).
"""

from __future__ import annotations

import argparse
import json

from difflab.errors import ConfigError
from difflab.files.names import argument_path
from difflab.preflight.gates import PreflightReport
from difflab.preflight.run import run_preflight
from difflab.progress import Reporter

NAME = "preflight"
HELP = "check a running PD deployment against the four KV-safety gates (pool, deferred release, batch, checksum)"
ICON = {"pass": "ok  ", "fail": "FAIL", "unknown": "??  ", "not-applicable": "n/a "}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prefill", metavar="URL", help="prefill engine, e.g. http://127.0.0.1:30000")
    parser.add_argument("--decode", metavar="URL", help="decode engine, e.g. http://127.0.0.1:30001")
    parser.add_argument(
        "--build",
        metavar="PATH|RELEASE",
        help="instead of engines: a build's tree (a folder holding sglang/) or a release the matrix pins; "
        "prints the defaults of its configuration-only defences (batch cap, KV checksum, deferred release)",
    )
    parser.add_argument("--router", metavar="URL", help="router: also send one live request (checksum verification)")
    parser.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="ROLE=SOURCE",
        help="where a role's environment comes from: docker:CONTAINER, pid:N or a KEY=VALUE file "
        "(repeatable; flags SGLang reads only from the environment need it)",
    )
    parser.add_argument(
        "--json", type=argument_path, dest="json_file", metavar="FILE", help="write the JSON report here"
    )
    parser.add_argument("--timeout", type=float, default=30.0, help="per-request timeout in seconds")


def _env_sources(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        role, eq, source = item.partition("=")
        if not eq or role not in ("prefill", "decode") or not source:
            raise ConfigError(f"--env {item!r}: expected prefill=SOURCE or decode=SOURCE")
        out[role] = source
    return out


def render(report: PreflightReport) -> str:
    lines = [f"{ICON.get(g.status, g.status)} {g.gate:<17} {g.reason}" for g in report.gates]
    lines.append("preflight passed" if report.ok else f"preflight FAILED: {', '.join(report.failing)}")
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    if args.build:
        from difflab.preflight.build import build_report

        return build_report(args.build, args.json_file, Reporter())
    if not args.prefill or not args.decode:
        raise ConfigError("--prefill and --decode are both needed (or --build to read a build's defaults)")
    report = run_preflight(args.prefill, args.decode, args.router, _env_sources(args.env), timeout_s=args.timeout)
    text = json.dumps(report.to_dict(), indent=2, sort_keys=True, default=str)
    out = Reporter()
    if args.json_file:
        args.json_file.write_text(text + "\n")
        out.print(render(report))
    else:
        out.warn(render(report))
        out.print(text)
    return 0 if report.ok else 1
