"""The release watch without SGLang: the index as pip configures it, the trust-on-first-use lock,
the environment plan, cells and regressions, and the table's files.

The index is a real one: PEP 503/691 pages served over ``http.server`` on loopback (or a
``file://`` folder), read through pip's real ``pip config list``.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import re
from pathlib import Path

import pytest
from junitparser import JUnitXml

from difflab.cli import main
from difflab.diff.containment import (
    Cell,
    ContainmentTable,
    ProbeCell,
    ReleaseColumn,
    expected_cell,
    find_regressions,
    judge_cell,
)
from difflab.environment.plan import EnvironmentPlan, load_needs, pin_versions, plan_environments
from difflab.environment.shared import SharedEnvironment, pinned_texts, spec_digest
from difflab.errors import ConfigError
from difflab.matrix import load_matrix
from difflab.observation import Observation
from difflab.paths import default_matrix
from difflab.report.containment import render_markdown, write_files
from difflab.report.grid import render_html
from difflab.source.index import IndexClient, WheelTarget, build_listing
from difflab.source.pip_config import PYPI_SIMPLE, parse_config_list, pip_settings, settings_from
from difflab.source.release_lock import (
    HashChanged,
    agree_with_matrix,
    compare,
    load_lock,
    matrix_floor,
    pin_new,
)
from fake_index import pip_env, serve, sha256, tiny_wheel, write_project_page
from matrix_samples import FIX, RELEASES

TAG = "cp311-cp311-manylinux_2_34_x86_64"
TARGET = WheelTarget(python="cp311", machine="x86_64")


# -- pip's configuration -------------------------------------------------------------
def test_pip_precedence_is_variables_then_download_section_then_global() -> None:
    text = (
        ":env:.index-url='https://mirror.example/simple'\n"
        "download.extra-index-url='https://extra.example/simple https://two.example/simple'\n"
        "global.extra-index-url='https://ignored.example/simple'\n"
        "global.index-url='https://global.example/simple'\n"
        "global.cert='/etc/ca.pem'\n"
        "global.find-links='/wheels /more'\n"
        ":env:.no-index='false'\n"
        "junk line without a section\n"
    )
    s = settings_from(parse_config_list(text))
    assert s.index_url == "https://mirror.example/simple"
    assert s.extra_index_urls == ("https://extra.example/simple", "https://two.example/simple")
    assert s.find_links == ("/wheels", "/more") and s.cert == "/etc/ca.pem" and not s.no_index
    assert s.indexes == ("https://mirror.example/simple", "https://extra.example/simple", "https://two.example/simple")
    assert settings_from({}).indexes == (PYPI_SIMPLE,)
    assert settings_from({":env:": {"no-index": "1"}}).indexes == ()


def test_pip_settings_come_from_pip_itself(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    conf = tmp_path / "pip.conf"
    conf.write_text("[global]\nindex-url = https://from-file.example/simple\nextra-index-url = file:///srv/simple\n")
    environ = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")} | {"PIP_CONFIG_FILE": str(conf)}
    s = pip_settings(environ=environ)
    assert s.index_url == "https://from-file.example/simple" and s.extra_index_urls == ("file:///srv/simple",)
    s = pip_settings(environ=environ | {"PIP_INDEX_URL": "http://127.0.0.1:1/simple"})
    assert s.index_url == "http://127.0.0.1:1/simple"  # a PIP_* variable beats the file, as in pip


# -- the index -----------------------------------------------------------------------
MACHINERY_MATRIX = Path(__file__).resolve().parent / "fixtures" / "machinery" / "upstream.toml"


@pytest.fixture
def index_files(tmp_path: Path) -> tuple[Path, list[Path]]:
    """Shapes the real sglang project page has: post-releases, several builds per version, sdists."""
    wheels = tmp_path / "files"
    wheels.mkdir()
    files = [
        tiny_wheel(wheels, "sglang", "0.6.0"),
        tiny_wheel(wheels, "sglang", "0.6.0", "cp312-cp312-manylinux_2_34_x86_64"),
        tiny_wheel(wheels, "sglang", "0.6.0", "cp311-cp311-manylinux_2_34_aarch64"),
        tiny_wheel(wheels, "sglang", "0.6.0.post1"),
        tiny_wheel(wheels, "sglang", "0.6.1rc1"),
        tiny_wheel(wheels, "sglang", "0.6.1"),
        tiny_wheel(wheels, "sglang", "0.6.2", "cp312-cp312-manylinux_2_34_x86_64"),
        tiny_wheel(wheels, "sglang", "0.6.3", "cp311-cp311-manylinux_2_28_x86_64"),
        tiny_wheel(wheels, "sglang", "0.6.3"),
        tiny_wheel(wheels, "sglang", "0.5.0", "py3-none-any"),
        tiny_wheel(wheels, "sglang-router", "0.6.0"),
    ]
    sdist = wheels / "sglang-0.5.9.tar.gz"
    sdist.write_bytes(b"not a wheel")
    files.append(sdist)
    return tmp_path / "simple", files


def _listing_checks(listing) -> None:
    assert listing.versions == ["0.5.0", "0.5.9", "0.6.0", "0.6.0.post1", "0.6.1rc1", "0.6.1", "0.6.2", "0.6.3"]
    assert listing.releases["0.6.0"].file == f"sglang-0.6.0-{TAG}.whl"  # not the cp312 or aarch64 build
    assert listing.releases["0.6.3"].file == f"sglang-0.6.3-{TAG}.whl"  # the newest glibc tag
    assert listing.releases["0.5.0"].file == "sglang-0.5.0-py3-none-any.whl"  # pure Python will do
    assert listing.releases["0.6.1rc1"].prerelease and not listing.releases["0.6.0.post1"].prerelease
    assert listing.releases["0.6.1"].yanked == "broken build"
    assert "0.6.2" in listing.unusable and "cp311" in listing.unusable["0.6.2"]
    assert "source distribution" in listing.unusable["0.5.9"]
    assert all(r.sha256 and len(r.sha256) == 64 for r in listing.releases.values())


def test_index_over_http_html_and_json(index_files, monkeypatch: pytest.MonkeyPatch) -> None:
    root, files = index_files
    write_project_page(root, "sglang", files, yanked={f"sglang-0.6.1-{TAG}.whl": "broken build"})
    for json_pages in (False, True):
        with serve(root, json_pages=json_pages) as (url, served_json):
            settings = settings_from({":env:": {"index-url": f"{url}/"}})
            listing = IndexClient(settings).list("sglang", TARGET)
            assert bool(served_json) is json_pages  # PEP 691 JSON when the index offers it
        _listing_checks(listing)
        assert listing.releases["0.6.0"].sha256 == sha256(files[0])


def test_file_index_and_find_links_folder(index_files) -> None:
    root, files = index_files
    write_project_page(root, "sglang", files, yanked={f"sglang-0.6.1-{TAG}.whl": "broken build"})
    settings = settings_from({":env:": {"index-url": root.as_uri()}})
    _listing_checks(IndexClient(settings).list("sglang", TARGET))
    links = settings_from({":env:": {"no-index": "1", "find-links": str(files[0].parent)}})
    listing = IndexClient(links).list("sglang", TARGET)
    assert listing.releases["0.6.0"].sha256 == sha256(files[0]) and "0.6.1rc1" in listing.releases


def test_unreachable_or_failing_index_is_named(tmp_path: Path) -> None:
    from difflab.errors import SourceError

    dead = settings_from({":env:": {"index-url": "http://127.0.0.1:9/simple", "timeout": "2"}})
    with pytest.raises(SourceError, match=r"package index http://127.0.0.1:9/simple: cannot be read"):
        IndexClient(dead).list("sglang")
    with serve(tmp_path) as (url, _):  # no project page at all: a 404 is "not on this index"
        assert IndexClient(settings_from({":env:": {"index-url": url}})).list("sglang").versions == []


def test_the_same_file_with_two_hashes_on_two_indexes_is_refused(index_files) -> None:
    from difflab.errors import SourceError
    from difflab.source.index import IndexFile

    a = IndexFile(f"sglang-0.6.0-{TAG}.whl", "0.6.0", "u", "a" * 64, source="one")
    b = IndexFile(f"sglang-0.6.0-{TAG}.whl", "0.6.0", "u", "b" * 64, source="two")
    with pytest.raises(SourceError, match="on one but"):
        build_listing("sglang", [a, b], ["one", "two"], TARGET)


# -- the lock ------------------------------------------------------------------------
def _listing(tmp_path: Path, versions: dict[str, bytes]):
    folder = tmp_path / "w"
    folder.mkdir(exist_ok=True)
    files = []
    for version, content in versions.items():
        path = tiny_wheel(folder, "sglang", version)
        with open(path, "ab") as fh:  # a different file under the same name: another sha256
            fh.write(content)
        files.append(path)
    root = tmp_path / "simple"
    write_project_page(root, "sglang", files)
    return IndexClient(settings_from({":env:": {"index-url": root.as_uri()}})).list("sglang", TARGET)


def test_first_sight_pins_with_the_date_later_sight_checks_the_hash(tmp_path: Path) -> None:
    lock = load_lock(tmp_path / "releases.lock")
    listing = _listing(tmp_path, {"0.6.0": b"", "0.6.0.post1": b"", "0.6.1rc1": b""})
    report = compare(lock, listing, "0.6.0", {})
    assert [(s.version, s.state) for s in report.sightings] == [
        ("0.6.0", "new"),
        ("0.6.0.post1", "new"),
        ("0.6.1rc1", "skipped"),
    ]
    added = pin_new(lock, report, today=dt.date(2026, 12, 1))
    assert [a.version for a in added] == ["0.6.0", "0.6.0.post1"]
    lock.save()
    again = load_lock(lock.path)
    assert again.releases["0.6.0"].first_seen == "2026-12-01"
    assert again.releases["0.6.0"].sha256 == listing.releases["0.6.0"].sha256
    assert [s.state for s in compare(again, listing, "0.6.0", {}).sightings] == ["locked", "locked", "skipped"]
    with_pre = compare(again, listing, "0.6.0", {}, include_pre=True)
    assert [s.state for s in with_pre.sightings] == ["locked", "locked", "new"]

    changed = _listing(tmp_path, {"0.6.0": b"re-uploaded", "0.6.0.post1": b"", "0.6.1rc1": b""})
    report = compare(again, changed, "0.6.0", {})
    assert [s.state for s in report.sightings][:1] == ["changed"]
    before = lock.path.read_bytes()
    with pytest.raises(HashChanged) as err:
        pin_new(again, report)
    message = str(err.value)
    assert again.releases["0.6.0"].sha256 in message and changed.served[("0.6.0", f"sglang-0.6.0-{TAG}.whl")] in message
    assert "0.6.0" in message and lock.path.read_bytes() == before


def test_a_release_the_matrix_pins_must_first_be_seen_with_the_matrix_hash(tmp_path: Path) -> None:
    matrix = load_matrix(default_matrix())
    listing = _listing(tmp_path, {"0.5.20": b""})  # not the real 0.5.20 wheel
    report = compare(load_lock(tmp_path / "l.lock"), listing, "0.5.19", matrix.releases)
    (s,) = report.sightings
    assert (
        s.state == "changed"
        and matrix.releases["0.5.20"].sha256 in s.detail
        and listing.releases["0.5.20"].sha256 in s.detail
    )


def test_lock_file_errors_name_the_entry(tmp_path: Path) -> None:
    path = tmp_path / "releases.lock"
    wheel = "sglang-0.6.0-py3-none-any.whl"
    good = f'[releases."0.6.0"]\nfile = "{wheel}"\nsha256 = "' + "a" * 64 + '"\nfirst_seen = "2026-12-01"\n'
    cases = {
        'schema = 2\npackage = "sglang"\n': "schema must be 1",
        "schema = 1\n" + good.replace("a" * 64, "XYZ"): "releases.'0.6.0'.sha256",
        "schema = 1\n" + good.replace('"0.6.0"', '"v0.6.0"'): "write the version as '0.6.0'",
        "schema = 1\n" + good + 'colour = "red"\n': "unknown key",
        "schema = 1\n" + good.replace('first_seen = "2026-12-01"\n', ""): "first_seen: missing",
        "schema = [": "not valid TOML",
    }
    for text, message in cases.items():
        path.write_text(text)
        with pytest.raises(ConfigError, match=re.escape(message)):
            load_lock(path)
    with pytest.raises(ConfigError, match="releases --lock"):
        load_lock(tmp_path / "missing.lock", missing_ok=False)


def test_the_committed_lock_agrees_with_the_matrix() -> None:
    matrix = load_matrix(default_matrix())
    lock = load_lock(default_matrix().parent / "releases.lock", missing_ok=False)
    assert lock.versions[0] == matrix_floor(matrix.fixes, matrix.path) == "0.5.19"
    assert set(matrix.releases) <= set(lock.releases)
    agree_with_matrix(lock, matrix.releases, matrix.path)
    for version, pin in matrix.releases.items():
        assert (lock.releases[version].file, lock.releases[version].sha256) == (pin.file, pin.sha256)
    pinned = matrix.releases["0.5.21"]
    genuine = lock.releases["0.5.21"]
    for key, value in (("sha256", "0" * 64), ("file", pinned.file.replace("cp311-cp311", "cp312-cp312"))):
        lock.releases["0.5.21"] = dataclasses.replace(genuine, **{key: value})
        assert getattr(lock.releases["0.5.21"], key) != getattr(pinned, key)
        other = "file" if key == "sha256" else "sha256"
        assert getattr(lock.releases["0.5.21"], other) == getattr(pinned, other)  # one field differs, not both
        with pytest.raises(ConfigError) as caught:
            agree_with_matrix(lock, matrix.releases, matrix.path)
        message = str(caught.value)
        assert message.startswith(f"{lock.path}: release 0.5.21 is pinned differently")
        assert f"releases.'0.5.21'.{key} is {value} there, {getattr(pinned, key)} in {matrix.path}" in message
        assert message.count("releases.'0.5.21'.") == 1  # only the field that differs


def test_contains_all_refuses_a_lock_whose_sha256_differs_from_the_matrix_pin(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before any environment is built or any wheel fetched: exit 2, naming the lock, the field and both hashes."""
    matrix = tmp_path / "m.toml"
    matrix.write_text(RELEASES + FIX)
    pins = load_matrix(matrix).releases
    lock = tmp_path / "releases.lock"
    entries = "".join(
        f'[releases."{v}"]\nfile = "{p.file}"\nsha256 = "{"0" * 64 if v == "0.5.21" else p.sha256}"\n'
        'first_seen = "2026-12-01"\n'
        for v, p in pins.items()
    )
    lock.write_text(f'schema = 1\npackage = "sglang"\n{entries}')
    assert load_lock(lock).releases["0.5.21"].file == pins["0.5.21"].file  # a hash-only difference
    out = tmp_path / "out"
    args = ["contains", "--all", "--matrix", str(matrix), "--lock-file", str(lock), "--out", str(out)]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert f"{lock}: release 0.5.21 is pinned differently" in err
    assert f"releases.'0.5.21'.sha256 is {'0' * 64} there, {pins['0.5.21'].sha256} in {matrix}" in err
    assert "0.5.20" not in err and not out.exists()  # the agreeing release is not named; nothing written


