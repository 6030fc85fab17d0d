"""Writers for a run folder's files: run.json, diff.json, junit.xml, summary.md."""

from collections.abc import Sequence
from pathlib import Path

from difflab.diff.verdict import FixVerdict
from difflab.report.junit import write_junit
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
) -> None:
    """diff.json, junit.xml and summary.md for ``verdicts`` (``appendix``: more Markdown for the summary)."""
    write_diff_json(folder / "diff.json", verdicts, extra)
    write_junit(folder / "junit.xml", verdicts, suite_name=suite)
    write_summary(folder / "summary.md", verdicts, title, appendix)


__all__ = ["RunRecord", "write_diff_json", "write_junit", "write_reports", "write_summary"]
