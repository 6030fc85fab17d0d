"""The throughput A/B as a verdict, so it lands in diff.json, junit.xml and summary.md like the rest.

There is no bug to show here, only a cost: every metric is a control ("no
significant regression"). ``confirmed`` means the head costs nothing measurable,
``control-drift`` names the metrics that regressed, ``error`` means too few rounds.
"""

from __future__ import annotations

from typing import Any

from difflab.diff.verdict import FieldResult, FixVerdict, ProbeDiff
from difflab.gpu.scenarios.throughput import THROUGHPUT, ABResult
from difflab.matrix.model import Fix
from difflab.observation import Observation

DECLARED = "no significant regression"


def judge_throughput(
    fix: Fix,
    ab: ABResult,
    base: Observation,
    head: Observation,
    base_label: dict[str, Any],
    head_label: dict[str, Any],
) -> FixVerdict:
    fields = [
        FieldResult(
            field=f"throughput.{m}",
            kind="control",
            base=round(c.base_mean, 4),
            head=round(c.head_mean, 4),
            declared_base=DECLARED,
            declared_head=DECLARED,
            ok=not c.regression,
        )
        for m, c in ab.comparisons.items()
    ]
    if ab.error or not ab.comparisons:
        verdict, reason = "error", ab.error or "no comparison"
    elif ab.regressions:
        verdict = "control-drift"
        reason = "head significantly worse: " + "; ".join(
            f"{m}: {ab.comparisons[m].describe()}" for m in ab.regressions
        )
    else:
        verdict = "confirmed"
        reason = DECLARED + ": " + "; ".join(f"{m}: {c.describe()}" for m, c in ab.comparisons.items())
    probe = ProbeDiff(
        probe=THROUGHPUT,
        verdict=verdict,
        reason=reason,
        base_match="-",
        head_match="-",
        fields=fields,
        base=base,
        head=head,
    )
    return FixVerdict(
        fix=fix.pr,
        id=f"{fix.id}-throughput",
        part="throughput",
        title=f"Throughput A/B: {fix.title}",
        verdict=verdict,
        reason=reason,
        expected_unavailable=False,
        base=base_label,
        head=head_label,
        probes=[probe],
    )