def test_releases_command_locks_then_refuses_a_changed_hash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The CLI against a local index, through pip's own configuration (PIP_INDEX_URL)."""
    matrix = tmp_path / "m.toml"
    matrix.write_text(RELEASES + FIX)
    wheels = tmp_path / "w"
    wheels.mkdir()
    files = [tiny_wheel(wheels, "sglang", v) for v in ("0.6.0", "0.6.1", "0.6.2rc1")]
    root = tmp_path / "simple"
    write_project_page(root, "sglang", files, yanked={files[1].name: ""})
    lock = tmp_path / "releases.lock"
    with serve(root) as (url, _):
        for key, value in pip_env(f"{url}/").items():
            monkeypatch.setenv(key, value)
        args = ["releases", "--matrix", str(matrix), "--lock-file", str(lock), "--since", "0.6"]
        assert main(args) == 0 and not lock.exists()  # listing alone writes nothing
        listed = capsys.readouterr().out
        assert "0.6.1" in listed and "yanked" in listed and "pre-release" in listed
        assert main([*args, "--lock"]) == 0
        out = capsys.readouterr().out
        assert "new: 0.6.0 pinned" in out and "0.6.1" not in out.split("wrote")[0].split("new:")[-1]
        assert load_lock(lock).versions == ["0.6.0"]
        assert main([*args, "--lock", "--yanked"]) == 0
        assert load_lock(lock).versions == ["0.6.0", "0.6.1"] and load_lock(lock).releases["0.6.1"].yanked == ""
        old = load_lock(lock).releases["0.6.0"].sha256
        before = lock.read_bytes()
        with open(files[0], "ab") as fh:
            fh.write(b"tampered")
        write_project_page(root, "sglang", files, yanked={files[1].name: ""})
        assert main([*args, "--lock"]) == 2
        err = capsys.readouterr().err
        assert old in err and sha256(files[0]) in err and "0.6.0" in err
        assert lock.read_bytes() == before  # nothing written
        assert main(args) == 2  # a plain listing refuses it too


