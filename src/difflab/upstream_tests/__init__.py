"""SGLang's own unit tests for each fix, replayed on the sources a workflow judged: a second, independent witness.

``files`` (where test files come from), ``process`` (the test child, one per source),
``outcomes`` (passed / failed / error / stale / skipped and the change), ``symbols`` (does a
source define a name: what the fix adds), ``replay`` (plans to results), ``agreement``
(beside the probes' verdicts), ``witness`` (per workflow), ``staging`` (the lab's own pytest for
pytest-style files). The files a replay leaves in a results folder are written by
:mod:`difflab.report.upstream_tests`.
"""

from difflab.upstream_tests.files import ENV, tests_dir
from difflab.upstream_tests.replay import FixReplay
from difflab.upstream_tests.witness import (
    agree_on_side,
    agree_with_run,
    for_run,
    for_sources,
    release_reference,
    with_flag,
)

__all__ = [
    "ENV",
    "FixReplay",
    "agree_on_side",
    "agree_with_run",
    "for_run",
    "for_sources",
    "release_reference",
    "tests_dir",
    "with_flag",
]
