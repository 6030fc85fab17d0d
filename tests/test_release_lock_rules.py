"""The release lock's rules one by one, fast: trust on first use, a changed hash refused, the matrix agreed with.

The listings are the index client's own ``Listing`` as the real sglang project page gives it
(several builds per version, a post-release, a pre-release, a yanked file, a source-only version);
the lock files are written as ``difflab releases --lock`` writes them.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
from pathlib import Path

import pytest

from difflab.errors import ConfigError, SourceError
from difflab.matrix.model import Fix, ReleasePin, SidePin
from difflab.source.index import Listing, ReleaseFile
from difflab.source.release_lock import (
    HEADER,
    HashChanged,
    LockedRelease,
    LockReport,
    ReleaseLock,
    Sighting,
    agree_with_matrix,
    compare,
    load_lock,
    matrix_floor,
    oldest,
    parse_floor,
    pin_new,
    refuse_changes,
)

TAG = "cp311-cp311-manylinux_2_34_x86_64"


def wheel(version: str) -> str:
    return f"sglang-{version}-{TAG}.whl"


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def listing(*files: ReleaseFile, unusable: dict[str, str] | None = None, served: dict | None = None) -> Listing:
    """What the index client builds: the chosen wheel per version and every file's hash."""
    out = Listing(package="sglang", sources=["https://pypi.org/simple"])
    for f in files:
        out.releases[f.version] = f
        out.served[(f.version, f.file)] = f.sha256
        out.served[(f.version, f"sglang-{f.version}-cp312-cp312-manylinux_2_34_x86_64.whl")] = sha("cp312" + f.version)
    out.unusable.update(unusable or {})
    out.served.update(served or {})
    return out


def release(version: str, yanked: str | None = None, hashed: bool = True) -> ReleaseFile:
    url = f"https://files.pythonhosted.org/packages/{wheel(version)}"
    return ReleaseFile(version, wheel(version), sha(version) if hashed else None, url, yanked)


def locked(version: str, digest: str | None = None, **kw: object) -> LockedRelease:
    return LockedRelease(version, wheel(version), digest or sha(version), "2026-11-02", **kw)  # type: ignore[arg-type]


# -- the lock file -----------------------------------------------------------------------------------------


def test_a_saved_lock_reads_back_the_same_with_versions_in_release_order(tmp_path: Path) -> None:
    lock = ReleaseLock(tmp_path / "releases.lock")
    assert lock.sha256 == "" and lock.versions == []
    for entry in (
        locked("0.10.0"),
        locked("0.6.1rc1", prerelease=True),
        locked("0.6.0.post1"),
        locked("0.6.1", yanked=""),
        locked("0.6.2", yanked="broken build"),
    ):
        lock.releases[entry.version] = entry
    assert lock.versions == ["0.6.0.post1", "0.6.1rc1", "0.6.1", "0.6.2", "0.10.0"]
    assert lock.save() == lock.path
    text = lock.path.read_text()
    assert text.startswith(HEADER + '\nschema = 1\npackage = "sglang"\n')
    assert text.index('"0.6.0.post1"') < text.index('"0.6.1rc1"') < text.index('"0.10.0"')
    assert lock.sha256 == hashlib.sha256(lock.path.read_bytes()).hexdigest()
    again = load_lock(lock.path, missing_ok=False)
    assert again.releases == lock.releases and again.package == "sglang"
    assert again.releases["0.6.1rc1"].prerelease and not again.releases["0.6.0.post1"].prerelease
    assert again.releases["0.6.1"].yanked == "" and again.releases["0.6.0.post1"].yanked is None
    assert locked("0.6.0").to_toml() == {"file": wheel("0.6.0"), "sha256": sha("0.6.0"), "first_seen": "2026-11-02"}
    assert locked("0.6.1rc1", prerelease=True, yanked="").to_toml() == {
        **locked("0.6.1rc1").to_toml(),
        "prerelease": True,
        "yanked": "",
    }
    assert locked("0.6.0").pin() == ReleasePin("0.6.0", wheel("0.6.0"), sha("0.6.0"))


def test_a_missing_lock_is_empty_only_where_allowed(tmp_path: Path) -> None:
    lock = load_lock(tmp_path / "none.lock")
    assert lock.releases == {} and lock.path == tmp_path / "none.lock" and lock.package == "sglang"
    with pytest.raises(ConfigError) as caught:
        load_lock(tmp_path / "none.lock", missing_ok=False)
    assert str(caught.value) == f"{tmp_path / 'none.lock'}: no release lock; run `difflab releases --lock` first"


