"""Parse a matrix TOML file into :mod:`difflab.matrix.model` dataclasses.

Every error names the file, the fix and the field, because the person
reading it is usually editing that very line.
"""

from __future__ import annotations

import hashlib
import re
import tomllib
from pathlib import Path
from typing import Any

from difflab.errors import ConfigError
from difflab.matrix.families import load_families
from difflab.matrix.model import (
    CommitPin,
    Fix,
    Hunk,
    Matrix,
    Mutation,
    ProbeSpec,
    ReleasePin,
    SidePin,
    UpstreamTestFile,
)
from difflab.probe.kit import BACKEND_NOT_APPLICABLE, backend_field

SCHEMA = 2
SCHEMAS = (1, 2)  # 1: before hunks and measurement channels; still read, so old bundles reproduce
_SHA256 = re.compile(r"[0-9a-f]{64}")
_GIT_SHA = re.compile(r"[0-9a-f]{7,40}")
_PROBE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_FIX_KEYS = {
    "id",
    "pr",
    "part",
    "title",
    "note",
    "base",
    "head",
    "commits",
    "upstream_tests",
    "probes",
    "mutations",
    "hunks",
    "throughput",
    "family",
}
_HUNK_ID = re.compile(r"[a-z0-9][a-z0-9-]*")
_BACKEND = re.compile(r"[a-z][a-z0-9]*")


class _Where:
    """Builds error messages that point at the offending spot."""

    def __init__(self, path: Path, schema: int = SCHEMA) -> None:
        self.path = path
        self.schema = schema

    def fail(self, where: str, message: str) -> ConfigError:
        return ConfigError(f"{self.path}: {where}: {message}")


