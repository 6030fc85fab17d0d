"""The throughput part of a run's reports: a section of summary.md, JUnit cases, the diff.json part, the logs.

One row per fix (ratio head/base of time per item, its interval, the Wilcoxon p on the paired
rounds, the mark, the growth exponent per side), then one per workload and size. Informational
unless a factor was given: then a significant slowdown beyond it is a failed JUnit case. The
diff.json part is each :class:`~difflab.diff.throughput.ThroughputResult`'s own ``to_dict`` inside
the fix's entry (diff.json's schema, :data:`difflab.report.results.SCHEMA`); the bench logs' tails
go to ``throughput/<fix>/<side>.log``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from difflab.diff.throughput import ALPHA, MAX_SPREAD, MIN_EFFECT, ThroughputResult
from difflab.report.junit import Case
from difflab.report.markdown import cell, table


@dataclass(frozen=True)
class Measured:
    """A run's throughput A/B beside its verdicts: every fix's result, and the slowdown factor that fails
    the run (None: informational)."""

    results: list[ThroughputResult]
    fail_above: float | None = None


THROUGHPUT_DIR = "throughput"
LOG_LINES = 200
"""A bench child's log kept to its tail: a whole log repeats a line per failed request."""

MEANING = {
    "+": "slower",
    "-": "faster",
    "~": "no significant difference",
    "?": "unstable: too noisy to tell",
    "!": "not measured",
}


def _exp(value: float | None) -> str:
    return "n/a" if value is None or value != value else f"{value:+.2f}"


def _ci(result: ThroughputResult) -> str:
    return f"{result.ci[0]:.3f}–{result.ci[1]:.3f}" if result.ci else "n/a"


def _p(p: float | None) -> str:
    return "n/a" if p is None else f"{p:.2g}"


def verdict(result: ThroughputResult, fail_above: float | None) -> str:
    """What the row says: the mark in words, and whether it fails the run."""
    if not result.ok:
        return result.status
    words = MEANING[result.mark]
    if result.mark == "?" and result.comparison is not None:
        words = f"{words} (±{result.comparison.spread:.0%})"
    if result.fails(fail_above):
        return f"{words}: beyond ×{fail_above:g}, fails"
    return words


def summary_lines(results: list[ThroughputResult], fail_above: float | None) -> list[str]:
    """The ``## Throughput`` section of summary.md."""
    if not results:
        return []
    gate = f"fails beyond ×{fail_above:g}" if fail_above is not None else "informational"
    settings = next((r.settings for r in results if r.settings), {})
    lines = [
        "",
        "## Throughput (CPU hot paths)",
        "",
        f"CPU time per item, head / base: < 1 is faster (the wall-clock ratio is in diff.json). "
        f"Rounds in pairs, base and head back to back, the order turned about every pair "
        f"({settings.get('rounds', '?')} pairs after {settings.get('warmup', '?')} warm-up); "
        f"sizes {', '.join(str(s) for s in settings.get('sizes', []))}. "
        f"Ratio = median of the paired ratios; `+` slower / `-` faster need "
        f"Wilcoxon p < {ALPHA:g}, the 95 % bootstrap interval excluding 1 and a ratio beyond "
        f"1 ± {MIN_EFFECT:.0%}; `~` none of that; `?` unstable: none of that, and an interval wider "
        f"than ± {MAX_SPREAD:.0%} (the measured spread in brackets); {gate}. "
        f"Exponent: time per item ∝ size^k.",
        "",
    ]
    rows = []
    for r in results:
        if r.ok:
            assert r.exponent is not None and r.comparison is not None
            rows.append(
                (
                    r.label,
                    f"`{r.mark}`",
                    f"{r.ratio:.3f}",
                    _ci(r),
                    _p(r.comparison.p_value),
                    f"{_exp(r.exponent.base)} → {_exp(r.exponent.head)}",
                    verdict(r, fail_above),
                )
            )
        else:
            why = r.reason.splitlines()[0] if r.reason else ""
            rows.append((r.label, "", "", "", "", "", cell(f"{r.status}: {why}")))
    headers = ("fix", "", "ratio", "95 % CI", "p", "exponent base → head", "")
    lines += table(headers, rows, ["---", ":-:", "---:", "---:", "---:", "---:", "---"])
    detail = []
    for r in results:
        for w in r.workloads:
            sizes = ", ".join(f"{n}: {v['ratio']:.2f}" for n, v in w.sizes.items())
            detail.append(
                (
                    r.label,
                    f"`{w.name}`",
                    f"`{w.mark}`",
                    f"{w.comparison.ratio:.3f}",
                    f"{w.comparison.ratio_low:.3f}–{w.comparison.ratio_high:.3f}",
                    _p(w.comparison.p_value),
                    f"{_exp(w.exponent.base)} → {_exp(w.exponent.head)}",
                    sizes,
                    cell(w.what),
                )
            )
    if detail:
        headers = ("fix", "workload", "", "ratio", "95 % CI", "p", "exponent", "ratio by size", "drives")
        lines += ["", *table(headers, detail, ["---", "---", ":-:", "---:", "---:", "---:", "---:", "---", "---"])]
    return lines


def junit_cases(results: list[ThroughputResult], fail_above: float | None) -> Iterable[Case]:
    """One case per fix: passed (informational), failed (a slowdown beyond the factor) or error."""
    for r in results:
        name = f"throughput:{r.probe or '(none)'}"
        if r.status == "unavailable":
            yield Case(f"throughput.{r.fix}", name, "skipped", r.reason)
            continue
        if not r.ok:
            yield Case(f"throughput.{r.fix}", name, "error", r.reason, "error")
            continue
        assert r.comparison is not None and r.exponent is not None
        message = (
            f"{r.mark} {r.outcome} ratio {r.ratio:.3f} (95% CI {_ci(r)}, ±{r.comparison.spread:.1%}, "
            f"p={r.comparison.p_value:.2g}), "
            f"exponent {_exp(r.exponent.base)} -> {_exp(r.exponent.head)}"
        )
        details = "\n".join(
            f"{w.name}: {w.mark} ratio {w.comparison.ratio:.3f} p={w.comparison.p_value:.2g} "
            f"exponent {_exp(w.exponent.base)} -> {_exp(w.exponent.head)}"
            for w in r.workloads
        )
        classname = f"throughput.{r.fix}"
        if r.fails(fail_above):
            yield Case(classname, name, "failed", f"{message}: beyond x{fail_above:g}", "slower", None, details)
        else:
            yield Case(classname, name, "passed", message, "", None, f"{message}\n{details}")


def write_log_tail(work: Path, fix_id: str, side: str, text: str) -> Path:
    """The last :data:`LOG_LINES` lines of one side's bench log, saying how many earlier ones were not kept."""
    dest = work / THROUGHPUT_DIR / fix_id / f"{side}.log"
    dest.parent.mkdir(parents=True, exist_ok=True)
    lines = text.strip().splitlines()
    kept = "\n".join(lines[-LOG_LINES:])
    if len(text.splitlines()) > LOG_LINES:
        kept = f"[{len(text.splitlines()) - LOG_LINES} earlier lines not kept]\n{kept}"
    dest.write_text(kept + "\n")
    return dest