GOOD = f'[releases."0.6.0"]\nfile = "{wheel("0.6.0")}"\nsha256 = "{"a" * 64}"\nfirst_seen = "2026-12-01"\n'


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('schema = 2\npackage = "sglang"\n', "schema must be 1, got 2"),
        ('package = "sglang"\n', "schema must be 1, got None"),
        ("schema = 1\npackage = 3\n", "'package' must be a string and 'releases' a table"),
        ('schema = 1\nreleases = "0.6.0"\n', "'package' must be a string and 'releases' a table"),
        ("schema = 1\nreleases = { '0.6.0' = 1 }\n", "releases.'0.6.0': must be a table"),
        ("schema = 1\n" + GOOD.replace('"0.6.0"]', '"six"]'), "releases.'six': not a version"),
        ("schema = 1\n" + GOOD.replace('"0.6.0"]', '"0.06.0"]'), "releases.'0.06.0': write the version as '0.6.0'"),
        ("schema = 1\n" + GOOD.replace("a" * 64, "A" * 64), "releases.'0.6.0'.sha256: not a lower-case hex sha256"),
        ("schema = 1\n" + GOOD.replace("a" * 64, "a" * 63), "releases.'0.6.0'.sha256: not a lower-case hex sha256"),
        ("schema = 1\n" + GOOD.replace("a" * 64, "a" * 65), "releases.'0.6.0'.sha256: not a lower-case hex sha256"),
        ("schema = 1\n" + GOOD.replace("a" * 64, "g" * 64), "releases.'0.6.0'.sha256: not a lower-case hex sha256"),
        ("schema = 1\n" + GOOD.replace("a" * 64, "X" * 64), "releases.'0.6.0'.sha256: not a lower-case hex sha256"),
        (
            "schema = 1\n" + GOOD.replace('sha256 = "', 'sha256 = 1 #"'),
            "releases.'0.6.0'.sha256: missing or not a string",
        ),
        ("schema = 1\n" + GOOD.replace('"2026-12-01"', '""'), "releases.'0.6.0'.first_seen: missing or not a string"),
        ("schema = 1\n" + GOOD.replace("file =", "wheel ="), "releases.'0.6.0'.file: missing or not a string"),
        ("schema = 1\n" + GOOD + 'colour = "red"\nage = 1\n', "releases.'0.6.0': unknown key(s) ['age', 'colour']"),
        ("schema = 1\n" + GOOD.replace(".whl", ".tar.gz"), f"'sglang-0.6.0-{TAG}.tar.gz' is not a wheel file name"),
        ("schema = 1\n" + GOOD.replace("sglang-0.6.0", "sglang_router-0.6.0"), "is a wheel of 'sglang-router', not"),
        ("schema = 1\n" + GOOD.replace("sglang-0.6.0", "sglang-0.6.1"), "is the wheel of release 0.6.1, not of 0.6.0"),
        ("schema = [", "not valid TOML"),
    ],
)
def test_a_bad_lock_is_refused_naming_the_file_and_the_entry(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "releases.lock"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_lock(path)
    assert str(caught.value).startswith(f"{path}: ") and message in str(caught.value)
    if "file name" in message or "wheel of" in message:
        assert f"{path}: releases.'0.6.0'.file: " in str(caught.value)


def test_a_lock_that_is_not_utf8_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "releases.lock"
    path.write_bytes(b"schema = 1\n# \xff\n")
    with pytest.raises(ConfigError) as caught:
        load_lock(path)
    assert str(caught.value).startswith(f"{path}: not valid TOML (")
    assert caught.value.__cause__ is None and caught.value.__suppress_context__


def test_a_lock_without_package_or_releases_is_an_empty_sglang_lock(tmp_path: Path) -> None:
    path = tmp_path / "releases.lock"
    path.write_text("schema = 1\n")
    lock = load_lock(path)
    assert (lock.path, lock.package, lock.releases) == (path, "sglang", {})
    path.write_text('schema = 1\npackage = "sglang-nightly"\n')
    assert load_lock(path).package == "sglang-nightly"


def test_an_entry_with_every_key_reads_as_written(tmp_path: Path) -> None:
    path = tmp_path / "releases.lock"
    path.write_text(
        'schema = 1\npackage = "sglang"\n'
        + GOOD.replace("0.6.0", "0.6.1rc1")
        + 'prerelease = true\nyanked = "broken build"\n'
        + GOOD
    )
    lock = load_lock(path)
    assert lock.releases == {
        "0.6.1rc1": LockedRelease("0.6.1rc1", wheel("0.6.1rc1"), "a" * 64, "2026-12-01", True, "broken build"),
        "0.6.0": LockedRelease("0.6.0", wheel("0.6.0"), "a" * 64, "2026-12-01", False, None),
    }


# -- one sight of the index ------------------------------------------------------------------------------


def test_a_first_sight_from_the_floor_on_is_new_skipped_or_unusable() -> None:
    seen = listing(
        release("0.5.9"),
        release("0.6.0"),
        release("0.6.0.post1"),
        release("0.6.1rc1"),
        release("0.6.1", yanked="broken build"),
        release("0.6.2", yanked=""),
        release("0.6.3", hashed=False),
        unusable={"0.6.4": "only a source distribution", "0.5.8": "only a source distribution"},
    )
    report = compare(ReleaseLock(Path("releases.lock")), seen, "0.6.0", {})
    assert report.floor == "0.6.0"
    assert [(s.version, s.state, s.detail) for s in report.sightings] == [
        ("0.6.0", "new", ""),
        ("0.6.0.post1", "new", ""),
        ("0.6.1rc1", "skipped", "pre-release (--pre to watch)"),
        ("0.6.1", "skipped", "yanked: broken build (--yanked to watch)"),
        ("0.6.2", "skipped", "yanked (--yanked to watch)"),
        ("0.6.3", "changed", f"{wheel('0.6.3')}: the index publishes no sha256"),
        ("0.6.4", "skipped", "only a source distribution"),
    ]
    assert [s.release for s in report.sightings] == [*(seen.releases[v] for v in ("0.6.0", "0.6.0.post1", "0.6.1rc1",
        "0.6.1", "0.6.2", "0.6.3")), None]  # fmt: skip
    assert all(s.locked is None for s in report.sightings)
    wide = compare(ReleaseLock(Path("releases.lock")), seen, "0.6.0", {}, include_pre=True, include_yanked=True)
    assert [s.state for s in wide.sightings] == ["new", "new", "new", "new", "new", "changed", "skipped"]
    assert [s.version for s in report.of("new")] == ["0.6.0", "0.6.0.post1"]


def test_a_yanked_pre_release_names_both_reasons() -> None:
    seen = listing(release("0.7.0rc1", yanked="bad"))
    (s,) = compare(ReleaseLock(Path("l")), seen, "0.6", {}).sightings
    assert s.detail == "pre-release (--pre to watch); yanked: bad (--yanked to watch)"
    (s,) = compare(ReleaseLock(Path("l")), seen, "0.6", {}, include_pre=True).sightings
    assert (s.state, s.detail) == ("skipped", "yanked: bad (--yanked to watch)")


def test_a_version_listed_without_a_usable_wheel_or_a_reason_is_skipped() -> None:
    seen = listing(release("0.6.0"))
    del seen.releases["0.6.0"]
    seen.unusable["0.6.0"] = ""
    (s,) = compare(ReleaseLock(Path("l")), seen, "0.6.0", {}).sightings
    assert (s.state, s.detail) == ("skipped", "")
    seen = listing()
    seen.releases["0.6.1"] = release("0.6.1")
    seen.releases.pop("0.6.1")
    seen.unusable["0.6.1"] = "no wheel for cp311"
    assert compare(ReleaseLock(Path("l")), seen, "0.6.0", {}).sightings[0].detail == "no wheel for cp311"


def test_a_locked_release_is_checked_by_the_hash_of_its_own_file() -> None:
    lock = ReleaseLock(Path("releases.lock"), releases={v: locked(v) for v in ("0.6.0", "0.6.1", "0.6.2")})
    seen = listing(release("0.6.0"), release("0.6.1"), served={("0.6.1", wheel("0.6.1")): sha("re-uploaded")})
    seen.releases["0.6.2"] = dataclasses.replace(release("0.6.2"), file=wheel("0.6.2").replace("2_34", "2_28"))
    seen.served[("0.6.2", seen.releases["0.6.2"].file)] = sha("other build")
    report = compare(lock, seen, "0.6.0", {})
    assert [(s.version, s.state, s.detail) for s in report.sightings] == [
        ("0.6.0", "locked", "since 2026-11-02"),
        (
            "0.6.1",
            "changed",
            f"{wheel('0.6.1')}: locked sha256 {sha('0.6.1')} (first seen 2026-11-02), now {sha('re-uploaded')}",
        ),
        ("0.6.2", "gone", f"{wheel('0.6.2')} is no longer served"),
    ]
    assert [s.locked for s in report.sightings] == [lock.releases[v] for v in ("0.6.0", "0.6.1", "0.6.2")]
    assert [s.release for s in report.sightings] == [
        seen.releases["0.6.0"],
        seen.releases["0.6.1"],
        seen.releases["0.6.2"],
    ]


def test_a_locked_file_served_without_a_hash_stays_locked_its_download_is_checked_by_the_lock() -> None:
    lock = ReleaseLock(Path("releases.lock"), releases={"0.6.0": locked("0.6.0")})
    seen = listing(release("0.6.0", hashed=False))
    (s,) = compare(lock, seen, "0.6.0", {}).sightings
    assert (s.state, s.detail, s.release) == ("locked", "since 2026-11-02", seen.releases["0.6.0"])


def test_a_locked_release_no_index_lists_is_gone_from_the_floor_on() -> None:
    lock = ReleaseLock(Path("l"), releases={v: locked(v) for v in ("0.5.9", "0.6.0", "0.6.1", "0.6.2")})
    seen = listing(release("0.6.2"), unusable={"0.6.1": "only a source distribution"})
    report = compare(lock, seen, "0.6.0", {})
    assert [(s.version, s.state, s.detail) for s in report.sightings] == [
        ("0.6.0", "gone", "not listed by any index any more"),
        ("0.6.1", "gone", f"{wheel('0.6.1')} is no longer served"),
        ("0.6.2", "locked", "since 2026-11-02"),
    ]
    assert report.sightings[0].locked == lock.releases["0.6.0"] and report.sightings[0].release is None


def test_a_release_the_matrix_pins_is_first_seen_only_with_the_matrix_file_and_hash() -> None:
    seen = listing(release("0.6.0"), release("0.6.1"), release("0.6.2"))
    pins = {
        "0.6.0": ReleasePin("0.6.0", wheel("0.6.0"), sha("0.6.0")),
        "0.6.1": ReleasePin("0.6.1", wheel("0.6.1"), "0" * 64),  # the hash alone differs
        "0.6.2": ReleasePin("0.6.2", wheel("0.6.2").replace("cp311-cp311", "cp312-cp312"), sha("0.6.2")),
    }
    report = compare(ReleaseLock(Path("l")), seen, "0.6.0", pins)
    assert [s.release for s in report.sightings] == [seen.releases[v] for v in ("0.6.0", "0.6.1", "0.6.2")]
    assert [(s.version, s.state, s.detail) for s in report.sightings] == [
        ("0.6.0", "new", ""),
        (
            "0.6.1",
            "changed",
            f"the matrix pins {wheel('0.6.1')} sha256 {'0' * 64}, the index serves {wheel('0.6.1')} {sha('0.6.1')}",
        ),
        (
            "0.6.2",
            "changed",
            f"the matrix pins {pins['0.6.2'].file} sha256 {sha('0.6.2')}, "
            f"the index serves {wheel('0.6.2')} {sha('0.6.2')}",
        ),
    ]


def test_changed_releases_are_refused_by_name_and_nothing_is_pinned(tmp_path: Path) -> None:
    lock = ReleaseLock(tmp_path / "releases.lock", releases={"0.6.0": locked("0.6.0")})
    lock.save()
    before = lock.path.read_bytes()
    seen = listing(release("0.6.0"), release("0.6.1"), release("0.6.2", hashed=False))
    seen.served[("0.6.0", wheel("0.6.0"))] = sha("re-uploaded")
    report = compare(lock, seen, "0.6.0", {})
    with pytest.raises(HashChanged) as caught:
        pin_new(lock, report, dt.date(2026, 12, 1))
    assert isinstance(caught.value, SourceError)
    assert str(caught.value) == (
        f"{lock.path}: refusing 2 release(s) whose wheel cannot be trusted:\n"
        f"  0.6.0: {wheel('0.6.0')}: locked sha256 {sha('0.6.0')} (first seen 2026-11-02), now {sha('re-uploaded')}\n"
        f"  0.6.2: {wheel('0.6.2')}: the index publishes no sha256"
    )
    assert set(lock.releases) == {"0.6.0"} and lock.path.read_bytes() == before
    refuse_changes(LockReport("0.6.0", [Sighting("0.6.1", "new", release("0.6.1"))]), lock)  # nothing changed


def test_new_releases_are_pinned_with_the_day_they_were_first_seen() -> None:
    lock = ReleaseLock(Path("l"), releases={"0.6.0": locked("0.6.0")})
    seen = listing(release("0.6.0"), release("0.6.1"), release("0.6.2rc1", yanked="bad"))
    report = compare(lock, seen, "0.6.0", {}, include_pre=True, include_yanked=True)
    added = pin_new(lock, report, dt.date(2026, 12, 1))
    assert added == [
        LockedRelease("0.6.1", wheel("0.6.1"), sha("0.6.1"), "2026-12-01", False, None),
        LockedRelease("0.6.2rc1", wheel("0.6.2rc1"), sha("0.6.2rc1"), "2026-12-01", True, "bad"),
    ]
    assert lock.releases == {"0.6.0": locked("0.6.0"), **{a.version: a for a in added}}


def test_a_release_is_pinned_on_the_day_it_is_in_utc_whatever_the_local_zone(monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    hour = dt.datetime.now(dt.UTC).hour
    monkeypatch.setenv("TZ", "Etc/GMT+12" if hour < 12 else "Etc/GMT-12")  # the local date is another day
    time.tzset()
    try:
        utc = dt.datetime.now(dt.UTC).date()
        assert dt.datetime.now().date() != utc or dt.datetime.now(dt.UTC).hour != hour
        (added,) = pin_new(
            ReleaseLock(Path("l")), compare(ReleaseLock(Path("l")), listing(release("0.6.3")), "0.6", {})
        )
        assert added.first_seen == utc.isoformat()
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()


# -- the matrix and the floor ----------------------------------------------------------------------------


def test_a_release_pinned_differently_by_lock_and_matrix_names_each_field_in_both_files(tmp_path: Path) -> None:
    lock = ReleaseLock(tmp_path / "releases.lock", releases={v: locked(v) for v in ("0.6.0", "0.6.1")})
    matrix = tmp_path / "upstream.toml"
    agree_with_matrix(lock, {"0.6.0": locked("0.6.0").pin(), "0.5.0": ReleasePin("0.5.0", "x.whl", "1" * 64)}, matrix)
    other = ReleasePin("0.6.1", wheel("0.6.1").replace("cp311-cp311", "cp312-cp312"), "0" * 64)
    with pytest.raises(ConfigError) as caught:
        agree_with_matrix(lock, {"0.5.0": ReleasePin("0.5.0", "x.whl", "1" * 64), "0.6.1": other}, matrix)
    assert str(caught.value) == (
        f"{lock.path}: release 0.6.1 is pinned differently from the matrix ("
        f"releases.'0.6.1'.file is {wheel('0.6.1')} there, {other.file} in {matrix}; "
        f"releases.'0.6.1'.sha256 is {sha('0.6.1')} there, {'0' * 64} in {matrix}); "
        "review which wheel is the right one before any verdict on it is trusted"
    )
    hash_only = dataclasses.replace(locked("0.6.1").pin(), sha256="0" * 64)
    with pytest.raises(ConfigError) as caught:
        agree_with_matrix(lock, {"0.6.1": hash_only}, matrix)
    assert f"(releases.'0.6.1'.sha256 is {sha('0.6.1')} there, {'0' * 64} in {matrix}); " in str(caught.value)
    assert ".file" not in str(caught.value)


def _fix(base: SidePin) -> Fix:
    return Fix("38935", 38935, "t", base, SidePin(release="0.5.21"), ())


def test_the_floor_is_the_oldest_release_base_or_given_as_a_version(tmp_path: Path) -> None:
    fixes = [_fix(SidePin(release="0.5.20")), _fix(SidePin(commit="a" * 40)), _fix(SidePin(release="0.5.19.post1")),
             _fix(SidePin(release="0.5.100"))]  # fmt: skip
    assert matrix_floor(fixes, tmp_path / "m.toml") == "0.5.19.post1"
    with pytest.raises(ConfigError) as caught:
        matrix_floor([_fix(SidePin(commit="a" * 40))], tmp_path / "m.toml")
    assert str(caught.value) == f"{tmp_path / 'm.toml'}: no fix has a release base; give --since VERSION"
    assert oldest([]) is None and oldest(["0.10.0", "0.9.0"]) == "0.9.0"
    assert parse_floor("0.6") == "0.6" and parse_floor("v0.06.0") == "0.6.0"
    with pytest.raises(ConfigError) as caught:
        parse_floor("latest")
    assert str(caught.value) == "--since 'latest': not a version (e.g. 0.5.19)"
    assert caught.value.__suppress_context__
