"""``summary.md``: what a person reads first; and the Markdown pieces every summary is made of."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from difflab.diff.verdict import FixVerdict, ProbeDiff
from difflab.files.names import printable

ICON = {
    "confirmed": "✅",
    "unavailable": "⏸️",
    "not-fixed": "❌",
    "not-reproduced": "❓",
    "control-drift": "⚠️",
    "error": "💥",
}


_ENTITIES = {"&": "&amp;", "<": "&lt;", ">": "&gt;", "[": "&#91;", "]": "&#93;", "|": "&#124;", "`": "&#96;"}


def cell(value: object) -> str:
    """``value`` as plain text in Markdown: one line, and no markup of its own.

    Text from a build (an exception's message, a field's value) is data: HTML, links, images,
    code spans and autolinks in it are written as the characters they are, so a summary that CI
    publishes as a step summary shows them instead of rendering them. Control characters are
    shown as escapes.
    """
    text = "".join(_ENTITIES.get(ch, ch) for ch in printable(str(value).replace("\n", " ")))
    return text.replace("://", "&#58;//").replace("www.", "www&#46;")


def code(value: object) -> str:
    """``value`` as inline code: its backticks cannot end the span, nor its pipes the table cell."""
    text = printable(str(value).replace("\n", " ")).replace("|", "\\|")
    if "`" not in text:
        return f"`{text}`"
    while "``" in text:
        text = text.replace("``", "` `")
    return f"`` {text} ``"


def declared(kind: str, base: object, head: object) -> str:
    """What the matrix declares for a field: ``base → head`` for an expectation, ``= value`` for a control."""
    return f"{base!r} → {head!r}" if kind == "expect" else f"= {base!r}"


def table(headers: Sequence[str], rows: Iterable[Sequence[object]], align: Sequence[str] | None = None) -> list[str]:
    """A Markdown table's lines; cells are used as given (escape them with :func:`cell` where needed).

    ``align`` holds one rule per column (``"---"``, ``"---:"``); the default is ``"---"`` for all.
    """
    rules = align or ["---"] * len(headers)
    return [_row(headers), "|" + "|".join(rules) + "|", *(_row(r) for r in rows)]


def _row(cells: Sequence[object]) -> str:
    return "|" + "|".join(f" {c} " if str(c) else " " for c in cells) + "|"


def render_summary(
    verdicts: list[FixVerdict], title: str = "SGLang fix verification", appendix: Sequence[str] = ()
) -> str:
    """The verdict table, each probe's fields, then ``appendix`` (lines other steps contribute, e.g. upstream tests)."""
    rows = [
        (
            f"{v.fix}{f' ({v.part})' if v.part else ''}",
            cell(v.title),
            cell(v.base.get("label", "")),
            cell(v.head.get("label", "")),
            f"{ICON.get(v.verdict, '')} {v.verdict}",
            cell(v.reason),
        )
        for v in verdicts
    ]
    lines = [f"# {title}", "", *table(("fix", "title", "base", "head", "verdict", "reason"), rows)]
    for v in verdicts:
        if not v.probes:
            continue
        lines += ["", f"## #{v.fix}{f' ({cell(v.part)})' if v.part else ''}: {cell(v.title)}", ""]
        for p in v.probes:
            fields = [
                (
                    code(f.field),
                    f.kind,
                    cell(repr(f.base)),
                    cell(repr(f.head)),
                    cell(declared(f.kind, f.declared_base, f.declared_head)),
                    "✓" if f.ok else "✗",
                )
                for f in p.fields
            ]
            headers = ("field", "kind", "base", "head", "declared base → head", "")
            lines += [f"### {code(p.probe)}: {cell(p.verdict)}", "", cell(p.reason), ""]
            notes = [f"- {line}" for line in [*forced_lines(p), *undeclared_lines(p)]]
            lines += [*notes, ""] if notes else []
            lines += table(headers, fields)
    lines += list(appendix)
    return "\n".join(lines).rstrip("\n") + "\n"


def undeclared_lines(probe: ProbeDiff) -> list[str]:
    """Fields the probe returned that no expect or control names: evidence nobody judges (a missing declaration?)."""
    if not probe.undeclared:
        return []
    return [f"observed, declared in no expect or control: {', '.join(code(f) for f in probe.undeclared)}"]


def forced_lines(probe: ProbeDiff) -> list[str]:
    """Switches the probe forced on each side, with that build's own default (an operator must read them)."""
    out = []
    for side, obs in (("base", probe.base), ("head", probe.head)):
        for entry in (obs.forced if obs else None) or []:
            env = ", ".join(entry.get("env") or []) or "no environment variable"
            out.append(
                f"{side}: {code(entry.get('attribute'))} forced to {cell(repr(entry.get('value')))}; "
                f"this build's default is {cell(repr(entry.get('build_default')))} ({cell(env)})"
            )
    return out


def write_summary(path: Path, verdicts: list[FixVerdict], title: str, appendix: Sequence[str]) -> None:
    """summary.md (:func:`render_summary`); the caller gives the title and the appendix."""
    path.write_text(render_summary(verdicts, title, appendix))
