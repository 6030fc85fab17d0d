"""Writers for a run's results: diff.json, junit.xml, summary.md."""

from difflab.report.junit import write_junit
from difflab.report.markdown import write_summary
from difflab.report.results import write_diff_json

__all__ = ["write_diff_json", "write_junit", "write_summary"]
