"""Validated matrix entries. Everything here is immutable and already checked."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from difflab.errors import ConfigError


@dataclass(frozen=True)
class ReleasePin:
    """One release wheel: the exact file the lab downloads and its sha256."""

    version: str
    file: str
    sha256: str


@dataclass(frozen=True)
class CommitPin:
    """A git commit quoted in public material; ``confirmed`` once resolved from a remote."""

    sha: str
    confirmed: bool


@dataclass(frozen=True)
class SidePin:
    """Where one side (base or head) of a fix comes from.

    Exactly one of ``release`` / ``commit`` is set, or ``unavailable`` says
    why no source exists for this side.
    """

    release: str | None = None
    commit: str | None = None
    unavailable: str | None = None

    @property
    def label(self) -> str:
        if self.release:
            return self.release
        if self.commit:
            return self.commit[:12]
        return "unavailable"


@dataclass(frozen=True)
class ProbeSpec:
    """A probe and what the fix must (``expect``) and must not (``controls``) change."""

    name: str
    expect: dict[str, tuple[Any, Any]]
    controls: dict[str, Any]
    channels: dict[str, str] = field(default_factory=dict)
    """Expect field -> the control that shares its measurement channel, where the names differ."""
    backends: tuple[str, ...] = ()
    """Transport back ends the scenarios run on; empty = back-end independent. Field names are then
    ``<backend>:<field>`` for each (the matrix declares each field once)."""


@dataclass(frozen=True)
class Hunk:
    """One behavioural change the fix makes: a code path, and the probe fields that observe it.

    ``fields`` maps a probe name to the expect fields (exact names) that see this
    path. A fork that ports the fix to some paths and not others is told which.
    """

    id: str
    file: str
    function: str
    change: str
    fields: dict[str, tuple[str, ...]]
    backend: str | None = None
    """The transport back end this path runs on (its id then ends ``@<backend>``); None = back-end independent."""

    def observed(self) -> list[tuple[str, str]]:
        return [(probe, f) for probe, names in self.fields.items() for f in names]


@dataclass(frozen=True)
class Mutation:
    """A reverting edit against the head source that undoes the fix's lines for ``hunks``."""

    name: str
    file: str
    find: str
    replace: str
    targets: tuple[str, ...]
    hunks: tuple[str, ...] = ()
    """Path ids this mutation reverts (a declared hunk id stands for its per-back-end paths)."""


@dataclass(frozen=True)
class UpstreamTestFile:
    """One of SGLang's test files for the fix (a path under its repository), and which of its tests are the fix's own.

    ``own`` holds ids within the file (``Class::test_method`` or a pytest function's name):
    the tests that assert the fix's behaviour, as opposed to controls and unrelated tests.
    """

    file: str
    own: tuple[str, ...] = ()


@dataclass(frozen=True)
class Fix:
    """One fix (or one part of a fix) and how to judge it."""

    id: str
    pr: int
    title: str
    base: SidePin
    head: SidePin
    probes: tuple[ProbeSpec, ...]
    part: str | None = None
    note: str | None = None
    commits: dict[str, CommitPin] = field(default_factory=dict)
    upstream_tests: tuple[UpstreamTestFile, ...] = ()
    mutations: tuple[Mutation, ...] = ()
    hunks: tuple[Hunk, ...] = ()
    throughput: str | None = None
    """The throughput probe (``probes/throughput/<name>.py``) timing the fix's hot path, if any."""
    family: str | None = None
    """The family of bugs this fix belongs to (a ``[families.<name>]`` table), judged together per build."""

    @property
    def label(self) -> str:
        return f"#{self.pr}{f'({self.part})' if self.part else ''}"

    def hunk(self, hunk_id: str) -> Hunk:
        return next(h for h in self.hunks if h.id == hunk_id)


@dataclass(frozen=True)
class Family:
    """Fixes an operator asks about together: "is my build safe from this family of bugs?", not "does it carry #N?"."""

    name: str
    title: str
    members: tuple[str, ...]
    """Fix ids, in matrix order."""


@dataclass(frozen=True)
class Matrix:
    """A whole matrix file."""

    path: Path
    sha256: str
    releases: dict[str, ReleasePin]
    fixes: tuple[Fix, ...]
    families: dict[str, Family] = field(default_factory=dict)

    def select(self, wanted: list[str] | None) -> list[Fix]:
        """Fixes named by id (``43719a``) or PR number (``43719`` = every part).

        An exact id wins over the PR number: ``41404`` is that fix, not also ``41404-mori``
        (a counterpart on another back end that shares the PR); ``41404-mori`` names the other.
        """
        if not wanted:
            return list(self.fixes)
        chosen: list[Fix] = []
        for token in wanted:
            token = token.lstrip("#")
            hits = [f for f in self.fixes if f.id == token] or [f for f in self.fixes if str(f.pr) == token]
            if not hits:
                known = ", ".join(f.id for f in self.fixes)
                raise ConfigError(f"{self.path}: unknown fix {token!r} (known: {known})")
            chosen += [f for f in hits if f not in chosen]
        return chosen

    def fix(self, fix_id: str) -> Fix:
        return self.select([fix_id])[0]
