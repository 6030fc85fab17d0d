"""Which release carries which fix, and which later release lost it: one cell per fix x release.

A cell is the shared likeness verdict (:mod:`difflab.diff.likeness`) of the fix's probes on
that release -- ``present`` / ``absent`` / ``partial`` / ``error`` -- or ``not-applicable``
when every probe reports that the release lacks the machinery the fix modifies (an old
release that predates it; the reason names the missing feature).

A *regression* is a fix ``present`` in a release and ``absent`` or ``partial`` in a later one:
a refactor that dropped a check, a default that flipped back. The matrix's base/head pins
imply an expectation for every release from the fix's base on; a cell that disagrees is
reported beside the table.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from packaging.version import Version

from difflab.diff.likeness import NOT_JUDGED, judge_backport
from difflab.matrix.model import Fix
from difflab.observation import Observation

PRESENT, ABSENT, PARTIAL, NOT_APPLICABLE, ERROR = "present", "absent", "partial", "not-applicable", "error"
VERDICTS = (PRESENT, ABSENT, PARTIAL, NOT_APPLICABLE, NOT_JUDGED, ERROR)
LOST = (ABSENT, PARTIAL)


@dataclass
class ProbeCell:
    """One probe's part of a cell: which side it behaves like, and its observation file."""

    like: str
    observation: str
    status: str


@dataclass
class Cell:
    """One fix on one release."""

    fix: str
    release: str
    verdict: str
    expected: str | None
    reason: str = ""
    probes: dict[str, ProbeCell] = field(default_factory=dict)
    regression: bool = False
    notes: list[str] = field(default_factory=list)
    """Switches the probes forced on this build, with its own default (see ``likeness.forced_notes``)."""
    upstream: dict[str, Any] | None = None
    """What SGLang's own tests said on this release, when they were replayed (``--upstream-tests``)."""
    backends: dict[str, str] = field(default_factory=dict)
    """Transport back end -> its own verdict on this release (``not-applicable: why`` where it lacks the machinery)."""

    def backend_note(self) -> str:
        """``present: mooncake, nixl · n/a: mori``: each back end's verdict, where a fix's paths are per back end."""
        groups: dict[str, list[str]] = {}
        for backend, verdict in self.backends.items():
            groups.setdefault("n/a" if verdict.startswith(NOT_APPLICABLE) else verdict, []).append(backend)
        return " · ".join(f"{v}: {', '.join(b)}" for v, b in groups.items())

    @property
    def agrees(self) -> bool:
        """Matches what the matrix's pins imply (a release lacking the machinery also lacks the fix)."""
        if self.expected is None:
            return True
        return self.verdict == self.expected or (self.expected == ABSENT and self.verdict == NOT_APPLICABLE)

    def to_dict(self) -> dict[str, Any]:
        return {
            "fix": self.fix,
            "release": self.release,
            "verdict": self.verdict,
            "expected": self.expected,
            "agrees": self.agrees,
            "regression": self.regression,
            "reason": self.reason,
            "probes": {name: vars(p) for name, p in self.probes.items()},
            "notes": self.notes,
            "backends": self.backends,
            **({"upstream": self.upstream} if self.upstream is not None else {}),
        }


@dataclass(frozen=True)
class Regression:
    """A fix present in ``present_in`` and lost (absent or partial) in the later ``lost_in``."""

    fix: str
    label: str
    present_in: str
    lost_in: str
    verdict: str
    reason: str

    def describe(self) -> str:
        return f"{self.label} present in {self.present_in}, {self.verdict} in {self.lost_in}: {self.reason}"


def release_order(versions: Sequence[str]) -> list[str]:
    return sorted(dict.fromkeys(versions), key=Version)