# -- the environment plan ------------------------------------------------------------
SHARED = pin_versions(["transformers==5.12.1", "numpy==2.4.6", "torch==2.13.0"])


def _needs(tmp_path: Path, text: str):
    path = tmp_path / "needs.toml"
    path.write_text("schema = 1\n" + text)
    return load_needs(path)


def test_without_needs_every_release_shares_one_environment() -> None:
    releases = ["0.5.19", "0.5.20", "0.5.21", "0.5.22", "0.5.23"]
    assert plan_environments(releases, load_needs(), SHARED) == [EnvironmentPlan((), tuple(releases))]


def test_fewest_environments_cover_releases_with_overlapping_needs(tmp_path: Path) -> None:
    needs = _needs(
        tmp_path,
        '[[needs]]\nreleases = "<0.5.15"\nrequires = ["transformers<4.58"]\npins = ["transformers==4.57.1"]\n'
        '[[needs]]\nreleases = ">=0.5.13,<0.5.19"\nrequires = ["transformers>=4.57,<5"]\n'
        'pins = ["transformers==4.59.0"]\n',
    )
    releases = ["0.5.12", "0.5.13", "0.5.14", "0.5.15", "0.5.18", "0.5.19", "0.5.23"]
    plans = plan_environments(releases, needs, SHARED)
    # one environment per distinct need would be three (<0.5.13, both, >=0.5.15); 4.57.1 satisfies both ranges
    assert plans == [
        EnvironmentPlan((), ("0.5.19", "0.5.23")),
        EnvironmentPlan(("transformers==4.57.1",), ("0.5.12", "0.5.13", "0.5.14", "0.5.15", "0.5.18")),
    ]


