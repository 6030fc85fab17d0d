"""``run.json``: what was run, when and on what, for every command, in one schema.

Every command that writes a run folder (run, observe, merge, selfcheck, backport, gpu) records
itself through :class:`RunRecord`: the same keys, one timestamp format (UTC,
``2026-05-01T12:00:00Z``), plus the command's own ``details``. The bundle signs it, ``pack``
dates the archive by it and ``reproduce`` re-runs from it.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from difflab import __version__
from difflab.bundle.layout import ENVIRONMENT_JSON, MATRIX, RUN_JSON
from difflab.paths import checkout_root, installed_package

SCHEMA = 1
TOOL = "sglang-difflab"
STAMP = "%Y-%m-%dT%H:%M:%SZ"


def utc_now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def stamp(when: dt.datetime) -> str:
    """The one timestamp format of run.json."""
    return when.astimezone(dt.UTC).strftime(STAMP)


def folder_stamp(when: dt.datetime) -> str:
    """The same moment in a folder name (``results/20260501T120000Z``)."""
    return when.astimezone(dt.UTC).strftime("%Y%m%dT%H%M%SZ")


def write_json(path: Path, document: Any) -> Path:
    """A JSON document as every run-folder file is written: indented, keys sorted, final newline."""
    path.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")
    return path


def copy_matrix(folder: Path, matrix_path: Path) -> None:
    """The matrix as used, beside the results (``matrix.toml``)."""
    shutil.copyfile(matrix_path, folder / MATRIX)


def is_run_folder(folder: Path) -> bool:
    """A folder some command of this tool wrote: its run.json says so (``--force`` may replace it)."""
    try:
        document = json.loads((folder / RUN_JSON).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(document, dict) and document.get("tool") == TOOL


def matrix_reference(path: Path, sha256: str) -> dict[str, str]:
    """The matrix by path (relative to the checkout, or ``difflab/matrices/...`` for the installed one) and digest."""
    checkout, site = checkout_root(), installed_package().parent
    if not path.is_absolute():
        where = str(path)
    elif checkout is not None:
        where = os.path.relpath(path, checkout)
    elif path.resolve().is_relative_to(site):
        where = path.resolve().relative_to(site).as_posix()
    else:
        where = str(path)
    return {"path": where, "sha256": sha256}


@dataclass
class RunRecord:
    """One command's invocation; :meth:`write` adds the outcome and puts it in the run folder."""

    command: str
    fixes: list[str] = field(default_factory=list)
    argv: list[str] = field(default_factory=lambda: list(sys.argv))
    started: dt.datetime = field(default_factory=utc_now)
    details: dict[str, Any] = field(default_factory=dict)
    """The command's own keys (sides, runner, sources, ...), merged into the document."""

    def document(self, exit_code: int, finished: dt.datetime | None = None) -> dict[str, Any]:
        return {
            **self.details,
            "schema": SCHEMA,
            "tool": TOOL,
            "tool_version": __version__,
            "command": self.command,
            "argv": self.argv,
            "started_at": stamp(self.started),
            "finished_at": stamp(finished or utc_now()),
            "fixes": list(self.fixes),
            "exit_code": exit_code,
        }

    def write(
        self,
        folder: Path,
        exit_code: int,
        *,
        matrix: tuple[Path, str] | None = None,
        environment: Mapping[str, Any] | None = None,
        finished: dt.datetime | None = None,
    ) -> Path:
        """``run.json``; with ``matrix`` (path, sha256) also its copy, with ``environment`` environment.json."""
        if matrix is not None:
            path, sha256 = matrix
            copy_matrix(folder, path)
            self.details["matrix"] = matrix_reference(path, sha256)
        if environment is not None:
            write_json(folder / ENVIRONMENT_JSON, dict(environment))
        return write_json(folder / RUN_JSON, self.document(exit_code, finished))
