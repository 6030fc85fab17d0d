"""Which environments a set of releases needs: the fewest that cover them all, keyed by their pins.

The shared CPU environment serves every release whose code runs on its pins. A release that
needs something else says so in ``release-needs.toml``: the releases an entry applies to, what
their code requires (specifiers) and the exact pins that give it. An environment is the shared
pin set with some entries' pins applied; it serves a release when every package the release
constrains satisfies the constraint and every other package is exactly the shared pin. Among
the candidate environments (the shared one, and each non-conflicting combination of the
entries that apply to some release) the plan takes the fewest that serve every release,
preferring the shared environment and then fewer changed pins; a release no candidate serves
is refused with its constraints named.
"""

from __future__ import annotations

import itertools
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

from difflab.errors import ConfigError

NEEDS_FILE = "release-needs.toml"
MAX_CANDIDATES = 24
"""The exact search tries combinations of candidates; past this many the needs file is too tangled to trust."""


@dataclass(frozen=True)
class Need:
    """Releases whose code needs other pins than the shared environment's."""

    releases: SpecifierSet
    requires: tuple[Requirement, ...]
    pins: tuple[Requirement, ...]
    why: str = ""

    def applies(self, version: str) -> bool:
        return self.releases.contains(Version(version), prereleases=True)


@dataclass(frozen=True)
class EnvironmentPlan:
    """One environment of the plan: the pins it changes (none: the shared one) and the releases it serves."""

    pins: tuple[str, ...]
    releases: tuple[str, ...]

    @property
    def shared(self) -> bool:
        return not self.pins


def pin_versions(requirement_lines: Iterable[str]) -> dict[str, Version]:
    """``name==version`` lines (comments and blanks skipped) -> {canonical name: version}."""
    found = {}
    for line in requirement_lines:
        text = line.split("#", 1)[0].strip()
        if not text or text.startswith("-"):
            continue
        req = Requirement(text)
        found[canonicalize_name(req.name)] = _exact(req, "requirements")
    return found


def _exact(req: Requirement, where: str) -> Version:
    specs = list(req.specifier)
    if len(specs) != 1 or specs[0].operator != "==" or "*" in specs[0].version:
        raise ConfigError(f"{where}: {req} is not an exact pin (name==version)")
    return Version(specs[0].version)


def load_needs(path: Path | None = None) -> list[Need]:
    """The needs file (default: the one shipped with the lab), validated."""
    if path is None:
        text = resources.files("difflab.environment").joinpath(NEEDS_FILE).read_text()
        where = f"difflab/environment/{NEEDS_FILE}"
    else:
        text, where = path.read_text(), str(path)
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{where}: not valid TOML ({exc})") from None
    if raw.get("schema") != 1:
        raise ConfigError(f"{where}: schema must be 1")
    entries = raw.get("needs", [])
    if not isinstance(entries, list):
        raise ConfigError(f"{where}: needs must be an array of tables")
    return [_need(f"{where}: needs[{i}]", entry) for i, entry in enumerate(entries)]


def _need(where: str, entry: object) -> Need:
    if not isinstance(entry, dict):
        raise ConfigError(f"{where}: must be a table")
    unknown = set(entry) - {"releases", "requires", "pins", "why"}
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {sorted(unknown)}")
    try:
        releases = SpecifierSet(str(entry.get("releases", "")))
        requires = tuple(Requirement(str(r)) for r in entry.get("requires", []))
        pins = tuple(Requirement(str(p)) for p in entry.get("pins", []))
    except (InvalidSpecifier, InvalidRequirement) as exc:
        raise ConfigError(f"{where}: {exc}") from None
    if not str(releases) or not requires or not pins:
        raise ConfigError(f"{where}: give releases, requires and pins")
    pinned = {canonicalize_name(p.name): _exact(p, f"{where}.pins") for p in pins}
    for req in requires:
        version = pinned.get(canonicalize_name(req.name))
        if version is None or not req.specifier.contains(version, prereleases=True):
            raise ConfigError(f"{where}: requires {req}, which its pins do not give")
    return Need(releases=releases, requires=requires, pins=pins, why=str(entry.get("why", "")))


