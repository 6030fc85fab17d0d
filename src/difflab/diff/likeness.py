"""Does one source carry a fix? Each path the fix changes, observed on the source, against the matrix.

One answer shared by ``backport`` (a fork's ref), ``bisect`` (each commit)
and ``contains`` (each release).

The declared ``expect`` pairs are the reference. The matrix splits a fix into
*hunks*: the code paths it changes, each observed by named expect fields. A
path is *head-like* when every one of its fields has its head (fixed) value
and *base-like* when every one has its base (bug) value. Controls must hold
either way, or the behaviour is not attributable to the fix. Per fix:
``present`` (every path head-like), ``absent`` (every path base-like),
``partial`` (some each, or a path mixed within itself; the reason names which
path behaves like which side), ``error`` (no trustworthy answer: probe error,
control off, a field matching neither side).

``present`` therefore means: every path the matrix lists behaves like the
fix's head on this source, under this build's own defaults -- except the
switches a probe forces, which are reported beside the verdict with the
build's default. It cannot speak for paths the matrix does not list.

A path on a transport back end (``failure-notify@nixl``) is judged from that back
end's fields. A back end the source lacks, or one without the fix's machinery, is
``n/a`` for its paths and named beside the verdict; the verdict is then made from
the other back ends (``not-applicable`` when no path is left). ``partial`` names
the back end whose paths behave like the base.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from difflab.diff.backends import applicable, as_declared, gaps
from difflab.diff.classify import Match, classify, controls_hold, field_side
from difflab.diff.fields import describe_missing
from difflab.matrix.model import Fix, ProbeSpec
from difflab.observation import Observation

NOT_JUDGED = "not-judged"
"""A fix older than every pinned release (base unavailable) that no probe judges by behaviour."""
VERDICTS = ("present", "absent", "partial", "not-applicable", NOT_JUDGED, "error")


@dataclass
class FieldCheck:
    """One field observed on the fork, beside what base and head declare."""

    field: str
    kind: str  # "expect" | "control"
    observed: Any
    declared_base: Any
    declared_head: Any
    like: str  # "base" | "head" | "other" | "missing" for expect; "ok" | "off" | "missing" for control


@dataclass
class ProbeComparison:
    """One probe on the fork: which side it behaves like, and why."""

    probe: str
    like: str  # head | base | mixed | other | error | control-drift | n/a
    reason: str
    fields: list[FieldCheck]
    observation: Observation | None = None
    not_applicable: dict[str, str] = field(default_factory=dict)
    """Back end -> why it does not apply on this source (its fields are not judged)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)  # the observation too, as Observation.to_dict writes it


@dataclass
class PathCheck:
    """One code path of the fix (a matrix hunk) on this source."""

    hunk: str
    where: str  # "file: function"
    like: str  # head | base | mixed | masked | other | missing | n/a
    fields: list[str]
    backend: str | None = None

    def describe(self) -> str:
        return f"{self.hunk} ({self.where})"


@dataclass
class BackportVerdict:
    """The verdict for one fix on one source, its probe comparisons and (for forks) the git evidence."""

    fix: int
    id: str
    part: str | None
    title: str
    verdict: str
    reason: str
    probes: list[ProbeComparison]
    evidence: dict[str, Any] = field(default_factory=dict)
    disagreements: list[str] = field(default_factory=list)
    paths: list[PathCheck] = field(default_factory=list)
    forced: list[str] = field(default_factory=list)
    """Switches the probes forced, with this build's own default where it differs."""
    backends: dict[str, str] = field(default_factory=dict)
    """Transport back end -> its own verdict (``present``, ``absent``, ``partial``, ``not-applicable: why``)."""
    upstream_tests: dict[str, Any] | None = None
    """What SGLang's own tests said on this source (``upstream-tests.json``), when they were replayed."""

    @property
    def passed(self) -> bool:
        return self.verdict in ("present", NOT_JUDGED)  # not judged: named in the report, not failed

    def to_dict(self) -> dict[str, Any]:
        return {
            "fix": self.fix,
            "id": self.id,
            "part": self.part,
            "title": self.title,
            "verdict": self.verdict,
            "reason": self.reason,
            "passed": self.passed,
            "head_like": [p.probe for p in self.probes if p.like == "head"],
            "base_like": [p.probe for p in self.probes if p.like == "base"],
            "probes": [p.to_dict() for p in self.probes],
            "paths": [asdict(p) for p in self.paths],
            "forced": self.forced,
            "backends": self.backends,
            "evidence": self.evidence,
            "disagreements": self.disagreements,
        } | ({"upstream_tests": self.upstream_tests} if self.upstream_tests is not None else {})