def expected_cell(fix: Fix, release: str) -> str | None:
    """What the matrix's pins imply from the fix's base release on: absent before the head release, present from it.

    A fix older than every pin (base unavailable) is implied present from its head release on.
    """
    if fix.base.unavailable and fix.head.release:
        return PRESENT if Version(release) >= Version(fix.head.release) else None
    if not fix.base.release or Version(release) < Version(fix.base.release):
        return None
    if fix.head.release:
        return PRESENT if Version(release) >= Version(fix.head.release) else ABSENT
    return ABSENT if fix.head.unavailable else None


def judge_cell(fix: Fix, release: str, obs: Mapping[str, Observation], paths: Mapping[str, str]) -> Cell:
    """One release's cell from its probes' observations (``paths``: probe -> observation file in the run)."""
    expected = expected_cell(fix, release)
    if not fix.probes and fix.base.unavailable:
        why = f"no probe judges it; base unavailable ({fix.base.unavailable})"
        return Cell(fix.id, release, NOT_JUDGED, None, why)
    if not fix.probes:
        return Cell(fix.id, release, ERROR, expected, "no probes declared for this fix in the matrix")
    if len(obs) == len(fix.probes) and all(o.status == "n/a" for o in obs.values()):
        why = {name: (o.error or "not applicable").removeprefix("not applicable: ") for name, o in obs.items()}
        reason = "; ".join(f"{name}: {text}" for name, text in why.items())
        probes = {name: ProbeCell("n/a", paths.get(name, ""), o.status) for name, o in obs.items()}
        return Cell(fix.id, release, NOT_APPLICABLE, expected, reason, probes)
    judged = judge_backport(fix, dict(obs))
    probes = {
        p.probe: ProbeCell(p.like, paths.get(p.probe, ""), obs[p.probe].status if p.probe in obs else "missing")
        for p in judged.probes
    }
    return Cell(
        fix.id,
        release,
        judged.verdict,
        expected,
        judged.reason,
        probes,
        notes=list(judged.forced),
        backends=dict(judged.backends),
    )


def find_regressions(fixes: Sequence[Fix], releases: Sequence[str], cells: Sequence[Cell]) -> list[Regression]:
    """Every cell that lost a fix an earlier release had; marks those cells ``regression``."""
    by = {(c.fix, c.release): c for c in cells}
    found = []
    for fix in fixes:
        last_present: str | None = None
        for release in release_order(releases):
            cell = by.get((fix.id, release))
            if cell is None:
                continue
            if cell.verdict == PRESENT:
                last_present = release
            elif cell.verdict in LOST and last_present is not None:
                cell.regression = True
                found.append(Regression(fix.id, fix.label, last_present, release, cell.verdict, cell.reason))
    return found


@dataclass(frozen=True)
class ReleaseColumn:
    """One release of the table and what the watch knows about it."""

    version: str
    file: str
    sha256: str
    new: bool = False
    """Not among the releases the matrix pins by hand: discovered by the watch, its cells unreviewed."""
    first_seen: str | None = None
    environment: str = ""
    yanked: str | None = None
    prerelease: bool = False

    def to_dict(self) -> dict[str, Any]:
        return dict(vars(self))


@dataclass
class ContainmentTable:
    """Every fix on every release, and what the table says: regressions first."""

    fixes: list[Fix]
    releases: list[ReleaseColumn]
    cells: list[Cell]
    regressions: list[Regression] = field(default_factory=list)

    def cell(self, fix_id: str, release: str) -> Cell:
        return next(c for c in self.cells if c.fix == fix_id and c.release == release)

    @property
    def new_releases(self) -> list[ReleaseColumn]:
        return [r for r in self.releases if r.new]

    @property
    def errors(self) -> list[Cell]:
        return [c for c in self.cells if c.verdict == ERROR]

    @property
    def disagreements(self) -> list[Cell]:
        return [c for c in self.cells if not c.agrees]

    @property
    def exit_code(self) -> int:
        """1 on a regression, an error or a cell the matrix's pins contradict; else 0."""
        return 1 if self.regressions or self.errors or self.disagreements else 0