def test_needs_on_different_packages_share_an_environment_only_where_both_apply(tmp_path: Path) -> None:
    needs = _needs(
        tmp_path,
        '[[needs]]\nreleases = "<0.5.15"\nrequires = ["numpy<2"]\npins = ["numpy==1.26.4"]\n'
        '[[needs]]\nreleases = "<0.5.13"\nrequires = ["transformers<5"]\npins = ["transformers==4.57.1"]\n',
    )
    plans = plan_environments(["0.5.12", "0.5.14", "0.5.20"], needs, SHARED)
    assert plans == [
        EnvironmentPlan((), ("0.5.20",)),
        EnvironmentPlan(("numpy==1.26.4",), ("0.5.14",)),
        EnvironmentPlan(("numpy==1.26.4", "transformers==4.57.1"), ("0.5.12",)),
    ]


def test_bad_or_unsatisfiable_needs_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="which its pins do not give"):
        _needs(tmp_path, '[[needs]]\nreleases = "<1"\nrequires = ["numpy<2"]\npins = ["numpy==2.0.0"]\n')
    with pytest.raises(ConfigError, match="not an exact pin"):
        _needs(tmp_path, '[[needs]]\nreleases = "<1"\nrequires = ["numpy<2"]\npins = ["numpy>=1"]\n')
    with pytest.raises(ConfigError, match="give releases, requires and pins"):
        _needs(tmp_path, '[[needs]]\nreleases = "<1"\n')
    clash = _needs(
        tmp_path,
        '[[needs]]\nreleases = "<1"\nrequires = ["numpy<2"]\npins = ["numpy==1.26.4"]\n'
        '[[needs]]\nreleases = "<1"\nrequires = ["numpy>=2.5"]\npins = ["numpy==2.5.0"]\n',
    )
    with pytest.raises(ConfigError, match=r"no environment serves 0.5.12 requires numpy<2, numpy>=2.5"):
        plan_environments(["0.5.12"], clash, SHARED)


