"""Writers for a run folder's files: run.json, diff.json, junit.xml, summary.md."""

import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from xml.sax.saxutils import quoteattr

from difflab.diff.verdict import FixVerdict
from difflab.files.names import printable
from difflab.report import throughput as throughput_report
from difflab.report.junit import verdict_cases, write_cases, write_junit, xml_text
from difflab.report.markdown import cell, write_summary
from difflab.report.record import RunRecord
from difflab.report.results import write_diff_json
from difflab.report.throughput import Measured


def write_reports(
    folder: Path,
    verdicts: list[FixVerdict],
    *,
    title: str = "SGLang fix verification",
    suite: str = "difflab",
    extra: dict | None = None,
    appendix: Sequence[str] = (),
    throughput: Measured | None = None,
) -> None:
    """diff.json, junit.xml and summary.md for ``verdicts``: each fix's throughput A/B if measured, and
    ``appendix`` (more Markdown for the summary, e.g. SGLang's own tests)."""
    fail_above = throughput.fail_above if throughput else None
    measured = throughput.results if throughput else None
    write_diff_json(folder / "diff.json", verdicts, extra, measured)
    junit, summary = folder / "junit.xml", folder / "summary.md"
    if not measured:
        _or_stand_in(junit, lambda: write_junit(junit, verdicts, suite_name=suite))
        _or_stand_in(summary, lambda: write_summary(summary, verdicts, title, appendix))
        return
    cases = [*verdict_cases(verdicts), *throughput_report.junit_cases(measured, fail_above)]
    _or_stand_in(junit, lambda: write_cases(junit, suite, cases))
    section = throughput_report.summary_lines(measured, fail_above)
    _or_stand_in(summary, lambda: write_summary(summary, verdicts, title, [*section, *appendix]))


def _or_stand_in(path: Path, write: Callable[[], None]) -> None:
    """Run one writer; if it fails, a short file in its place says why: diff.json, written first, holds
    every verdict, and the run folder is kept."""
    try:
        write()
    except Exception as exc:  # noqa: BLE001 - a report writer must never cost the results folder
        why = f"{type(exc).__name__}: {exc}"
        print(
            f"difflab: {path.name} could not be written ({printable(why)}); diff.json holds every verdict",
            file=sys.stderr,
        )
        if path.suffix == ".xml":
            message = quoteattr(xml_text(why))
            path.write_text(
                '<?xml version="1.0" encoding="utf-8"?>\n<testsuites><testsuite name="difflab" tests="1" errors="1">'
                f'<testcase classname="difflab" name="report"><error message={message}/></testcase>'
                "</testsuite></testsuites>\n"
            )
        else:
            path.write_text(
                f"# {path.stem}\n\n{path.name} could not be written: {cell(why)}; diff.json holds every verdict.\n"
            )


__all__ = ["Measured", "RunRecord", "write_diff_json", "write_junit", "write_reports", "write_summary"]
