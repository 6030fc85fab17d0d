"""A backport check's files (``difflab backport``): backport.json, junit.xml and summary.md."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from difflab.diff.likeness import BackportVerdict
from difflab.report.junit import Case, write_cases
from difflab.report.markdown import cell as _cell
from difflab.report.markdown import declared as declared_values

SCHEMA = 2
"""``backport.json``'s schema version."""
ICON = {"present": "✅", "absent": "❌", "partial": "⚠️", "not-judged": "⏸️", "error": "💥"}


def backport_document(fork: dict[str, Any], verdicts: list[BackportVerdict]) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "fork": fork,
        "passed": all(v.passed for v in verdicts),
        "fixes": [v.to_dict() for v in verdicts],
    }


def write_backport_json(path: Path, fork: dict[str, Any], verdicts: list[BackportVerdict]) -> None:
    path.write_text(json.dumps(backport_document(fork, verdicts), indent=2, sort_keys=True) + "\n")


def write_backport_junit(path: Path, verdicts: list[BackportVerdict]) -> None:
    """One test case per fix x probe: passes when the probe behaves like the fix's head."""
    write_cases(path, "difflab-backport", _cases(verdicts))


def _cases(verdicts: list[BackportVerdict]) -> Iterator[Case]:
    for v in verdicts:
        if not v.probes:
            outcome = "skipped" if v.verdict == "not-judged" else "error"
            yield Case(f"backport.{v.id}", "(no probes)", outcome, v.reason, "error")  # a skipped case has no type
        for p in v.probes:
            if p.like in ("error", "control-drift", "other"):
                outcome, kind = "error", p.like
            else:
                outcome, kind = ("passed", "") if p.like == "head" else ("failed", f"behaves like {p.like}")
            fields = "\n".join(
                f"{c.kind} {c.field}: observed={c.observed!r} declared={c.declared_base!r}->{c.declared_head!r} "
                f"{c.like}"
                for c in p.fields
            )
            time = round(p.observation.duration_s, 3) if p.observation else 0.0
            yield Case(f"backport.{v.id}", p.probe, outcome, f"{p.like}: {p.reason}", kind, time, fields)


def _yes_no(value: bool | None) -> str:
    return {True: "yes", False: "no", None: "unknown"}[value]


def render_summary(fork: dict[str, Any], verdicts: list[BackportVerdict], appendix: Sequence[str] = ()) -> str:
    lines = [
        "# Backport check",
        "",
        f"Fork `{fork.get('repo')}` at `{fork.get('ref')}` = commit `{fork.get('commit')}` "
        f"(tree `{fork.get('tree')}`).",
        "",
        "| fix | title | verdict | reason | fix commit in history | patch-equivalent commit | version claims fix |",
        "|---|---|---|---|---|---|---|",
    ]
    for v in verdicts:
        ev = v.evidence
        eq = ", ".join(c[:12] for c in ev.get("equivalent_commits") or []) or _yes_no(ev.get("patch_equivalent"))
        lines.append(
            f"| {v.fix}{f' ({v.part})' if v.part else ''} | {_cell(v.title)} | {ICON.get(v.verdict, '')} {v.verdict} "
            f"| {_cell(v.reason)} | {_yes_no(ev.get('ancestor'))} | {_cell(eq)} "
            f"| {_yes_no(ev.get('version_claims_fix'))} |"
        )
    for v in verdicts:
        lines += ["", f"## #{v.fix}{f' ({v.part})' if v.part else ''}: {v.verdict}", ""]
        for warning in v.disagreements:
            lines.append(f"- ⚠️ {_cell(warning)}")
        for note in v.evidence.get("notes") or []:
            lines.append(f"- evidence: {_cell(note)}")
        for note in v.forced:
            lines.append(f"- forced by the probe: {_cell(note)}")
        for backend, own in v.backends.items():
            lines.append(f"- on the {backend} transport back end: {_cell(own)}")
        if v.paths:
            lines += ["", "| path | where | behaves like |", "|---|---|---|"]
            lines += [f"| `{path.hunk}` | {_cell(path.where)} | {path.like} |" for path in v.paths]
        for p in v.probes:
            lines += [
                "",
                f"### `{p.probe}`: like {p.like}",
                "",
                _cell(p.reason),
                "",
                "| field | kind | observed | declared base → head | |",
                "|---|---|---|---|---|",
            ]
            for c in p.fields:
                declared = declared_values(c.kind, c.declared_base, c.declared_head)
                lines.append(f"| `{c.field}` | {c.kind} | {_cell(repr(c.observed))} | {_cell(declared)} | {c.like} |")
    lines += list(appendix)
    return "\n".join(lines).rstrip("\n") + "\n"


def write_backport_summary(
    path: Path, fork: dict[str, Any], verdicts: list[BackportVerdict], appendix: Sequence[str] = ()
) -> None:
    """``appendix``: more Markdown for the end (SGLang's own tests, when they were replayed)."""
    path.write_text(render_summary(fork, verdicts, appendix))


def write_files(
    folder: Path, fork: dict[str, Any], verdicts: list[BackportVerdict], appendix: Sequence[str] = ()
) -> None:
    """backport.json, junit.xml and summary.md (with ``appendix``) into the run folder."""
    write_backport_json(folder / "backport.json", fork, verdicts)
    write_backport_junit(folder / "junit.xml", verdicts)
    write_backport_summary(folder / "summary.md", fork, verdicts, appendix)