def _table(w: _Where, where: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise w.fail(where, f"expected a table, got {type(value).__name__}")
    return value


def _str(w: _Where, where: str, value: Any, *, required: bool = True) -> str | None:
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value.strip():
        raise w.fail(where, "expected a non-empty string")
    return value


def _release(w: _Where, version: str, raw: Any) -> ReleasePin:
    where = f"releases.{version!r}"
    table = _table(w, where, raw)
    unknown = set(table) - {"file", "sha256"}
    if unknown:
        raise w.fail(where, f"unknown field(s) {sorted(unknown)}")
    file = _str(w, f"{where}.file", table.get("file"))
    sha = _str(w, f"{where}.sha256", table.get("sha256"))
    assert file is not None and sha is not None
    if not _SHA256.fullmatch(sha):
        raise w.fail(f"{where}.sha256", "expected 64 lowercase hex digits")
    if not file.endswith(".whl") or not file.startswith(f"sglang-{version}-"):
        raise w.fail(f"{where}.file", f"expected the sglang wheel of version {version} (sglang-{version}-...whl)")
    return ReleasePin(version=version, file=file, sha256=sha)


def _side(w: _Where, where: str, raw: Any, releases: dict[str, ReleasePin]) -> SidePin:
    table = _table(w, where, raw)
    unknown = set(table) - {"release", "commit", "unavailable"}
    if unknown:
        raise w.fail(where, f"unknown field(s) {sorted(unknown)}")
    given = [k for k in ("release", "commit", "unavailable") if k in table]
    if len(given) != 1:
        raise w.fail(where, "give exactly one of release, commit or unavailable")
    key = given[0]
    value = _str(w, f"{where}.{key}", table[key])
    if key == "release" and value not in releases:
        raise w.fail(f"{where}.release", f"release {value!r} is not pinned under [releases]")
    if key == "commit" and not _GIT_SHA.fullmatch(str(value)):
        raise w.fail(f"{where}.commit", "expected a hex git SHA (7-40 digits)")
    return SidePin(**{key: value})


def _probe(w: _Where, where: str, raw: Any, *, channels_required: bool = True) -> ProbeSpec:
    """One probe's expectations. CPU probes need a control per measurement channel; live GPU
    scenarios (``[gpu.*]``) measure a deployment, where each scenario states its own control."""
    table = _table(w, where, raw)
    unknown = set(table) - {"name", "expect", "controls", "channels", "backends"}
    if unknown:
        raise w.fail(where, f"unknown field(s) {sorted(unknown)}")
    name = _probe_module(w, f"{where}.name", table.get("name"))
    backends = _backends(w, f"{where}.backends", table.get("backends", []))
    expect_raw = _table(w, f"{where}.expect", table.get("expect", {}))
    if not expect_raw:
        raise w.fail(f"{where}.expect", "a probe must declare at least one field the fix changes")
    expect: dict[str, tuple[Any, Any]] = {}
    for field, pair in expect_raw.items():
        if not isinstance(pair, list) or len(pair) != 2:
            raise w.fail(f"{where}.expect.{field!r}", "expected [base_value, head_value]")
        if pair[0] == pair[1]:
            raise w.fail(f"{where}.expect.{field!r}", "base and head values are equal: that is a control")
        expect[field] = (pair[0], pair[1])
    controls = dict(_table(w, f"{where}.controls", table.get("controls", {})))
    overlap = set(expect) & set(controls)
    if overlap:
        raise w.fail(where, f"field(s) {sorted(overlap)} are both expected to change and controls")
    channels = (
        _channels(w, f"{where}.channels", table.get("channels", {}), expect, controls)
        if channels_required and w.schema >= 2
        else {}
    )
    if backends:
        # Each declared field is observed once per back end, as ``<backend>:<field>``.
        reserved = [f for f in [*expect, *controls] if f == BACKEND_NOT_APPLICABLE]
        if reserved:
            raise w.fail(where, f"{BACKEND_NOT_APPLICABLE!r} is the field a back end without the fix reports")
        expect = {backend_field(b, f): pair for b in backends for f, pair in expect.items()}
        controls = {backend_field(b, f): v for b in backends for f, v in controls.items()}
        channels = {backend_field(b, f): backend_field(b, c) for b in backends for f, c in channels.items()}
    return ProbeSpec(name=name, expect=expect, controls=controls, channels=channels, backends=backends)


def _backends(w: _Where, where: str, value: Any) -> tuple[str, ...]:
    """``backends = ["mooncake", "nixl", "mori"]``: the transport back ends a probe's scenarios run on."""
    if not isinstance(value, list) or not all(isinstance(b, str) and _BACKEND.fullmatch(b) for b in value):
        raise w.fail(where, 'expected a list of back-end names (lowercase, like "mooncake")')
    if len(set(value)) != len(value):
        raise w.fail(where, "a back end is listed twice")
    return tuple(value)


def channel(field: str) -> str:
    """What a field measures: its name without the scenario (``failed.acks`` -> ``acks``)."""
    return field.split(".", 1)[1] if "." in field else field


def _channels(
    w: _Where, where: str, raw: Any, expect: dict[str, tuple[Any, Any]], controls: dict[str, Any]
) -> dict[str, str]:
    """Every expect field needs a control measured the same way, so a broken measurement cannot pass.

    A field that never changes (an ack count stuck at 0 because the fake socket
    is wired wrong) would read as "fixed" for an ack the fix withholds; a control
    on the same channel that must read non-zero on both sides catches it. The
    control is found by channel name, or named in ``channels``.
    """
    table = _table(w, where, raw)
    explicit: dict[str, str] = {}
    for field, control in table.items():
        if field not in expect:
            raise w.fail(f"{where}.{field!r}", "not an expect field of this probe")
        if not isinstance(control, str) or control not in controls:
            raise w.fail(f"{where}.{field!r}", f"{control!r} is not a control of this probe")
        explicit[field] = control
    by_channel: dict[str, list[str]] = {}
    for control in controls:
        by_channel.setdefault(channel(control), []).append(control)
    for field in expect:
        if field not in explicit and not by_channel.get(channel(field)):
            raise w.fail(
                f"{where.rsplit('.', 1)[0]}.expect.{field!r}",
                f"no control measures {channel(field)!r}: add a control scenario's "
                f"'<scenario>.{channel(field)}' (or map the field in channels)",
            )
    return explicit


def _hunk(w: _Where, where: str, raw: Any, probes: dict[str, ProbeSpec]) -> list[Hunk]:
    """One declared path; a path its probes observe per back end becomes one path per back end (``id@backend``)."""
    table = _table(w, where, raw)
    unknown = set(table) - {"id", "file", "function", "change", "fields", "backends"}
    if unknown:
        raise w.fail(where, f"unknown field(s) {sorted(unknown)}")
    hunk_id = _str(w, f"{where}.id", table.get("id"))
    assert hunk_id is not None
    if not _HUNK_ID.fullmatch(hunk_id):
        raise w.fail(f"{where}.id", f"{hunk_id!r}: use lowercase letters, digits and '-'")
    file = _str(w, f"{where}.file", table.get("file"))
    function = _str(w, f"{where}.function", table.get("function"))
    change = _str(w, f"{where}.change", table.get("change"))
    assert file and function and change
    fields = _hunk_fields(w, f"{where}.fields", table.get("fields", {}), probes)
    backends = _hunk_backends(w, where, table, {probes[p].backends for p in fields})
    if not backends:
        return [Hunk(id=hunk_id, file=file, function=function, change=change, fields=fields)]
    return [
        Hunk(
            id=f"{hunk_id}@{b}",
            file=file,
            function=function,
            change=change,
            fields={p: tuple(backend_field(b, n) for n in names) for p, names in fields.items()},
            backend=b,
        )
        for b in backends
    ]


def _hunk_fields(w: _Where, where: str, raw: Any, probes: dict[str, ProbeSpec]) -> dict[str, tuple[str, ...]]:
    """``fields = {probe = [expect fields]}``: which probe fields observe the path."""
    fields_raw = _table(w, where, raw)
    if not fields_raw:
        raise w.fail(where, "name the probe fields that observe this path ({probe = [fields]})")
    fields: dict[str, tuple[str, ...]] = {}
    for probe, names in fields_raw.items():
        if probe not in probes:
            raise w.fail(f"{where}.{probe}", "not one of this fix's probes")
        if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
            raise w.fail(f"{where}.{probe}", "expected a non-empty list of expect field names")
        first = probes[probe].backends[:1]
        for name in names:
            if (backend_field(first[0], name) if first else name) not in probes[probe].expect:
                raise w.fail(f"{where}.{probe}", f"{name!r} is not an expect field of {probe}")
        fields[probe] = tuple(names)
    return fields


def _hunk_backends(w: _Where, where: str, table: dict[str, Any], per_backend: set[tuple[str, ...]]) -> tuple[str, ...]:
    """The back ends a path is judged on: its probes' (all the same), or the ``backends`` chosen among them."""
    if len(per_backend) != 1:
        raise w.fail(f"{where}.fields", "the probes observing one path must run on the same back ends")
    backends = next(iter(per_backend))
    if "backends" not in table:
        return backends
    chosen = _backends(w, f"{where}.backends", table["backends"])
    stray = [b for b in chosen if b not in backends]
    if not backends or stray:
        raise w.fail(f"{where}.backends", f"{stray or chosen} not among its probes' back ends {list(backends)}")
    return chosen


def _inside_sglang(file: str) -> bool:
    """A mutation rewrites this file in a copy of the source's ``sglang/`` tree: it must name one inside it."""
    top, *rest = file.split("/")
    return top == "sglang" and bool(rest) and all(part not in ("", ".", "..") for part in rest)


def _mutation(w: _Where, where: str, raw: Any, probe_names: set[str], hunks: dict[str, Hunk]) -> Mutation:
    table = _table(w, where, raw)
    unknown = set(table) - {"name", "file", "find", "replace", "targets", "hunks"}
    if unknown:
        raise w.fail(where, f"unknown field(s) {sorted(unknown)}")
    name = _str(w, f"{where}.name", table.get("name"))
    file = _str(w, f"{where}.file", table.get("file"))
    find = _str(w, f"{where}.find", table.get("find"))
    replace = table.get("replace")
    if not isinstance(replace, str):
        raise w.fail(f"{where}.replace", "expected a string (may be empty)")
    assert name and file and find
    if not _inside_sglang(file):
        raise w.fail(f"{where}.file", f"{file!r}: must be a relative path inside the source's sglang/ tree")
    reverted = _reverted(w, f"{where}.hunks", table.get("hunks", []), hunks)
    hunk_probes = list(dict.fromkeys(p for h in reverted for p in hunks[h].fields))
    targets = _targets(w, f"{where}.targets", table.get("targets", hunk_probes or None), probe_names, hunk_probes)
    return Mutation(name=name, file=file, find=find, replace=replace, targets=targets, hunks=reverted)


def _reverted(w: _Where, where: str, raw: Any, hunks: dict[str, Hunk]) -> tuple[str, ...]:
    """The hunks a mutation reverts; a declared id names every back end's copy of the path, ``id@backend`` one."""
    if not isinstance(raw, list) or not all(isinstance(h, str) for h in raw):
        raise w.fail(where, "expected a list of hunk ids")
    expanded: list[str] = []
    for h in raw:
        ids = [h] if h in hunks else [k for k in hunks if k.split("@", 1)[0] == h and "@" in k]
        if not ids:
            raise w.fail(where, f"{h!r} is not one of this fix's hunks")
        expanded += [i for i in ids if i not in expanded]
    if hunks and not expanded:
        raise w.fail(where, "name the hunk(s) this mutation reverts")
    return tuple(expanded)


def _targets(w: _Where, where: str, raw: Any, probe_names: set[str], hunk_probes: list[str]) -> tuple[str, ...]:
    """The probes a mutation must flip: named, or those observing its hunks (which must all be among them)."""
    if not isinstance(raw, list) or not raw or not all(isinstance(t, str) for t in raw):
        raise w.fail(where, "expected a non-empty list of probe names")
    for t in raw:
        if t not in probe_names:
            raise w.fail(where, f"{t!r} is not one of this fix's probes")
    missing = [p for p in hunk_probes if p not in raw]
    if missing:
        raise w.fail(where, f"the reverted hunks are observed by {missing} too")
    return tuple(raw)


def _probe_module(w: _Where, where: str, value: Any) -> str:
    """A probe's module name (a file under ``probes/``, or ``probes/throughput/``)."""
    name = _str(w, where, value)
    assert name is not None
    if not _PROBE_NAME.fullmatch(name):
        raise w.fail(where, f"{name!r} is not a probe module name")
    return name


def _throughput(w: _Where, where: str, raw: Any) -> str | None:
    """``[fixes.throughput] probe = "<name>"``: the probe in ``probes/throughput/`` timing the fix's hot path."""
    if raw is None:
        return None
    table = _table(w, where, raw)
    unknown = set(table) - {"probe"}
    if unknown:
        raise w.fail(where, f"unknown field(s) {sorted(unknown)}")
    return _probe_module(w, f"{where}.probe", table.get("probe"))


def _fix(w: _Where, index: int, raw: Any, releases: dict[str, ReleasePin]) -> Fix:
    table = _table(w, f"fixes[{index}]", raw)
    fix_id = table.get("id")
    where = f"fix {fix_id!r}" if isinstance(fix_id, str) else f"fixes[{index}]"
    _str(w, f"{where}.id", fix_id)
    unknown = set(table) - _FIX_KEYS
    if unknown:
        raise w.fail(where, f"unknown field(s) {sorted(unknown)}")
    pr = table.get("pr")
    if not isinstance(pr, int) or isinstance(pr, bool) or pr <= 0:
        raise w.fail(f"{where}.pr", "expected a positive pull-request number")
    title = _str(w, f"{where}.title", table.get("title"))
    part = _str(w, f"{where}.part", table.get("part"), required=False)
    note = _str(w, f"{where}.note", table.get("note"), required=False)
    base, head = _sides(w, where, table, releases)
    commits = _commits(w, f"{where}.commits", table.get("commits", {}))
    tests = _upstream_tests(w, f"{where}.upstream_tests", table.get("upstream_tests", []))
    probes = _probes(w, where, table.get("probes", []))
    hunks = _hunks(w, where, table.get("hunks", []), probes)
    mutations = _mutations(w, where, table.get("mutations", []), probes, hunks)
    assert title is not None
    return Fix(
        id=str(fix_id),
        pr=pr,
        title=title,
        part=part,
        note=note,
        base=base,
        head=head,
        commits=commits,
        upstream_tests=tests,
        probes=probes,
        mutations=mutations,
        hunks=hunks,
        throughput=_throughput(w, f"{where}.throughput", table.get("throughput")),
        family=_str(w, f"{where}.family", table.get("family"), required=False),
    )


def _sides(w: _Where, where: str, table: dict[str, Any], releases: dict[str, ReleasePin]) -> tuple[SidePin, SidePin]:
    """The fix's base (where the bug is shown) and head.

    One side may be ``unavailable`` with its reason: a fix in no release yet (head), or one older
    than every pinned release (base: the bug cannot be shown, the fix can still be seen on the head).
    """
    for side in ("base", "head"):
        if side not in table:
            raise w.fail(f"{where}.{side}", "missing")
    base = _side(w, f"{where}.base", table["base"], releases)
    head = _side(w, f"{where}.head", table["head"], releases)
    if base.unavailable and head.unavailable:
        raise w.fail(f"{where}.base", "base and head are both unavailable: at least one side needs a release or commit")
    commits = table.get("commits")
    if base.unavailable and isinstance(commits, dict) and "base" in commits:
        raise w.fail(f"{where}.commits.base", "the base is declared unavailable: give its commit as base, or neither")
    return base, head


def _commits(w: _Where, where: str, raw: Any) -> dict[str, CommitPin]:
    """``[fixes.commits.base|head] sha, confirmed``: the git commits of the fix's sides."""
    commits: dict[str, CommitPin] = {}
    for side, pin in _table(w, where, raw).items():
        if side not in ("base", "head"):
            raise w.fail(where, f"unknown side {side!r}")
        pin_t = _table(w, f"{where}.{side}", pin)
        sha = _str(w, f"{where}.{side}.sha", pin_t.get("sha"))
        if not _GIT_SHA.fullmatch(str(sha)):
            raise w.fail(f"{where}.{side}.sha", "expected a hex git SHA (7-40 digits)")
        confirmed = pin_t.get("confirmed")
        if not isinstance(confirmed, bool):
            raise w.fail(f"{where}.{side}.confirmed", "expected true or false")
        commits[side] = CommitPin(sha=str(sha), confirmed=confirmed)
    return commits


def _array(w: _Where, where: str, raw: Any, name: str) -> list[Any]:
    """``[[fixes.<name>]]``: an array of tables."""
    if not isinstance(raw, list):
        raise w.fail(f"{where}.{name}", f"expected an array of tables ([[fixes.{name}]])")
    return raw


def _probes(w: _Where, where: str, raw: Any) -> tuple[ProbeSpec, ...]:
    at = f"{where}.probes"
    probes = tuple(_probe(w, f"{at}[{i}]", p) for i, p in enumerate(_array(w, where, raw, "probes")))
    names = [p.name for p in probes]
    if len(set(names)) != len(names):
        raise w.fail(at, "a probe is listed twice")
    return probes


def _hunks(w: _Where, where: str, raw: Any, probes: tuple[ProbeSpec, ...]) -> tuple[Hunk, ...]:
    """The paths the fix changes; with any declared, every expect field must belong to one."""
    at, by_name = f"{where}.hunks", {p.name: p for p in probes}
    hunk_list = [
        path for i, h in enumerate(_array(w, where, raw, "hunks")) for path in _hunk(w, f"{at}[{i}]", h, by_name)
    ]
    if len({h.id for h in hunk_list}) != len(hunk_list):
        raise w.fail(at, "a hunk id is listed twice")
    if hunk_list:
        covered = {pf for h in hunk_list for pf in h.observed()}
        loose = [f"{p.name}:{f}" for p in probes for f in p.expect if (p.name, f) not in covered]
        if loose:
            raise w.fail(at, f"expect field(s) {loose} belong to no hunk")
    return tuple(hunk_list)


def _mutations(
    w: _Where, where: str, raw: Any, probes: tuple[ProbeSpec, ...], hunk_list: tuple[Hunk, ...]
) -> tuple[Mutation, ...]:
    """The reverting mutations; every hunk must be reverted by at least one."""
    at = f"{where}.mutations"
    names, hunks = {p.name for p in probes}, {h.id: h for h in hunk_list}
    mutations = tuple(
        _mutation(w, f"{at}[{i}]", m, names, hunks) for i, m in enumerate(_array(w, where, raw, "mutations"))
    )
    names_m = [m.name for m in mutations]
    if len(set(names_m)) != len(names_m):
        raise w.fail(at, "a mutation name is listed twice")
    unreverted = [h for h in hunks if not any(h in m.hunks for m in mutations)]
    if unreverted:
        raise w.fail(f"{where}.hunks", f"hunk(s) {unreverted} have no reverting mutation")
    return mutations


def _upstream_tests(w: _Where, where: str, value: Any) -> tuple[UpstreamTestFile, ...]:
    """``["test/...py", {file = "test/...py", own = ["Class::test_x"]}]``: paths under SGLang's repository."""
    if not isinstance(value, list):
        raise w.fail(where, "expected a list of test files (paths, or tables with file and own)")
    out: list[UpstreamTestFile] = []
    for i, entry in enumerate(value):
        at = f"{where}[{i}]"
        if not isinstance(entry, str | dict):
            raise w.fail(at, f"expected a path or a table with file and own, got {type(entry).__name__}")
        table = {"file": entry} if isinstance(entry, str) else entry
        unknown = set(table) - {"file", "own"}
        if unknown:
            raise w.fail(at, f"unknown key(s) {sorted(unknown)} (known: file, own)")
        path = _str(w, f"{at}.file", table.get("file"))
        assert path is not None
        parts = path.split("/")
        if path.startswith("/") or "\\" in path or ".." in parts or not path.endswith(".py"):
            raise w.fail(f"{at}.file", f"{path!r} is not a relative path to a .py file inside SGLang's repository")
        own = table.get("own", [])
        if not isinstance(own, list) or not all(isinstance(o, str) and o.strip() for o in own):
            raise w.fail(f"{at}.own", "expected a list of test ids (Class::test_method or a test function's name)")
        if path in (t.file for t in out):
            raise w.fail(at, f"{path} is listed twice")
        out.append(UpstreamTestFile(path, tuple(own)))
    return tuple(out)


def load_matrix(path: Path | str) -> Matrix:
    """Read and validate a matrix file; raise :class:`ConfigError` naming what is wrong."""
    path = Path(path)
    w = _Where(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read matrix: {exc.strerror}") from None
    try:
        raw = tomllib.loads(data.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    schema = raw.get("schema")
    if schema not in SCHEMAS or isinstance(schema, bool):
        raise w.fail("schema", f"expected schema = {SCHEMA} (or 1 for an older matrix), got {schema!r}")
    w.schema = schema
    unknown = set(raw) - {"schema", "releases", "fixes", "gpu", "families"}  # gpu: difflab.matrix.gpu
    if unknown:
        raise w.fail("top level", f"unknown field(s) {sorted(unknown)}")
    releases = {v: _release(w, v, r) for v, r in _table(w, "releases", raw.get("releases", {})).items()}
    fixes_raw = raw.get("fixes")
    if not isinstance(fixes_raw, list) or not fixes_raw:
        raise w.fail("fixes", "expected at least one [[fixes]] entry")
    fixes = tuple(_fix(w, i, f, releases) for i, f in enumerate(fixes_raw))
    ids = [f.id for f in fixes]
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        raise w.fail("fixes", f"duplicate fix id(s) {dupes}")
    families = load_families(path, raw.get("families", {}), fixes)
    return Matrix(path=path, sha256=hashlib.sha256(data).hexdigest(), releases=releases, fixes=fixes, families=families)
