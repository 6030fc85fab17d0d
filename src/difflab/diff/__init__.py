"""Compare observations with the matrix's expectations and turn them into verdicts."""

from difflab.diff.classify import Match, classify, controls_hold, same
from difflab.diff.verdict import VERDICTS, FieldResult, FixVerdict, ProbeDiff, judge_fix

__all__ = [
    "VERDICTS",
    "FieldResult",
    "FixVerdict",
    "Match",
    "ProbeDiff",
    "classify",
    "controls_hold",
    "judge_fix",
    "same",
]
