"""A backport check's files: backport.json, junit.xml and summary.md."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from junitparser import Error, Failure, JUnitXml, TestCase, TestSuite

from difflab.diff.likeness import BackportVerdict
from difflab.observation import SCHEMA_VERSION

ICON = {"present": "✅", "absent": "❌", "partial": "⚠️", "error": "💥"}


def backport_document(fork: dict[str, Any], verdicts: list[BackportVerdict]) -> dict[str, Any]:
    return {
        "schema": SCHEMA_VERSION,
        "fork": fork,
        "passed": all(v.passed for v in verdicts),
        "fixes": [v.to_dict() for v in verdicts],
    }


def write_backport_json(path: Path, fork: dict[str, Any], verdicts: list[BackportVerdict]) -> None:
    path.write_text(json.dumps(backport_document(fork, verdicts), indent=2, sort_keys=True) + "\n")


def write_backport_junit(path: Path, verdicts: list[BackportVerdict]) -> None:
    """One test case per fix x probe: passes when the probe behaves like the fix's head."""
    suite = TestSuite("difflab-backport")
    for v in verdicts:
        if not v.probes:
            case = TestCase(name="(no probes)", classname=f"backport.{v.id}")
            case.result = [Error(v.reason, "error")]
            suite.add_testcase(case)
            continue
        for p in v.probes:
            case = TestCase(name=p.probe, classname=f"backport.{v.id}")
            case.time = round(p.observation.duration_s, 3) if p.observation else 0.0
            message = f"{p.like}: {p.reason}"
            if p.like in ("error", "control-drift", "other"):
                case.result = [Error(message, p.like)]
            elif p.like != "head":
                case.result = [Failure(message, f"behaves like {p.like}")]
            case.system_out = "\n".join(
                f"{c.kind} {c.field}: observed={c.observed!r} declared={c.declared_base!r}->{c.declared_head!r} "
                f"{c.like}"
                for c in p.fields
            )
            suite.add_testcase(case)
    xml = JUnitXml()
    xml.add_testsuite(suite)
    xml.write(str(path), pretty=True)


def _cell(value: object) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def _yes_no(value: bool | None) -> str:
    return {True: "yes", False: "no", None: "unknown"}[value]


def render_summary(fork: dict[str, Any], verdicts: list[BackportVerdict]) -> str:
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
                declared = (
                    f"{c.declared_base!r} → {c.declared_head!r}" if c.kind == "expect" else f"= {c.declared_base!r}"
                )
                lines.append(f"| `{c.field}` | {c.kind} | {_cell(repr(c.observed))} | {_cell(declared)} | {c.like} |")
    return "\n".join(lines) + "\n"


def write_backport_summary(path: Path, fork: dict[str, Any], verdicts: list[BackportVerdict]) -> None:
    path.write_text(render_summary(fork, verdicts))
