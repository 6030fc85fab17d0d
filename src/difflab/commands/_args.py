"""Arguments several commands share, declared once so they read and default the same everywhere."""

from __future__ import annotations

import argparse

from difflab.bundle.pack import DEFAULT_MAX_UNPACKED
from difflab.files.names import argument_path
from difflab.paths import default_matrix, default_release_lock
from difflab.runner import DEFAULT, RUNNERS
from difflab.runner.base import DEFAULT_TIMEOUT_S
from difflab.source import SOURCES
from difflab.source.mirror import REPO_ENV


def matrix(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--matrix", type=argument_path, default=default_matrix(), help="matrix file (default: %(default)s)"
    )


def release_lock(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--lock-file",
        type=argument_path,
        default=default_release_lock(),
        help="the release lock (default: %(default)s)",
    )


def since(parser: argparse.ArgumentParser, default: str) -> None:
    parser.add_argument("--since", metavar="VERSION", help=f"oldest release to include (default: {default})")


def fixes(parser: argparse.ArgumentParser, help: str = "fix id or PR number (repeatable; default: all)") -> None:
    parser.add_argument("--fix", action="append", dest="fixes", metavar="N", help=help)


def out(parser: argparse.ArgumentParser, default: str | None, required: bool = False) -> None:
    """``--out`` and ``--force``: a results folder never replaces anything but an earlier one, and only when asked."""
    where = "results folder" + (f" (default: {default})" if default else "")
    parser.add_argument(
        "--out", type=argument_path, required=required, help=f"{where}; must be new, empty, or see --force"
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="replace --out if it holds an earlier difflab results folder (never any other folder)",
    )


def source(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--source",
        dest="source_kind",
        choices=list(SOURCES),
        default="release",
        help="where base/head come from (default: release wheels)",
    )
    parser.add_argument("--repo", help="git repository URL or path for --source git")


def repo(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repo", help=f"git repository URL or path (default: ${REPO_ENV} or SGLang upstream)")


def upstream_tests(parser: argparse.ArgumentParser) -> None:
    """``--upstream-tests DIR``: SGLang's own test files, replayed beside the probes (any source kind)."""
    parser.add_argument(
        "--upstream-tests",
        type=argument_path,
        metavar="DIR",
        help=(
            "a folder laid out like SGLang's repository (test/registered/...) holding the fixes' own unit tests: "
            "they are replayed on the same sources as supporting evidence (default: $DIFFLAB_UPSTREAM_TESTS; "
            "a git source's own test/ tree is used first)"
        ),
    )


def backend(parser: argparse.ArgumentParser, local_only: bool = False) -> None:
    """``--backend``: every registered runner, or only those running in the local shared environment."""
    names = [n for n, cls in RUNNERS.items() if cls.local_environment or not local_only]
    parser.add_argument(
        "--backend",
        dest="runner",
        choices=names,
        default=DEFAULT,
        help="how probes are executed (default: %(default)s)",
    )


def timeout(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="per-probe timeout in seconds")


def no_cache(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--no-cache", dest="use_cache", action="store_false", help="ignore cached probe results")


def add_selection(parser: argparse.ArgumentParser, out_default: str, local_only: bool = False) -> None:
    """The arguments behind :class:`~difflab.workflows.session.Selection`: matrix, fixes, out, back end, cache."""
    matrix(parser)
    fixes(parser)
    out(parser, out_default)
    backend(parser, local_only)
    no_cache(parser)


def add_session(
    parser: argparse.ArgumentParser,
    out_default: str,
    *,
    local_only: bool = False,
    sources: bool = True,
    sealed: bool = True,
) -> None:
    """Every argument of :class:`~difflab.workflows.session.ProbeOptions`, so every command that writes a
    run folder reads them the same: the selection, ``--timeout``, ``--no-bundle``/``--key`` (``sealed``:
    unless the folder is one cell of a fan-out, never sealed) and ``--source``/``--repo`` (``sources``:
    for commands that materialise a fix's sides)."""
    add_selection(parser, out_default, local_only)
    timeout(parser)
    if sealed:
        bundle(parser)
    if sources:
        source(parser)


def selection(args: argparse.Namespace) -> dict[str, object]:
    """The :class:`~difflab.workflows.session.Selection` fields the arguments above set."""
    return {k: getattr(args, k) for k in ("matrix", "fixes", "out", "force", "runner", "use_cache")}


SESSION_FIELDS = {
    "timeout": "timeout_s",
    "bundle": "bundle",
    "key": "key",
    "source_kind": "source_kind",
    "repo": "repo",
}
"""Argument name -> :class:`~difflab.workflows.session.ProbeOptions` field, for those a command declared."""


def probe_options(args: argparse.Namespace) -> dict[str, object]:
    """The :class:`~difflab.workflows.session.ProbeOptions` fields the arguments above set."""
    return selection(args) | {f: getattr(args, a) for a, f in SESSION_FIELDS.items() if hasattr(args, a)}


def archive_limit(parser: argparse.ArgumentParser) -> None:
    """``--max-unpacked-mib``: how much an archive may unpack to before it is refused unread."""
    parser.add_argument(
        "--max-unpacked-mib",
        type=int,
        default=DEFAULT_MAX_UNPACKED // 2**20,
        metavar="MIB",
        help="refuse an archive whose members add up to more than this (default: %(default)s MiB)",
    )


def max_unpacked(args: argparse.Namespace) -> int:
    return max(0, args.max_unpacked_mib) * 2**20


def bundle(parser: argparse.ArgumentParser, key: bool = True) -> None:
    parser.add_argument("--no-bundle", dest="bundle", action="store_false", help="do not seal a signed bundle")
    if key:
        parser.add_argument("--key", type=argument_path, help="Ed25519 private key (PEM) for signing the bundle")