def test_a_pinned_environment_has_its_own_digest_and_requirements() -> None:
    shared = SharedEnvironment()
    pinned = SharedEnvironment(pins=("transformers==4.57.1", "xgrammar==0.1.0"))
    assert shared.digest == spec_digest() and pinned.digest != shared.digest and pinned.path != shared.path
    main_text, nodeps = pinned_texts(pinned.pins)
    assert "transformers==4.57.1" in main_text.splitlines() and "transformers==5.12.1" not in main_text
    assert "xgrammar==0.1.0" in nodeps.splitlines() and "xgrammar" not in main_text


# -- cells, regressions and the files ------------------------------------------------
def _obs(fix: str, release: str, probe: str, fields: dict, status: str = "ok", error: str | None = None) -> Observation:
    source = {"kind": "release", "version": release}
    return Observation(fix=fix, side=release, probe=probe, source=source, status=status, fields=fields, error=error)


def _door_fields(prefill_fixed: bool, decode_fixed: bool, matrix) -> dict[str, dict]:
    fix = matrix.fix("38935")
    out = {}
    for spec in fix.probes:
        fixed = prefill_fixed if "prefill" in spec.name else decode_fixed
        out[spec.name] = {name: pair[1 if fixed else 0] for name, pair in spec.expect.items()} | dict(spec.controls)
    return out