def _field_checks(spec: ProbeSpec, obs: Observation | None) -> list[FieldCheck]:
    seen = obs.fields if obs is not None and obs.ok else {}
    out = []
    for name, pair in spec.expect.items():
        like = field_side(seen[name], pair) if name in seen else "missing"
        out.append(FieldCheck(name, "expect", seen.get(name), pair[0], pair[1], like))
    off = set(controls_hold(obs, spec))
    for name, value in spec.controls.items():
        like = "missing" if name not in seen else ("off" if name in off else "ok")
        out.append(FieldCheck(name, "control", seen.get(name), value, value, like))
    return out


def compare_probe(spec: ProbeSpec, obs: Observation | None) -> ProbeComparison:
    """Which side the fork's observation of one probe behaves like (on the back ends that apply)."""
    obs = as_declared(spec, obs)
    skipped = gaps(obs, spec)
    if skipped:
        spec = applicable(spec, skipped)
        if not spec.expect:
            why = "; ".join(f"{b}: {r}" for b, r in skipped.items())
            return ProbeComparison(spec.name, "n/a", f"not applicable on any back end ({why})", [], obs, skipped)
    found = _compare(spec, obs)
    found.not_applicable = skipped
    return found


def _compare(spec: ProbeSpec, obs: Observation | None) -> ProbeComparison:
    checks = _field_checks(spec, obs)
    match = classify(obs, spec)
    if match is Match.ERROR:
        never = describe_missing(spec, obs)  # a misspelt expect field, named
        why = (
            "no observation"
            if obs is None
            else never or ((obs.error or "").strip().splitlines()[-1:] or ["an expected field is missing"])[0]
        )
        return ProbeComparison(spec.name, "error", f"probe error: {why}", checks, obs)
    off = [c.field for c in checks if c.kind == "control" and c.like != "ok"]
    if off:
        return ProbeComparison(
            spec.name, "control-drift", "control field(s) off their declared value: " + ", ".join(off), checks, obs
        )
    like = match.value
    expect = [c for c in checks if c.kind == "expect"]
    if like == "head":
        reason = "every expected field has its head (fixed) value"
    elif like == "base":
        reason = "every expected field has its base (bug) value"
    elif like == "mixed":
        reason = "head-like: {}; base-like: {}".format(
            ", ".join(c.field for c in expect if c.like == "head"),
            ", ".join(c.field for c in expect if c.like == "base"),
        )
    else:
        reason = "matches neither side: " + ", ".join(f"{c.field}={c.observed!r}" for c in expect if c.like == "other")
    return ProbeComparison(spec.name, like, reason, checks, obs)


def _path_checks(fix: Fix, probes: list[ProbeComparison]) -> list[PathCheck]:
    """Which side each path behaves like.

    A field can observe several paths: the door's ``rejected.cache_aborts`` sees
    both the door check and the retirement behind it. A path whose base-like
    fields are all explained by a path that is wholly base-like (a fork that
    dropped the door never reaches the retirement behind it) is judged by its
    remaining fields; if none remain, it cannot be told apart (``masked``).
    """
    sides = _FieldSides({p.probe: {c.field: c for c in p.fields if c.kind == "expect"} for p in probes})
    skipped = {b: r for p in probes for b, r in p.not_applicable.items()}
    raw = {
        hunk.id: "n/a" if hunk.backend in skipped else _combined({sides(*pf) for pf in hunk.observed()})
        for hunk in fix.hunks
    }
    explained = {pf for hunk in fix.hunks if raw[hunk.id] == "base" for pf in hunk.observed()}
    out = []
    for hunk in fix.hunks:
        fields = hunk.observed()
        like, masking = _unmasked(raw[hunk.id], fields, explained, sides)
        if like == "n/a":
            masking = f" (not applicable on {hunk.backend}: {skipped[hunk.backend or '']})"
        where = f"{hunk.file}: {hunk.function}{masking}"
        out.append(PathCheck(hunk.id, where, like, [f for _, f in fields], hunk.backend))
    return out


