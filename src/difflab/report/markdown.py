"""``summary.md``: what a person reads first."""

from __future__ import annotations

from pathlib import Path

from difflab.diff.verdict import FixVerdict

ICON = {
    "confirmed": "✅",
    "unavailable": "⏸️",
    "not-fixed": "❌",
    "not-reproduced": "❓",
    "control-drift": "⚠️",
    "error": "💥",
}


def _cell(value: object) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def render_summary(verdicts: list[FixVerdict], title: str = "SGLang fix verification") -> str:
    lines = [f"# {title}", "", "| fix | title | base | head | verdict | reason |", "|---|---|---|---|---|---|"]
    for v in verdicts:
        lines.append(
            f"| {v.fix}{f' ({v.part})' if v.part else ''} | {_cell(v.title)} | {_cell(v.base.get('label', ''))} "
            f"| {_cell(v.head.get('label', ''))} | {ICON.get(v.verdict, '')} {v.verdict} | {_cell(v.reason)} |"
        )
    for v in verdicts:
        if not v.probes:
            continue
        lines += ["", f"## #{v.fix}{f' ({v.part})' if v.part else ''}: {v.title}", ""]
        for p in v.probes:
            lines += [
                f"### `{p.probe}`: {p.verdict}",
                "",
                _cell(p.reason),
                "",
                "| field | kind | base | head | declared base → head | |",
                "|---|---|---|---|---|---|",
            ]
            for f in p.fields:
                if f.kind == "expect":
                    declared = f"{f.declared_base!r} → {f.declared_head!r}"
                else:
                    declared = f"= {f.declared_base!r}"
                lines.append(
                    f"| `{f.field}` | {f.kind} | {_cell(repr(f.base))} | {_cell(repr(f.head))} | {_cell(declared)} "
                    f"| {'✓' if f.ok else '✗'} |"
                )
    return "\n".join(lines) + "\n"


def write_summary(path: Path, verdicts: list[FixVerdict], title: str = "SGLang fix verification") -> None:
    path.write_text(render_summary(verdicts, title))
