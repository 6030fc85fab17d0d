"""``python -m difflab.testing.testserver``: serve a simulated deployment on loopback for a while.

Prints one JSON line with the three URLs and the environment files, then serves
until ``--seconds`` pass or it is interrupted; it always stops by itself.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from difflab.testing.testserver import TestDeployment, TestServerConfig, base_config, head_config

PRESETS = {"safe": TestServerConfig, "head": head_config, "base": base_config}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--preset",
        choices=sorted(PRESETS),
        default="safe",
        help="safe: passes every preflight gate; head: fixed build with a pool below the "
        "context; base: every pre-fix behaviour on",
    )
    parser.add_argument("--seconds", type=float, default=600.0, help="stop after this long (default 600)")
    parser.add_argument("--version", dest="sglang_version", help="version string to report")
    args = parser.parse_args(argv)
    config = PRESETS[args.preset]()
    if args.sglang_version:
        config = replace(config, version=args.sglang_version)
    env_dir = Path(tempfile.mkdtemp(prefix="difflab-testserver-env-"))
    env_files = {}
    for role, env in config.env.items():
        env_files[role] = str(env_dir / f"{role}.env")
        Path(env_files[role]).write_text("".join(f"{k}={v}\n" for k, v in env.items()))
    with TestDeployment(config) as dep:
        print(
            json.dumps(
                {
                    "prefill": dep.prefill_url,
                    "decode": dep.decode_url,
                    "router": dep.router_url,
                    "env_files": env_files,
                }
            ),
            flush=True,
        )
        with contextlib.suppress(KeyboardInterrupt):
            time.sleep(max(0.0, args.seconds))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