@dataclass(frozen=True)
class _FieldSides:
    """Which side each probe field behaved like (``missing``: the field was not observed)."""

    by_probe: dict[str, dict[str, FieldCheck]]

    def __call__(self, probe: str, name: str) -> str:
        check = self.by_probe.get(probe, {}).get(name)
        return check.like if check is not None else "missing"


def _combined(sides: set[str]) -> str:
    """One path's side from the sides of the fields observing it."""
    if sides & {"other", "missing"}:
        return "other" if "other" in sides else "missing"
    if sides == {"head"}:
        return "head"
    if sides == {"base"}:
        return "base"
    return "mixed"


def _unmasked(
    like: str, fields: list[tuple[str, str]], explained: set[tuple[str, str]], sides: _FieldSides
) -> tuple[str, str]:
    """A mixed path whose base-like fields a wholly base-like path explains: judged by its other fields."""
    if like != "mixed":
        return like, ""
    own = [pf for pf in fields if pf not in explained]
    if any(sides(*pf) == "base" for pf in own):
        return like, ""
    return ("head" if own else "masked"), " (its other fields are explained by a path like the base)"


def _backend_verdicts(paths: list[PathCheck], skipped: dict[str, str]) -> dict[str, str]:
    """Each back end's own verdict, from its paths alone."""
    out: dict[str, str] = {}
    for backend in dict.fromkeys(p.backend for p in paths if p.backend):
        if backend in skipped:
            out[backend] = f"not-applicable: {skipped[backend]}"
            continue
        likes = {p.like for p in paths if p.backend == backend}
        out[backend] = "present" if likes == {"head"} else "absent" if likes <= {"base", "masked"} else "partial"
    return out


def forced_notes(observations: dict[str, Observation]) -> list[str]:
    """What the probes forced on this build, said the way an operator needs to hear it."""
    notes: list[str] = []
    for obs in observations.values():
        for entry in obs.forced or []:
            attribute = str(entry.get("attribute", "?"))
            value, default = entry.get("value"), entry.get("build_default")
            what = _switch_words(attribute)
            env = entry.get("env") or []
            if default is None:
                note = f"{what} ({attribute}) is forced to {value!r} by the probe; {entry.get('from', '')}"
            elif default == value:
                note = f"{what} is {'on' if value is True else repr(value)} by default in this build ({attribute})"
            else:
                state = "off" if default is False else "on" if default is True else f"{default!r}"
                unless = f": the fix is inactive unless {env[0]}=1" if env and value is True else ""
                # a value a scenario forces away from the build's (a control's switch off, a short timeout)
                instead = "" if value is True else f"; a scenario forces {'off' if value is False else repr(value)}"
                note = f"{what} is {state} by default in this build ({entry.get('from', attribute)}){unless}{instead}"
            if note not in notes:
                notes.append(note)
    return notes


def _switch_words(attribute: str) -> str:
    name = attribute.rsplit(".", 1)[-1].removeprefix("enable_")
    return " ".join("KV" if w == "kv" else w for w in name.split("_"))


@dataclass(frozen=True)
class _Verdicts:
    """Makes one fix's verdict on one source, with what every verdict carries (the forced switches, back ends)."""

    fix: Fix
    forced: list[str]

    def __call__(self, v: str, reason: str, probes: list[ProbeComparison], paths: list[PathCheck]) -> BackportVerdict:
        skipped = {b: r for p in probes for b, r in p.not_applicable.items()}
        if skipped and v not in ("error",):
            reason += "; not applicable on " + "; ".join(f"{b} ({r})" for b, r in skipped.items())
        fix = self.fix
        return BackportVerdict(
            fix.pr,
            fix.id,
            fix.part,
            fix.title,
            v,
            reason,
            probes,
            paths=paths,
            forced=self.forced,
            backends=_backend_verdicts(paths, skipped),
        )


