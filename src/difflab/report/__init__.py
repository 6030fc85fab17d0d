"""Writers for a run folder's files: run.json, diff.json, junit.xml, summary.md."""

from collections.abc import Sequence
from pathlib import Path

from difflab.diff.throughput import ThroughputResult
from difflab.diff.verdict import FixVerdict
from difflab.report import throughput as throughput_report
from difflab.report.junit import verdict_cases, write_cases, write_junit
from difflab.report.markdown import write_summary
from difflab.report.record import RunRecord
from difflab.report.results import write_diff_json


def write_reports(
    folder: Path,
    verdicts: list[FixVerdict],
    *,
    title: str = "SGLang fix verification",
    suite: str = "difflab",
    extra: dict | None = None,
    appendix: Sequence[str] = (),
    throughput: list[ThroughputResult] | None = None,
    fail_above: float | None = None,
) -> None:
    """diff.json, junit.xml and summary.md for ``verdicts``: each fix's throughput A/B if measured, and
    ``appendix`` (more Markdown for the summary, e.g. SGLang's own tests)."""
    write_diff_json(folder / "diff.json", verdicts, extra, throughput)
    if not throughput:
        write_junit(folder / "junit.xml", verdicts, suite_name=suite)
        write_summary(folder / "summary.md", verdicts, title, appendix)
        return
    cases = [*verdict_cases(verdicts), *throughput_report.junit_cases(throughput, fail_above)]
    write_cases(folder / "junit.xml", suite, cases)
    section = throughput_report.summary_lines(throughput, fail_above)
    write_summary(folder / "summary.md", verdicts, title, [*section, *appendix])


__all__ = ["RunRecord", "write_diff_json", "write_junit", "write_reports", "write_summary"]
