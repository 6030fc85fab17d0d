"""``difflab hub``: the warm hub kept between commands (see :mod:`difflab.runner.kept_hub`)."""

from __future__ import annotations

import argparse

from difflab.paths import cache_root
from difflab.progress import Reporter
from difflab.runner import kept_hub

NAME = "hub"
HELP = (
    "show or stop the warm hub kept between commands "
    f"(${kept_hub.IDLE_ENV} sets how long it waits; 0 keeps none; default {kept_hub.DEFAULT_IDLE_S:.0f} s)"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=("status", "stop"), help="status: list kept hubs; stop: end them")


def main(args: argparse.Namespace) -> int:
    show = Reporter().print
    found = kept_hub.keepers(cache_root())
    if args.action == "stop":
        stopped = sum(k.stop() for k in found)
        show(f"stopped {stopped} kept hub{'s' if stopped != 1 else ''}")
        return 0
    if not found:
        show("no kept hub")
    for keeper in found:
        state = keeper.status()
        if state is None:
            continue
        alive = "running" if state["alive"] else "gone"
        show(
            f"hub {keeper.environment}: {alive}, pid {state['pid']}, waits {state['idle_s']:.0f} s, "
            f"started {state['age_s']:.0f} s ago, socket {state['socket']}"
        )
    return 0