def test_cells_and_regressions_from_observations(matrix) -> None:
    fix = matrix.fix("38935")
    shapes = {"0.5.20": (False, False), "0.5.21": (True, True), "0.5.22": (True, False), "0.5.23": (False, False)}
    cells = []
    for release, (prefill, decode) in shapes.items():
        fields = _door_fields(prefill, decode, matrix)
        obs = {name: _obs("38935", release, name, f) for name, f in fields.items()}
        cells.append(judge_cell(fix, release, obs, {name: f"observations/38935/{release}/{name}.json" for name in obs}))
    assert [c.verdict for c in cells] == ["absent", "present", "partial", "absent"]
    assert "prefill-door" in cells[2].reason and "decode-door" in cells[2].reason
    regressions = find_regressions([fix], list(shapes), cells)
    assert [(r.present_in, r.lost_in, r.verdict) for r in regressions] == [
        ("0.5.21", "0.5.22", "partial"),
        ("0.5.21", "0.5.23", "absent"),
    ]
    assert [c.regression for c in cells] == [False, False, True, True]
    assert [c.agrees for c in cells] == [True, True, False, False]  # the pins say present from 0.5.21


def test_not_applicable_names_the_missing_machinery_and_counts_as_lacking_the_fix(machinery_matrix) -> None:
    matrix = machinery_matrix
    fix = matrix.fix("41404")
    (spec,) = fix.probes
    why = "not applicable: no deferred decode KV release: DecodeTransferQueue.resolve_deferred_releases is missing"
    obs = {spec.name: _obs("41404", "0.5.18", spec.name, {}, status="n/a", error=why)}
    cell = judge_cell(fix, "0.5.18", obs, {spec.name: "observations/41404/0.5.18/x.json"})
    assert cell.verdict == "not-applicable" and "no deferred decode KV release" in cell.reason
    assert cell.expected is None and cell.agrees  # before the fix's base the matrix says nothing
    assert Cell("41404", "0.5.20", "not-applicable", "absent").agrees
    assert not Cell("41404", "0.5.21", "not-applicable", "present").agrees
    assert expected_cell(fix, "0.5.20") == "absent" and expected_cell(fix, "0.5.24") == "present"
    assert expected_cell(matrix.fix("43719b"), "0.5.30") == "absent"


