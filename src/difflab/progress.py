"""The one output object every command reports through.

Progress, bars and tables go to stderr (``rich``: live bars without hand-rolled ANSI), so
stdout carries only results, printed verbatim (JSON, a verdict line, a lock listing).
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from difflab.diff.throughput import ThroughputResult
from difflab.diff.verdict import FixVerdict
from difflab.files.names import printable
from difflab.observation import Observation
from difflab.runner.base import ProbeJob, Runner


def data(value: object) -> Text:
    """Text from a build, a fork or a file, for the terminal: its ``[markup]`` is shown as it is, its control
    characters (an ESC) as escapes."""
    return Text(printable(str(value)))


STYLE = {
    "confirmed": "green",
    "unavailable": "yellow",
    "not-fixed": "red",
    "not-reproduced": "red",
    "control-drift": "magenta",
    "error": "bold red",
}


class Reporter:
    """Progress on stderr, results on stdout."""

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console(stderr=True, highlight=False)
        self._lock = threading.Lock()

    def say(self, message: str) -> None:
        """A progress line (stderr); ``message`` is shown as text, never as markup."""
        self.console.print(Text.assemble(("·", "dim"), " ", data(message)))

    def print(self, text: str = "") -> None:
        """A result line (stdout), exactly as given."""
        print(text, file=sys.stdout, flush=True)

    def warn(self, text: str) -> None:
        """A line for the person at the terminal (stderr), exactly as given."""
        print(text, file=sys.stderr, flush=True)

    def _bar(self, label: str) -> Progress:
        return Progress(
            TextColumn(f"[bold]{label}[/bold]"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.description}"),
            console=self.console,
            transient=False,
        )

    def track(self, runner: Runner, jobs: Sequence[ProbeJob]) -> list[Observation]:
        if not jobs:
            return []
        with self._bar("probes") as bar:
            task = bar.add_task("", total=len(jobs))

            def done(obs: Observation) -> None:
                with self._lock:
                    mark = Text("ok", style="green") if obs.status == "ok" else Text(printable(obs.status), style="red")
                    cached = " (cached)" if obs.cached else ""
                    bar.console.print(
                        Text.assemble(
                            data(f"  {obs.fix:>7} {obs.side:<4} {obs.probe:<36} "),
                            mark,
                            f" {obs.duration_s:6.2f}s{cached}",
                        )
                    )
                    bar.advance(task)

            return runner.run(jobs, on_done=done)

    @contextlib.contextmanager
    def steps(self, label: str, total: int) -> Iterator[Callable[[str], None]]:
        """A bar for ``total`` steps of one task; the callable advances it and says what was done."""
        with self._bar(label) as bar:
            task = bar.add_task("", total=total)

            def step(description: str) -> None:
                with self._lock:
                    bar.update(task, advance=1, description=description)

            yield step

    def table(self, verdicts: list[FixVerdict], out: Path | None = None) -> None:
        table = Table(title="verdicts", show_lines=False)
        for col in ("fix", "base", "head", "verdict", "reason"):
            table.add_column(col, overflow="fold")
        for v in verdicts:
            style = STYLE.get(v.verdict, "")
            table.add_row(
                data(f"#{v.fix}{f'({v.part})' if v.part else ''}"),
                data(v.base.get("label", "")),
                data(v.head.get("label", "")),
                Text(v.verdict, style=style),
                data(v.reason),
            )
        self.console.print(table)
        if out is not None:
            self.console.print(data(f"results: {out}"))

    def throughput_table(self, results: list[ThroughputResult], fail_above: float | None = None) -> None:
        """Per fix: the asv mark, ratio head/base of time per item, its interval, p, the exponents."""
        table = Table(title="throughput (CPU time per item, head / base)", show_lines=False)
        for col in ("fix", "", "ratio", "95% CI", "p", "exponent base → head", ""):
            table.add_column(col, overflow="fold")
        for r in results:
            if not r.ok or r.comparison is None or r.exponent is None or r.ci is None:
                why = (r.reason or "").splitlines()[0] if r.reason else ""
                table.add_row(data(r.label), "", "", "", "", "", data(f"{r.status}: {why}"))
                continue
            style = {"+": "red", "-": "green", "?": "yellow"}.get(r.mark, "")
            mark = f"[{style}]{r.mark}[/{style}]" if style else r.mark
            failing = "[bold red]fails[/bold red]" if r.fails(fail_above) else ""
            if r.mark == "?":
                failing = f"unstable: ±{r.comparison.spread:.0%}"
            table.add_row(
                data(r.label),
                mark,
                f"{r.ratio:.3f}",
                f"{r.ci[0]:.3f}–{r.ci[1]:.3f}",
                f"{r.comparison.p_value:.2g}",
                f"{r.exponent.base:+.2f} → {r.exponent.head:+.2f}",
                failing,
            )
        self.console.print(table)
