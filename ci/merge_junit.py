#!/usr/bin/env python3
"""Merge the JUnit files of every CI job into one, and write a Markdown summary of it.

    python ci/merge_junit.py --out merged.xml --summary "$GITHUB_STEP_SUMMARY" 'artifacts/**/junit*.xml'

Exit status 1 when any test case failed or errored (after writing both files), 2
when no JUnit file was found: an empty report must not look like a green one.
"""

from __future__ import annotations

import argparse
import glob
import sys
from pathlib import Path

from junitparser import Error, Failure, JUnitXml, Skipped


def collect(patterns: list[str]) -> list[Path]:
    found: set[Path] = set()
    for pattern in patterns:
        found.update(Path(p) for p in glob.glob(pattern, recursive=True) if Path(p).is_file())
    return sorted(found)


def merge(files: list[Path]) -> tuple[JUnitXml, list[str]]:
    """One document holding every suite; unreadable files are reported, not dropped silently."""
    merged = JUnitXml(name="difflab CI")
    problems = []
    for path in files:
        try:
            doc = JUnitXml.fromfile(str(path))
        except Exception as exc:  # junitparser raises lxml/ElementTree errors of several kinds
            problems.append(f"{path}: not a JUnit file ({exc})")
            continue
        suites = [doc] if doc._tag == "testsuite" else list(doc)
        for suite in suites:
            suite.name = f"{suite.name or path.stem} ({path.parent.name})"
            merged.add_testsuite(suite)
    return merged, problems


def summary(merged: JUnitXml, problems: list[str], title: str) -> str:
    """Markdown: one row per suite, then every failing case with its message."""
    lines = [f"## {title}", "", "| suite | tests | failures | errors | skipped |", "|---|---|---|---|---|"]
    failing = []
    for suite in merged:
        counts = {"failures": 0, "errors": 0, "skipped": 0}
        total = 0
        for case in suite:
            total += 1
            for result in case.result:
                if isinstance(result, Failure):
                    counts["failures"] += 1
                    failing.append((suite.name, case, result))
                elif isinstance(result, Error):
                    counts["errors"] += 1
                    failing.append((suite.name, case, result))
                elif isinstance(result, Skipped):
                    counts["skipped"] += 1
        mark = "❌" if counts["failures"] or counts["errors"] else "✅"
        lines.append(
            f"| {mark} {suite.name} | {total} | {counts['failures']} | {counts['errors']} | {counts['skipped']} |"
        )
    if failing:
        lines += ["", "### Failing", ""]
        for suite_name, case, result in failing:
            message = (result.message or "").replace("\n", " ")[:300]
            lines.append(f"- **{suite_name}** `{case.classname}.{case.name}`: {message}")
    if problems:
        lines += ["", "### Unreadable reports", "", *(f"- {p}" for p in problems)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("patterns", nargs="+", help="JUnit files or glob patterns (** allowed)")
    parser.add_argument("--out", type=Path, required=True, help="merged JUnit file")
    parser.add_argument("--summary", type=Path, help="append the Markdown summary here ($GITHUB_STEP_SUMMARY)")
    parser.add_argument("--title", default="difflab CI results")
    args = parser.parse_args(argv)
    files = [f for f in collect(args.patterns) if f.resolve() != args.out.resolve()]
    if not files:
        print(f"no JUnit files match {args.patterns}", file=sys.stderr)
        return 2
    merged, problems = merge(files)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    merged.write(str(args.out), pretty=True)
    text = summary(merged, problems, args.title)
    if args.summary:
        with args.summary.open("a") as fh:
            fh.write(text)
    print(text)
    bad = any(isinstance(r, Failure | Error) for suite in merged for case in suite for r in case.result)
    return 1 if bad or problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