def judge_backport(fix: Fix, observations: dict[str, Observation]) -> BackportVerdict:
    """present / absent / partial / error for one fix from its probes' observations on one source."""
    verdict = _Verdicts(fix, forced_notes(observations))
    if not fix.probes and fix.base.unavailable:
        return verdict(NOT_JUDGED, f"no probe judges it; base unavailable ({fix.base.unavailable})", [], [])
    if not fix.probes:
        return verdict("error", "no probes declared for this fix in the matrix", [], [])
    probes = [compare_probe(spec, observations.get(spec.name)) for spec in fix.probes]
    if all(p.like == "n/a" for p in probes):
        return verdict("not-applicable", "; ".join(f"{p.probe}: {p.reason}" for p in probes), probes, [])
    untrusted = [p for p in probes if p.like in ("error", "control-drift", "other")]
    if untrusted:
        return verdict("error", "; ".join(f"{p.probe}: {p.reason}" for p in untrusted), probes, [])
    if fix.hunks:
        return _judge_paths(fix, probes, verdict)
    return _judge_probes(probes, verdict)


def _judge_probes(probes: list[ProbeComparison], verdict: _Verdicts) -> BackportVerdict:
    """A fix that declares no paths: judged probe by probe."""
    head = [p.probe for p in probes if p.like == "head"]
    base = [p.probe for p in probes if p.like == "base"]
    mixed = [p.probe for p in probes if p.like == "mixed"]
    if len(head) == len(probes):
        return verdict("present", f"all {len(probes)} probe(s) behave like the fix's head; controls hold", probes, [])
    if len(base) == len(probes):
        return verdict("absent", f"all {len(probes)} probe(s) behave like the fix's base (the bug)", probes, [])
    parts = []
    if head:
        parts.append("like head: " + ", ".join(head))
    if base:
        parts.append("like base: " + ", ".join(base))
    if mixed:
        parts.append("mixed within the probe: " + ", ".join(mixed))
    return verdict("partial", "; ".join(parts), probes, [])


def _judge_paths(fix: Fix, probes: list[ProbeComparison], verdict: _Verdicts) -> BackportVerdict:
    every = _path_checks(fix, probes)
    paths = [p for p in every if p.like != "n/a"]
    if not paths:
        return verdict("not-applicable", "no path of the fix applies on this source", probes, every)
    unknown = [p for p in paths if p.like in ("other", "missing")]
    if unknown:
        return verdict(
            "error", "path(s) with no usable observation: " + ", ".join(p.hunk for p in unknown), probes, every
        )
    likes = [p.like for p in paths]
    if likes.count("head") == len(paths):
        return verdict(
            "present",
            f"every path the fix changes behaves like its head ({_listing(paths)}); controls hold",
            probes,
            every,
        )
    if likes.count("base") + likes.count("masked") == len(paths):
        return verdict(
            "absent",
            f"every path the fix changes behaves like its base, the bug ({_listing(paths)})",
            probes,
            every,
        )
    parts = [
        label + ", ".join(show(p) for p in group)
        for like, label, show in _PARTIAL_PARTS
        if (group := [p for p in paths if p.like == like])
    ]
    return verdict("partial", _by_backend(every) + "; ".join(parts), probes, every)


_PARTIAL_PARTS: tuple[tuple[str, str, Callable[[PathCheck], str]], ...] = (
    ("head", "like head: ", PathCheck.describe),
    ("base", "like base: ", PathCheck.describe),
    ("mixed", "mixed within the path: ", PathCheck.describe),
    ("masked", "not observable apart from a base-like path: ", lambda p: p.hunk),
)
"""How a partial verdict lists its paths, group by group, in this order."""


def _listing(paths: list[PathCheck]) -> str:
    """``4: a, b, c, d``; per-back-end paths once each: ``8: a, b, c, d on mooncake, nixl``."""
    backends = list(dict.fromkeys(p.backend for p in paths if p.backend))
    if not backends:
        return f"{len(paths)}: " + ", ".join(p.hunk for p in paths)
    names = list(dict.fromkeys(p.hunk.split("@", 1)[0] for p in paths))
    return f"{len(paths)}: " + ", ".join(names) + " on " + ", ".join(backends)


def _by_backend(paths: list[PathCheck]) -> str:
    """``like head on mooncake; like base on nixl: ``, where the paths differ by back end."""
    verdicts = _backend_verdicts([p for p in paths if p.like != "n/a"], {})
    if len(set(verdicts.values())) < 2:
        return ""
    words = {"present": "like head", "absent": "like base", "partial": "split"}
    return "; ".join(f"{words[v]} on {b}" for b, v in verdicts.items() if v in words) + ": "