def plan_environments(
    releases: Iterable[str], needs: list[Need], shared: Mapping[str, Version]
) -> list[EnvironmentPlan]:
    """The fewest environments that serve every release (the shared one first when it is used)."""
    versions = list(dict.fromkeys(releases))
    applying = {v: [n for n in needs if n.applies(v)] for v in versions}
    candidates = _candidates(applying.values())
    order = sorted(candidates, key=lambda pins: (len(pins), pins))
    serves = {pins: {v for v in versions if _serves(candidates[pins], applying[v], shared)} for pins in order}
    _check_served(versions, serves, applying)
    for size in range(1, len(order) + 1):
        for combo in itertools.combinations(order, size):
            if set().union(*(serves[p] for p in combo)) >= set(versions):
                return _assign(combo, serves, versions)
    raise AssertionError("unreachable: every release is served by some candidate")


def _check_served(
    versions: list[str], serves: Mapping[tuple[str, ...], set[str]], applying: Mapping[str, list[Need]]
) -> None:
    """A release no candidate environment serves: named, with what its needs require."""
    stranded = [v for v in versions if not any(v in s for s in serves.values())]
    if stranded:
        wants = {v: ", ".join(str(r) for n in applying[v] for r in n.requires) for v in stranded}
        detail = "; ".join(f"{v} requires {w}" for v, w in wants.items())
        raise ConfigError(f"{NEEDS_FILE}: no environment serves {detail}")


def _candidates(applying: Iterable[list[Need]]) -> dict[tuple[str, ...], dict[str, Version]]:
    """Every environment some consistent set of one release's needs asks for (pin lines -> pins), and none."""
    candidates: dict[tuple[str, ...], dict[str, Version]] = {(): {}}
    for matched in applying:
        for size in range(1, len(matched) + 1):
            for combo in itertools.combinations(matched, size):
                merged = _merge(combo)
                if merged is not None:
                    candidates.setdefault(_pin_lines(merged), merged)
    if len(candidates) > MAX_CANDIDATES:
        raise ConfigError(f"{NEEDS_FILE}: {len(candidates)} candidate environments; simplify the needs")
    return candidates


def _merge(combo: Iterable[Need]) -> dict[str, Version] | None:
    merged: dict[str, Version] = {}
    for need in combo:
        for pin in need.pins:
            name, version = canonicalize_name(pin.name), _exact(pin, "pins")
            if merged.setdefault(name, version) != version:
                return None
    return merged


def _pin_lines(pins: Mapping[str, Version]) -> tuple[str, ...]:
    return tuple(f"{name}=={version}" for name, version in sorted(pins.items()))


def _serves(pins: Mapping[str, Version], matched: list[Need], shared: Mapping[str, Version]) -> bool:
    constraints: dict[str, SpecifierSet] = {}
    for need in matched:
        for req in need.requires:
            name = canonicalize_name(req.name)
            constraints[name] = constraints.get(name, SpecifierSet()) & req.specifier
    env = {**shared, **pins}
    for name, spec in constraints.items():
        if name not in env or not spec.contains(env[name], prereleases=True):
            return False
    return all(name in constraints or shared.get(name) == version for name, version in env.items())


def _assign(
    combo: tuple[tuple[str, ...], ...], serves: Mapping[tuple[str, ...], set[str]], versions: list[str]
) -> list[EnvironmentPlan]:
    taken: dict[tuple[str, ...], list[str]] = {pins: [] for pins in combo}
    for v in versions:
        taken[next(p for p in combo if v in serves[p])].append(v)
    return [EnvironmentPlan(pins=pins, releases=tuple(taken[pins])) for pins in combo if taken[pins]]


def apply_pins(requirements: str, pins: Iterable[str]) -> str:
    """The requirements text with each pin replacing the line of the same package (or added at the end)."""
    wanted = {canonicalize_name(Requirement(p).name): p for p in pins}
    lines = []
    for line in requirements.splitlines():
        text = line.split("#", 1)[0].strip()
        name = canonicalize_name(Requirement(text).name) if text and not text.startswith("-") else None
        lines.append(wanted.pop(name) if name in wanted else line)
    return "\n".join([*lines, *wanted.values()]) + "\n"
