"""The ``difflab`` command line.

Each subcommand lives in its own module under :mod:`difflab.commands` and
defines ``NAME``, ``HELP``, ``add_arguments(parser)`` and ``main(args) -> int``;
this module only discovers and dispatches them, so a new command is a new
file, not an edit here.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from collections.abc import Sequence
from types import ModuleType

from difflab import __version__, commands
from difflab.errors import DifflabError


def discover(only: str | None = None) -> list[ModuleType]:
    """Every command module, sorted by name; only the one named ``only`` when there is one by that name.

    A command module imports its workflow and everything below it, so importing all of them costs most
    of a second; a run of one command needs only its own (``difflab --help`` still lists every one).
    """
    names = [i.name for i in pkgutil.iter_modules(commands.__path__) if not i.name.startswith("_")]
    if only in names:
        names = [only]
    found = []
    for name in names:
        module = importlib.import_module(f"{commands.__name__}.{name}")
        if hasattr(module, "NAME") and hasattr(module, "main"):
            found.append(module)
    return sorted(found, key=lambda m: m.NAME)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="difflab",
        description="Does this SGLang build carry this fix, judged by what its real code does?",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in discover(command):
        cmd = sub.add_parser(module.NAME, help=module.HELP, description=module.HELP)
        module.add_arguments(cmd)
        cmd.set_defaults(_handler=module.main)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(argv[0] if argv and not argv[0].startswith("-") else None)
    args = parser.parse_args(argv)
    try:
        return int(args._handler(args))
    except DifflabError as exc:
        print(f"difflab: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("difflab: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
