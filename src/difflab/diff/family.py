"""Is a build safe from a whole family of bugs? One answer per build, from the per-fix verdicts.

Operators do not ask whether a build carries #38935; they ask whether it is safe from the
family of KV bugs. Each member's verdict on the build (``present`` / ``absent`` /
``partial`` / ``not-applicable`` / ``error``, the same likeness verdict ``backport`` and
``contains`` give per fix) is sorted into what the answer needs:

- *covered*: ``present``;
- *missing*: ``absent`` or ``partial`` (the build shows the member's bug on some path);
- *unknown*: ``error``, or a member this run did not check;
- *n/a*: ``not-applicable`` (the build lacks the machinery the member modifies; it is not
  counted as safe, since a build without e.g. deferred release is not protected by it);
- *not checked by behaviour*: ``not-judged``, a member older than every pinned release that no
  probe judges. The lab does not check it, so it neither makes the build safe nor unsafe; the
  line names it with the matrix's reason, so "safe" never reads as covering it.

The build is *safe* only when every member is covered: the line then reads "safe from every
family member the lab checks"; otherwise it names the members missing, unknown or n/a.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from difflab.matrix.model import Family, Fix

COVERED, MISSING, UNKNOWN, NOT_APPLICABLE = "covered", "missing", "unknown", "n/a"
UNCHECKED = "not checked by behaviour"
_STANDING = {
    "present": COVERED,
    "absent": MISSING,
    "partial": MISSING,
    "not-applicable": NOT_APPLICABLE,
    "not-judged": UNCHECKED,
}
SAFE = "safe from every family member the lab checks"


@dataclass(frozen=True)
class MemberStanding:
    """One family member on one build."""

    fix: str
    label: str
    verdict: str
    """The per-fix verdict (``not checked`` when this run did not run the member)."""
    standing: str
    reason: str = ""
    """Why the lab does not judge it (a member not checked by behaviour: the matrix's reason)."""


@dataclass
class BuildAnswer:
    """The family's answer for one build (a release, a fork's commit)."""

    build: str
    members: list[MemberStanding] = field(default_factory=list)

    def named(self, standing: str) -> list[MemberStanding]:
        return [m for m in self.members if m.standing == standing]

    @property
    def checked(self) -> list[MemberStanding]:
        """The members the lab judges by behaviour (all but those not checked by behaviour)."""
        return [m for m in self.members if m.standing != UNCHECKED]

    @property
    def safe(self) -> bool:
        return bool(self.checked) and all(m.standing == COVERED for m in self.checked)

    def line(self) -> str:
        """The operator's answer in one line; members not checked by behaviour are named after it."""
        unchecked = self.named(UNCHECKED)
        tail = f"; {UNCHECKED}: " + ", ".join(f"{m.label} ({m.reason})" for m in unchecked) if unchecked else ""
        if self.safe:
            return f"{SAFE} ({len(self.checked)}: {', '.join(m.label for m in self.checked)}){tail}"
        parts = []
        for standing, words in ((MISSING, "missing"), (UNKNOWN, "unknown"), (NOT_APPLICABLE, "n/a")):
            named = self.named(standing)
            if named:
                parts.append(f"{words}: " + ", ".join(_member(m) for m in named))
        return "NOT safe: " + "; ".join(parts or ["no member is checked by behaviour"]) + tail

    def to_dict(self) -> dict[str, Any]:
        return {
            "build": self.build,
            "safe": self.safe,
            "line": self.line(),
            "members": [asdict(m) for m in self.members],
        }


def _member(m: MemberStanding) -> str:
    return m.label if m.verdict in ("absent", "error") else f"{m.label} ({m.verdict})"


@dataclass
class FamilyReport:
    """A family's answer for every build judged."""

    family: Family
    builds: list[BuildAnswer]

    def to_dict(self) -> dict[str, Any]:
        return {
            "family": self.family.name,
            "title": self.family.title,
            "members": list(self.family.members),
            "builds": [b.to_dict() for b in self.builds],
        }


def answer(family: Family, fixes: Mapping[str, Fix], build: str, verdicts: Mapping[str, str]) -> BuildAnswer:
    """One build's answer; ``verdicts`` maps fix id -> its verdict on the build (absent: not checked)."""
    members = []
    for fix_id in family.members:
        fix = fixes.get(fix_id)
        label = fix.label if fix else fix_id
        verdict = verdicts.get(fix_id, "not checked")
        reason = (fix.base.unavailable or "") if fix else ""
        members.append(MemberStanding(fix_id, label, verdict, _STANDING.get(verdict, UNKNOWN), reason))
    return BuildAnswer(build, members)


def judge_families(
    families: Iterable[Family], fixes: Iterable[Fix], per_build: Mapping[str, Mapping[str, str]]
) -> list[FamilyReport]:
    """Every family with a member judged in ``per_build`` (build -> fix id -> verdict), on every build.

    ``fixes`` are the matrix's fixes (for the members' labels); a member the run did not
    select reads ``not checked``, so a partial run never reads as safe.
    """
    by_id = {f.id: f for f in fixes}
    judged = {fix_id for verdicts in per_build.values() for fix_id in verdicts}
    return [
        FamilyReport(family, [answer(family, by_id, build, verdicts) for build, verdicts in per_build.items()])
        for family in families
        if judged & set(family.members)
    ]