def _table() -> ContainmentTable:
    matrix = load_matrix(MACHINERY_MATRIX)
    fixes = [matrix.fix("38935"), matrix.fix("41404")]
    releases = [
        ReleaseColumn("0.5.21", "a.whl", "1" * 64),
        ReleaseColumn("0.5.24", "b.whl", "2" * 64, new=True, first_seen="2026-12-01"),
    ]
    p = ProbeCell("head", "observations/38935/0.5.21/pr38935_prefill_door.json", "ok")
    cells = [
        Cell("38935", "0.5.21", "present", "present", "ok", {"pr38935_prefill_door": p, "pr38935_decode_door": p}),
        Cell("38935", "0.5.24", "partial", "present", "like base: <script>alert(1)</script>"),
        Cell("41404", "0.5.21", "present", "present", "fine"),
        Cell("41404", "0.5.24", "error", "present", "probe error: boom"),
    ]
    t = ContainmentTable(fixes=fixes, releases=releases, cells=cells)
    t.regressions = find_regressions(fixes, ["0.5.21", "0.5.24"], cells)
    return t


def test_markdown_json_junit_put_regressions_first(tmp_path: Path) -> None:
    t = _table()
    assert t.exit_code == 1 and len(t.regressions) == 1
    md = render_markdown(t)
    assert md.index("## Regressions (1)") < md.index("## New releases") < md.index("| fix |")
    assert "0.5.24 (new)" in md and "partial ⚠ regression (expected present)" in md
    write_files(tmp_path, t, {"environments": []})
    doc = json.loads((tmp_path / "contains.json").read_text())
    assert doc["regressions"][0]["lost_in"] == "0.5.24" and doc["new_releases"] == ["0.5.24"]
    assert doc["exit_code"] == 1 and doc["agrees"] is False
    cases = {(c.classname, c.name): c for suite in JUnitXml.fromfile(str(tmp_path / "junit.xml")) for c in suite}
    assert len(cases) == 4
    assert cases[("contains.38935", "0.5.24")].result[0].type == "regression"
    assert cases[("contains.41404", "0.5.24")].result[0]._tag == "error"
    assert cases[("contains.38935", "0.5.21")].is_passed


def test_html_is_self_contained_and_escapes_reasons() -> None:
    page = render_html(_table(), {"started": "2026-12-01T00:00:00Z", "exit_code": 1})
    assert "<script>alert(1)</script>" not in page and "&lt;script&gt;" in page
    assert not re.search(r"(src|href)=\"(https?:)?//", page)  # nothing fetched from anywhere
    assert 'href="observations/38935/0.5.21/pr38935_prefill_door.json"' in page
    assert 'id="cell-38935-0.5.24" class="cell v-partial regression"' in page
