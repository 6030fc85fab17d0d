"""The steps every workflow shares, written once: what a command that writes a run folder does besides its own work.

A workflow opens a :class:`Session` with its request (:class:`ProbeOptions`) and then asks it, in
this order, for what it needs:

1. :meth:`Session.open`: the matrix loaded, the fixes selected, their probe files checked, the
   output folder checked (new, empty, or an earlier results folder with ``--force``) before
   anything is fetched or built, and the :class:`~difflab.report.record.RunRecord` started;
2. :meth:`Session.sources`: the source back end of ``--source``/``--repo``, from the registry;
3. :meth:`Session.environment` and :meth:`Session.runner`: the shared environment (made ready
   only for a back end that runs in it) and the ``--backend`` runner behind the result cache;
4. :meth:`Session.folder`: the run folder, written under a temporary sibling and moved into
   place only when the workflow completes, so a crash never replaces a good result;
5. :meth:`Session.finish`: ``run.json`` (with the matrix copy and ``environment.json``), then the
   seal unless ``--no-bundle`` (``--key`` signs it), and the exit code.

So a new command gets ``--timeout``, ``--no-bundle``/``--key``, ``--source``/``--repo`` and
sealing by taking :class:`ProbeOptions` and :func:`difflab.commands._args.add_session`.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from difflab.bundle import seal
from difflab.environment.shared import SharedEnvironment
from difflab.files.atomic import check_out, results_folder
from difflab.matrix import Fix, Matrix, load_matrix
from difflab.paths import default_matrix, default_results
from difflab.progress import Reporter
from difflab.report.record import RunRecord, folder_stamp, is_run_folder
from difflab.runner import DEFAULT, Runner, RunnerClass, build_runner, runner_class
from difflab.runner.base import DEFAULT_TIMEOUT_S
from difflab.runner.jobs import check_probe_files
from difflab.source import SourceBackend, for_matrix

Select = Callable[[Matrix], list[Fix]]
"""How a workflow picks its fixes from the matrix (default: ``--fix``, else every fix)."""


@dataclass(kw_only=True)
class Selection:
    """What every probing workflow takes: which fixes of which matrix, where to, on which back end."""

    matrix: Path = field(default_factory=default_matrix)
    fixes: list[str] | None = None
    out: Path | None = None
    force: bool = False
    """Replace ``out`` if it is an earlier results folder (:func:`difflab.files.atomic.check_out`)."""
    runner: str = DEFAULT
    use_cache: bool = True


@dataclass(kw_only=True)
class ProbeOptions(Selection):
    """What every workflow that writes a sealed run folder takes besides (the session's options)."""

    timeout_s: float = DEFAULT_TIMEOUT_S
    bundle: bool = True
    key: Path | None = None
    source_kind: str = "release"
    """``--source``: where a fix's sides come from (:data:`difflab.source.SOURCES`)."""
    repo: str | None = None
    """``--repo``: the git repository of ``--source git`` (a fork, for ``backport``)."""
    argv: list[str] = field(default_factory=lambda: list(sys.argv))
    """Recorded in run.json (and replayed by ``reproduce``)."""


@dataclass
class Outcome:
    """What every workflow returns: where its folder is and how the command exits."""

    out_dir: Path
    exit_code: int


@dataclass
class Session:
    """One invocation of a workflow: its request, matrix, fixes, output folder and run record."""

    command: str
    options: ProbeOptions
    reporter: Reporter
    matrix: Matrix
    fixes: list[Fix]
    out: Path
    record: RunRecord

    @classmethod
    def open(
        cls,
        command: str,
        options: ProbeOptions,
        reporter: Reporter | None = None,
        *,
        folder_prefix: str = "",
        select: Select | None = None,
        probe_files: bool = True,
    ) -> Session:
        """Bad input (matrix, fix, probe file, output folder) refused before anything is fetched or built."""
        record = RunRecord(command=command, argv=options.argv)
        matrix = load_matrix(options.matrix)
        fixes = select(matrix) if select is not None else matrix.select(options.fixes)
        if probe_files:
            check_probe_files(fixes, matrix.path)
        record.fixes = [f.id for f in fixes]
        out = (options.out or default_results() / f"{folder_prefix}{folder_stamp(record.started)}").resolve()
        check_out(out, force=options.force, ours=is_run_folder)
        return cls(command, options, reporter or Reporter(), matrix, fixes, out, record)

    @property
    def say(self) -> Callable[[str], None]:
        return self.reporter.say

    @property
    def runner_class(self) -> RunnerClass:
        """The ``--backend`` class: what it declares (local environment, result cache, hermetic) decides steps."""
        return runner_class(self.options.runner)

    def sources(self) -> SourceBackend:
        """The ``--source`` back end for this matrix (``--repo`` for git), from the registry."""
        return for_matrix(self.options.source_kind, self.matrix, self.options.repo)

    def environment(self, pins: tuple[str, ...] | None = None, *, ensure: bool = True) -> SharedEnvironment:
        """The shared environment (``pins``: a planned one), made ready only where the back end runs in it."""
        env = SharedEnvironment(pins=pins) if pins is not None else SharedEnvironment()
        if ensure and self.runner_class.local_environment:
            env.ensure(progress=self.say)
        return env

    def runner(self, env: SharedEnvironment, **options: Any) -> Runner:
        """The ``--backend`` runner on ``env``, behind the result cache unless ``--no-cache``."""
        return runner_for_options(self.options, env, self.say, **options)

    @contextlib.contextmanager
    def folder(self) -> Iterator[Path]:
        """The run folder under construction; moved into place only if the block completes."""
        with results_folder(self.out, force=self.options.force, ours=is_run_folder) as work:
            yield work

    def finish(self, work: Path, exit_code: int, *, environment: Mapping[str, Any] | None = None) -> int:
        """run.json (with the matrix copy and, if given, environment.json), then the seal unless ``--no-bundle``."""
        self.record.write(work, exit_code, matrix=(self.matrix.path, self.matrix.sha256), environment=environment)
        if self.options.bundle:
            seal(work, key=self.options.key, echo=self.say)
        return exit_code


def runner_for_options(
    options: Selection, env: SharedEnvironment, say: Callable[[str], None] | None = None, **extra: Any
) -> Runner:
    """The ``--backend`` runner of ``options`` on ``env`` (``extra``: the back end's own settings)."""
    return build_runner(options.runner, env, options.use_cache, say, **extra)


def close_runner(runner: Runner) -> None:
    """Stop a back end that keeps processes (the warm hub), also behind the result cache; others need nothing."""
    inner = getattr(runner, "inner", runner)
    close = getattr(inner, "close", None)
    if callable(close):
        close()


@contextlib.contextmanager
def started_early(runner: Runner) -> Iterator[None]:
    """A warm runner's hub imports while the sources are prepared, and is stopped when the run ends.

    Only an uncached warm runner starts early: behind the result cache a run may need no probe at all.
    """
    start = getattr(type(runner), "start_early", None)  # a back end with a hub to start (the warm one)
    if start is None:
        yield
        return
    start(runner)
    with runner:
        yield
