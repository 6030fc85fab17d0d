"""The GPU tier's additions to summary.md: the throughput A/B table and the per-side preflight gates."""

from __future__ import annotations

from difflab.gpu.scenarios.throughput import ABResult
from difflab.preflight.gates import PreflightReport
from difflab.report.markdown import cell

ICON = {"pass": "✅", "fail": "❌", "unknown": "❓", "not-applicable": "➖"}


def throughput_section(fix_label: str, ab: ABResult) -> list[str]:
    lines = ["", f"## Throughput A/B: {fix_label}", "", f"Rounds: {ab.to_dict()['order']}", ""]
    if ab.error:
        return [*lines, f"**error:** {cell(ab.error)}"]
    lines += [
        "| metric | base mean | head mean | head vs base | 95% CI | Mann-Whitney p | result |",
        "|---|---|---|---|---|---|---|",
    ]
    for metric, c in ab.comparisons.items():
        result = (
            "no significant difference" if not c.significant else ("**regression**" if c.regression else "improvement")
        )
        lines.append(
            f"| `{metric}` | {c.base_mean:.4g} | {c.head_mean:.4g} | {c.rel_diff:+.2%} | "
            f"[{c.ci_low:+.2%}, {c.ci_high:+.2%}] | {c.p_value:.3g} | {result} |"
        )
    return lines


def preflight_section(reports: dict[str, PreflightReport]) -> list[str]:
    if not reports:
        return []
    lines = [
        "",
        "## Preflight gates of each deployment",
        "",
        "Informational: the GPU deployment keeps the prefill pool below the context length on purpose, "
        "so that the #38935 door exists.",
        "",
        "| deployment | gate | status | reason |",
        "|---|---|---|---|",
    ]
    for label, report in reports.items():
        for g in report.gates:
            lines.append(f"| {cell(label)} | {g.gate} | {ICON.get(g.status, '')} {g.status} | {cell(g.reason)} |")
    return lines
