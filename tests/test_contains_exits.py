"""``difflab contains`` on releases of the tiny tree: which cells and regressions it reports, how it exits.

The releases are wheels of :mod:`workflow_tree`'s three-file package (``door_wheel``: the bug, the fix, a
fork's port), pinned by sha256 and found in the lab's wheel cache, so the real release back end checks and
unpacks them and the real runner (``--backend subprocess``) probes each in well under a second. A release
that lost the fix beside ones that carry it, releases chosen by ``--release``/``--since``/``--all`` and a
release lock, and two planned environments show whether the table reports the right cells, the run folder
records what ran where, and the exit code asks "any regression, error or contradiction" rather than "all".
"""

from __future__ import annotations

import hashlib
import io
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from junitparser import JUnitXml
from rich.console import Console

from difflab.cli import main
from difflab.environment.plan import load_needs, pin_versions
from difflab.environment.shared import SharedEnvironment, pinned_texts
from difflab.errors import ConfigError
from difflab.matrix import load_matrix
from difflab.progress import Reporter
from difflab.runner import build_runner
from difflab.runner.base import Runner
from difflab.workflows import contains as contains_workflow
from workflow_tree import (
    BASE_DOOR,
    DOOR_TESTS_FILE,
    FORK_DOOR,
    HEAD_DOOR,
    door_wheel,
    fix_entry,
    release_table,
    with_upstream_tests,
    write_door_tests,
    write_probes,
)

FAST = ["--backend", "subprocess", "--no-cache", "--no-bundle"]
LOST = {"0.5.20": BASE_DOOR, "0.5.21": HEAD_DOOR, "0.5.22": BASE_DOOR}
"""The fix's base, its head, then a release that lost it again."""
KEPT = {"0.5.20": BASE_DOOR, "0.5.21": HEAD_DOOR, "0.5.22": FORK_DOOR}
"""The fix's base, its head, then a release that carries it in other words."""
FAMILY = '\n[families.door-safety]\ntitle = "door safety"\n'


@pytest.fixture(autouse=True)
def tiny_probes(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DIFFLAB_PROBES", str(write_probes(tmp_path_factory.getbasetemp() / "tiny-probes")))


def door_fix(fix_id: str = "1", *, probe: str = "tiny_door", family: bool = False) -> str:
    """A fix of the door, base 0.5.20 and head 0.5.21 (its commits left out: releases need none)."""
    entry = fix_entry(fix_id, "", "", probe=probe, pinned=False)
    return entry.replace('title = "door', 'family = "door-safety"\ntitle = "door', 1) if family else entry


def matrix(tmp_path: Path, doors: dict[str, str], *entries: str, families: str = "") -> Path:
    path = tmp_path / "matrix" / "upstream.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(release_table(doors) + families + "".join(entries or (door_fix(),)))
    return path


def contains(matrix_path: Path, out: Path, *extra: str) -> int:
    return main(["contains", "--matrix", str(matrix_path), "--out", str(out), *FAST, *extra])


def read(out: Path, name: str) -> Any:
    return json.loads((out / name).read_text())


def verdicts(out: Path) -> dict[tuple[str, str], str]:
    return {(c["fix"], c["release"]): c["verdict"] for c in read(out, "contains.json")["cells"]}


def pins_of(matrix_path: Path) -> dict[str, tuple[str, str]]:
    return {v: (p.file, p.sha256) for v, p in load_matrix(matrix_path).releases.items()}


# -- the table, the regressions and the exit code -------------------------------------------------------------
def test_a_release_that_lost_the_fix_is_a_regression_and_exits_one(tmp_path: Path) -> None:
    m = matrix(tmp_path, LOST)
    out = tmp_path / "out"
    assert contains(m, out) == 1
    assert verdicts(out) == {("1", "0.5.20"): "absent", ("1", "0.5.21"): "present", ("1", "0.5.22"): "absent"}
    doc = read(out, "contains.json")
    assert [(r["fix"], r["present_in"], r["lost_in"], r["verdict"]) for r in doc["regressions"]] == [
        ("1", "0.5.21", "0.5.22", "absent")
    ]
    assert [c["regression"] for c in doc["cells"]] == [False, False, True]
    assert doc["exit_code"] == 1 and doc["agrees"] is False
    record = read(out, "run.json")
    assert record["command"] == "contains" and record["exit_code"] == 1 and record["regressions"] == 1
    assert "## Regressions (1)" in (out / "contains.md").read_text()
    assert f"Run {record['started_at']}, exit code 1." in (out / "contains.html").read_text()
    cases = {c.name: c for suite in JUnitXml.fromfile(str(out / "junit.xml")) for c in suite}
    assert cases["0.5.22"].result[0].type == "regression" and cases["0.5.21"].is_passed


def test_every_release_carrying_the_fix_exits_zero_and_records_what_ran(tmp_path: Path) -> None:
    m = matrix(tmp_path, KEPT)
    out = tmp_path / "out"
    assert contains(m, out) == 0
    assert verdicts(out) == {("1", "0.5.20"): "absent", ("1", "0.5.21"): "present", ("1", "0.5.22"): "present"}
    doc = read(out, "contains.json")
    assert doc["regressions"] == [] and doc["exit_code"] == 0 and doc["agrees"] is True
    assert doc["lock"] is None and "releases.lock" not in {p.name for p in out.iterdir()}
    pins = pins_of(m)
    env = read(out, "environment.json")
    columns = [(r["version"], r["file"], r["sha256"], r["new"], r["environment"]) for r in doc["releases"]]
    assert columns == [(v, f, s, False, env["digest"]) for v, (f, s) in pins.items()]
    assert [r["prerelease"] for r in doc["releases"]] == [False] * 3
    assert doc["environments"] == [{"digest": env["digest"], "pins": [], "releases": list(pins)}]
    assert env["environments"] == [{k: v for k, v in env.items() if k != "environments"} | {"releases": list(pins)}]
    record = read(out, "run.json")
    assert record["exit_code"] == 0 and record["regressions"] == 0 and record["source_kind"] == "release"
    assert record["releases"] == list(pins) and record["new_releases"] == [] and record["lock"] is None
    assert record["environment_digest"] == env["digest"] and record["probes"]["origin"] == "DIFFLAB_PROBES"
    assert record["runner"]["name"] == "subprocess" and record["runners"] == [record["runner"]]
    assert record["runner"]["environment"] == env["digest"]
    assert {v: (s["version"], s["file"], s["sha256"]) for v, s in record["sources"].items()} == {
        v: (v, f, s) for v, (f, s) in pins.items()
    }
    for cell in doc["cells"]:
        (probe,) = cell["probes"].values()
        assert probe["observation"] == f"observations/1/{cell['release']}/tiny_door.json"
        assert read(out, probe["observation"])["source"]["version"] == cell["release"]
    page = (out / "contains.html").read_text()
    assert 'href="observations/1/0.5.22/tiny_door.json"' in page and ", exit code 0." in page


def test_an_errored_probe_fails_the_run_though_no_release_lost_a_fix(tmp_path: Path) -> None:
    """Fix 2's probe imports a module the tree lacks: an error cell, so exit 1 beside fix 1's clean row."""
    m = matrix(tmp_path, KEPT, door_fix("1"), door_fix("2", probe="tiny_broken"))
    out = tmp_path / "out"
    assert contains(m, out) == 1
    found = verdicts(out)
    assert {r: found[("1", r)] for r in KEPT} == {"0.5.20": "absent", "0.5.21": "present", "0.5.22": "present"}
    assert {found[("2", r)] for r in KEPT} == {"error"}
    doc = read(out, "contains.json")
    assert doc["regressions"] == [] and doc["exit_code"] == 1 and read(out, "run.json")["exit_code"] == 1
    assert [f["id"] for f in doc["fixes"]] == ["1", "2"]


def test_a_release_contradicting_the_matrix_fails_the_run_without_a_regression(tmp_path: Path) -> None:
    """The fix's head release ships the bug: absent where the matrix says present, nothing lost after a present."""
    m = matrix(tmp_path, {"0.5.20": BASE_DOOR, "0.5.21": BASE_DOOR})
    out = tmp_path / "out"
    assert contains(m, out) == 1
    doc = read(out, "contains.json")
    assert doc["regressions"] == [] and doc["agrees"] is False and doc["exit_code"] == 1
    (late,) = [c for c in doc["cells"] if c["release"] == "0.5.21"]
    assert (late["verdict"], late["expected"], late["agrees"]) == ("absent", "present", False)


# -- which releases ------------------------------------------------------------------------------------------
def test_chosen_releases_are_judged_in_release_order_and_only_those(tmp_path: Path) -> None:
    m = matrix(tmp_path, LOST)
    out = tmp_path / "out"
    assert contains(m, out, "--release", "0.5.22", "--release", "0.5.21") == 1
    assert [r["version"] for r in read(out, "contains.json")["releases"]] == ["0.5.21", "0.5.22"]
    assert verdicts(out) == {("1", "0.5.21"): "present", ("1", "0.5.22"): "absent"}
    assert sorted(read(out, "run.json")["sources"]) == ["0.5.21", "0.5.22"]
    assert sorted(p.name for p in (out / "observations" / "1").iterdir()) == ["0.5.21", "0.5.22"]


def test_since_keeps_the_floor_release_and_every_later_one(tmp_path: Path) -> None:
    m = matrix(tmp_path, KEPT)
    out = tmp_path / "out"
    assert contains(m, out, "--since", "0.5.21") == 0
    assert read(out, "run.json")["releases"] == ["0.5.21", "0.5.22"]


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--release", "0.5.99", "--release", "0.5.21"], "release(s) ['0.5.99'] are not pinned in {m} [releases]"),
        (["--since", "0.6"], "no release to check in {m} [releases] from 0.6"),
        (["--since", "0.5.22", "--release", "0.5.21"], "release(s) ['0.5.21'] are not pinned in {m} [releases]"),
    ],
)
def test_a_release_that_is_not_there_is_refused_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], says: str
) -> None:
    m = matrix(tmp_path, KEPT)
    out = tmp_path / "out"
    assert contains(m, out, *extra) == 2
    assert says.format(m=m) in capsys.readouterr().err
    assert not out.exists()


def test_all_on_an_empty_lock_is_refused_naming_the_lock(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    m = matrix(tmp_path, KEPT)
    lock = tmp_path / "releases.lock"
    lock.write_text('schema = 1\npackage = "sglang"\n')
    out = tmp_path / "out"
    assert contains(m, out, "--all", "--lock-file", str(lock)) == 2
    err = capsys.readouterr().err
    assert f"no release to check in {lock} (run `difflab releases --lock` to pin new releases)\n" in err
    assert not out.exists()


def test_a_pre_release_pinned_in_the_matrix_is_marked_from_its_version(tmp_path: Path) -> None:
    m = matrix(tmp_path, {"0.5.21": HEAD_DOOR, "0.5.22rc1": FORK_DOOR, "0.5.20": BASE_DOOR})
    out = tmp_path / "out"
    assert contains(m, out) == 0
    releases = read(out, "contains.json")["releases"]
    assert [(r["version"], r["prerelease"]) for r in releases] == [
        ("0.5.20", False),
        ("0.5.21", False),
        ("0.5.22rc1", True),
    ]
    assert [(r["first_seen"], r["yanked"]) for r in releases] == [(None, None)] * 3


def _lock(tmp_path: Path, m: Path, extra: dict[str, str], **fields: str) -> Path:
    """A release lock holding the matrix's pins and, after them, the wheels of ``extra`` ({version: door})."""
    entries = "".join(
        f'[releases."{v}"]\nfile = "{f}"\nsha256 = "{s}"\nfirst_seen = "2026-11-0{i + 1}"\n'
        for i, (v, (f, s)) in enumerate(pins_of(m).items())
    )
    for version, door in extra.items():
        file, sha = door_wheel(version, door)
        more = "".join(
            f'{k} = "{v}"\n' if isinstance(v, str) else f"{k} = {str(v).lower()}\n" for k, v in fields.items()
        )
        entries += f'[releases."{version}"]\nfile = "{file}"\nsha256 = "{sha}"\nfirst_seen = "2026-12-01"\n{more}'
    lock = tmp_path / "lock" / "releases.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    lock.write_text(f'schema = 1\npackage = "sglang"\n{entries}')
    return lock


def test_all_judges_every_locked_release_and_marks_the_new_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    m = matrix(tmp_path, KEPT)
    lock = _lock(tmp_path, m, {"0.5.23": BASE_DOOR}, yanked="broken build")
    out = tmp_path / "out"
    assert contains(m, out, "--all", "--lock-file", str(lock)) == 1
    said = capsys.readouterr()
    assert "new release 0.5.23: not pinned in the matrix" in said.out + said.err
    assert "new release 0.5.22" not in said.out + said.err
    doc = read(out, "contains.json")
    columns = {r["version"]: (r["new"], r["first_seen"], r["yanked"]) for r in doc["releases"]}
    assert columns == {
        "0.5.20": (False, "2026-11-01", None),
        "0.5.21": (False, "2026-11-02", None),
        "0.5.22": (False, "2026-11-03", None),
        "0.5.23": (True, "2026-12-01", "broken build"),
    }
    assert doc["new_releases"] == ["0.5.23"] and read(out, "run.json")["new_releases"] == ["0.5.23"]
    assert [(r["present_in"], r["lost_in"]) for r in doc["regressions"]] == [("0.5.22", "0.5.23")]
    assert (out / "releases.lock").read_bytes() == lock.read_bytes()
    reference = doc["lock"]
    assert reference["copy"] == "releases.lock" and reference["sha256"] == hashlib.sha256(lock.read_bytes()).hexdigest()
    assert read(out, "run.json")["lock"] == reference


def test_all_with_since_takes_the_locked_prerelease_flag(tmp_path: Path) -> None:
    m = matrix(tmp_path, KEPT)
    lock = _lock(tmp_path, m, {"0.5.23": FORK_DOOR}, prerelease=True)  # the lock's word, not the version's
    out = tmp_path / "out"
    assert contains(m, out, "--all", "--lock-file", str(lock), "--since", "0.5.22") == 0
    releases = read(out, "contains.json")["releases"]
    assert [(r["version"], r["new"], r["prerelease"]) for r in releases] == [
        ("0.5.22", False, False),
        ("0.5.23", True, True),
    ]


def test_all_without_a_lock_is_refused_naming_the_missing_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    m = matrix(tmp_path, KEPT)
    missing = tmp_path / "nowhere" / "releases.lock"
    out = tmp_path / "out"
    assert contains(m, out, "--all", "--lock-file", str(missing)) == 2
    assert f"{missing}: no release lock; run `difflab releases --lock` first" in capsys.readouterr().err
    assert not out.exists()


def test_all_refuses_a_release_the_lock_does_not_hold_naming_the_lock(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    m = matrix(tmp_path, KEPT)
    lock = _lock(tmp_path, m, {})
    out = tmp_path / "out"
    assert contains(m, out, "--all", "--lock-file", str(lock), "--release", "0.5.30") == 2
    err = capsys.readouterr().err
    assert f"release(s) ['0.5.30'] are not pinned in {lock} (run `difflab releases --lock`" in err
    assert not out.exists()


# -- what is refused before it runs --------------------------------------------------------------------------
def test_contains_refuses_a_source_other_than_releases(tmp_path: Path) -> None:
    req = contains_workflow.ContainsRequest(matrix=matrix(tmp_path, KEPT), source_kind="git", out=tmp_path / "o")
    with pytest.raises(ConfigError) as caught:
        contains_workflow.execute(req)
    assert str(caught.value) == "contains judges releases; --source git does not apply"
    assert not (tmp_path / "o").exists()


def test_a_missing_upstream_tests_folder_is_refused_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    m = matrix(tmp_path, KEPT)
    out = tmp_path / "out"
    assert contains(m, out, "--upstream-tests", str(tmp_path / "no-tests")) == 2
    assert str(tmp_path / "no-tests") in capsys.readouterr().err and not out.exists()


def test_without_out_the_run_goes_to_a_stamped_folder_under_the_results(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    m = matrix(tmp_path, KEPT)
    monkeypatch.chdir(tmp_path)
    assert main(["contains", "--matrix", str(m), *FAST, "--release", "0.5.21"]) == 0
    (folder,) = (tmp_path / "results").iterdir()
    assert re.fullmatch(r"contains-\d{8}T\d{6}Z", folder.name)
    assert verdicts(folder) == {("1", "0.5.21"): "present"}
    assert re.fullmatch(r"contains-\d{8}T\d{6}Z", contains_workflow.default_out().name)
    assert contains_workflow.default_out().parent == tmp_path / "results"


# -- SGLang's own tests and the family ------------------------------------------------------------------------
def test_the_fixes_own_tests_are_replayed_beside_each_cell(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The valid request's test passes on every release: it agrees with present and contradicts absent."""
    m = matrix(tmp_path, KEPT, with_upstream_tests(door_fix(), "test_a_valid_request_is_admitted"))
    folder = write_door_tests(tmp_path / "sglang-tests")
    out = tmp_path / "out"
    assert contains(m, out, "--upstream-tests", str(folder)) == 0  # a note beside the verdict, not a failure
    cells = {c["release"]: c for c in read(out, "contains.json")["cells"]}
    assert {r: c["upstream"]["agrees"] for r, c in cells.items()} == {"0.5.20": False, "0.5.21": True, "0.5.22": True}
    flag = "SGLang's tests disagree: test_a_valid_request_is_admitted passes here"
    assert cells["0.5.20"]["reason"].endswith(f"; {flag}")
    assert not any("disagree" in cells[r]["reason"] for r in ("0.5.21", "0.5.22"))
    replayed = read(out, "upstream-tests.json")
    (replay,) = replayed["fixes"]
    assert replayed["tests_dir"] == str(folder) and sorted(replay["sides"]) == list(KEPT)
    assert [f["file"] for f in replay["files"]] == [DOOR_TESTS_FILE]
    said = capsys.readouterr()
    assert all(f"upstream tests on {r}: 2 test(s)" in said.out + said.err for r in KEPT)
    assert "## SGLang's own tests" in (out / "contains.md").read_text()


def test_the_family_is_answered_per_release_from_its_cells(tmp_path: Path) -> None:
    m = matrix(tmp_path, LOST, door_fix(family=True), families=FAMILY)
    out = tmp_path / "out"
    assert contains(m, out) == 1
    (family,) = read(out, "family.json")["families"]
    assert family["family"] == "door-safety"
    assert {b["build"]: b["safe"] for b in family["builds"]} == {"0.5.20": False, "0.5.21": True, "0.5.22": False}
    members = {b["build"]: [(x["fix"], x["verdict"]) for x in b["members"]] for b in family["builds"]}
    assert members == {"0.5.20": [("1", "absent")], "0.5.21": [("1", "present")], "0.5.22": [("1", "absent")]}
    assert sorted(read(out, "family.json")["defaults"]) == list(LOST)
    text = (out / "contains.md").read_text()
    assert "## Family `door-safety`" in text and "### Configuration-only defences: 0.5.22's defaults" in text


# -- two environments ------------------------------------------------------------------------------------------
class _Alias(SharedEnvironment):
    """A planned environment (its own pins and digest) that runs in the shared one already built here."""

    ensured: list[Any]

    @property
    def path(self) -> Path:
        return SharedEnvironment().path

    def ensure(self, progress: Any = None) -> SharedEnvironment:
        self.ensured.append(progress)
        return super().ensure(progress)


class _Closing:
    """The real runner, remembering that it was closed."""

    def __init__(self, inner: Runner, closed: list[str]) -> None:
        self.wrapped = inner
        self.closed = closed

    def __getattr__(self, name: str) -> Any:
        return getattr(self.wrapped, name)

    def close(self) -> None:
        self.closed.append(self.wrapped.environment.digest)


@pytest.fixture
def two_plans(tmp_path: Path) -> Iterator[tuple[Path, Any]]:
    needs = tmp_path / "needs.toml"
    needs.write_text(
        'schema = 1\n[[needs]]\nreleases = "<0.5.21"\nrequires = ["xgrammar<0.2"]\npins = ["xgrammar==0.1.0"]\n'
    )
    yield needs, load_needs(needs)


def test_releases_with_other_needs_run_in_their_own_environment(tmp_path: Path, two_plans: tuple[Path, Any]) -> None:
    _, needs = two_plans
    envs: list[_Alias] = []
    closed: list[str] = []

    def make_env(pins: tuple[str, ...]) -> SharedEnvironment:
        env = _Alias(pins=pins)
        env.ensured = []
        envs.append(env)
        return env

    def make_runner(env: SharedEnvironment) -> Runner:
        return _Closing(build_runner("subprocess", env, False), closed)  # type: ignore[return-value]

    out = tmp_path / "out"
    said = io.StringIO()
    req = contains_workflow.ContainsRequest(matrix=matrix(tmp_path, LOST), out=out, bundle=False, use_cache=False)
    outcome = contains_workflow.execute(
        req, Reporter(Console(file=said, width=400)), needs=needs, environments=make_env, runners=make_runner
    )
    assert outcome.exit_code == 1 and outcome.out_dir == out
    assert [(p.pins, p.releases) for p in outcome.environments] == [
        ((), ("0.5.21", "0.5.22")),
        (("xgrammar==0.1.0",), ("0.5.20",)),
    ]
    shared, pinned = envs[0].digest, envs[1].digest
    assert shared != pinned and [e.pins for e in envs] == [(), ("xgrammar==0.1.0",)]
    assert all(len(e.ensured) == 1 and e.ensured[0] is not None for e in envs)
    assert closed == [shared, pinned]  # each plan's runner closed once its releases ran
    doc = read(out, "contains.json")
    assert {r["version"]: r["environment"] for r in doc["releases"]} == {
        "0.5.20": pinned,
        "0.5.21": shared,
        "0.5.22": shared,
    }
    assert doc["environments"] == [
        {"digest": shared, "pins": [], "releases": ["0.5.21", "0.5.22"]},
        {"digest": pinned, "pins": ["xgrammar==0.1.0"], "releases": ["0.5.20"]},
    ]
    assert verdicts(out) == {("1", "0.5.20"): "absent", ("1", "0.5.21"): "present", ("1", "0.5.22"): "absent"}
    env = read(out, "environment.json")
    assert env["digest"] == shared and [e["digest"] for e in env["environments"]] == [shared, pinned]
    assert [e["releases"] for e in env["environments"]] == [["0.5.21", "0.5.22"], ["0.5.20"]]
    record = read(out, "run.json")
    assert record["environment_digest"] == shared and record["runner"]["environment"] == shared
    assert [r["environment"] for r in record["runners"]] == [shared, pinned]
    assert outcome.table.exit_code == 1 and len(outcome.table.regressions) == 1


def test_the_shared_pins_are_every_exact_pin_of_both_requirement_files() -> None:
    main_text, nodeps = pinned_texts()
    pins = contains_workflow.shared_pins()
    assert pins == pin_versions(main_text.splitlines()) | pin_versions(nodeps.splitlines())
    assert set(pin_versions(nodeps.splitlines())) <= set(pins) and set(pin_versions(main_text.splitlines())) <= set(
        pins
    )
    assert pin_versions(nodeps.splitlines()) and pin_versions(main_text.splitlines())


def _logged_environment(cache: Path, pins: tuple[str, ...], python: Path, log: Path) -> str:
    """A ready environment of ``pins`` under ``cache`` whose python logs each start to ``log``; its digest."""
    digest = SharedEnvironment(cache=cache, pins=pins).digest
    root = cache / "envs" / f"cpu-{digest[:16]}"
    (root / "bin").mkdir(parents=True)
    wrapper = root / "bin" / "python"
    wrapper.write_text(f'#!/bin/sh\necho "$*" >> "{log}"\nexec "{python}" "$@"\n')
    wrapper.chmod(0o755)
    (root / ".difflab-complete").write_text(digest + "\n")
    return digest


def test_every_release_and_its_own_tests_run_in_the_environment_planned_for_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every release needs other pins: two planned environments, the replay in the first; none in the shared one."""
    needs = tmp_path / "needs.toml"
    needs.write_text(
        'schema = 1\n[[needs]]\nreleases = "<0.5.21"\nrequires = ["xgrammar<0.2"]\npins = ["xgrammar==0.1.0"]\n'
        '[[needs]]\nreleases = ">=0.5.21"\nrequires = ["apache-tvm-ffi<0.1.5"]\npins = ["apache-tvm-ffi==0.1.0"]\n'
    )
    python = SharedEnvironment().python
    cache = tmp_path / "cache"
    monkeypatch.setenv("DIFFLAB_CACHE", str(cache))
    logs = {name: tmp_path / f"{name}.log" for name in ("shared", "xgrammar", "tvm")}
    digests = {
        "shared": _logged_environment(cache, (), python, logs["shared"]),
        "xgrammar": _logged_environment(cache, ("xgrammar==0.1.0",), python, logs["xgrammar"]),
        "tvm": _logged_environment(cache, ("apache-tvm-ffi==0.1.0",), python, logs["tvm"]),
    }
    m = matrix(tmp_path, KEPT, with_upstream_tests(door_fix(), "test_a_rejected_request_is_refused"))
    folder = write_door_tests(tmp_path / "sglang-tests")
    out = tmp_path / "out"
    said = io.StringIO()
    req = contains_workflow.ContainsRequest(
        matrix=m, out=out, bundle=False, use_cache=False, runner="subprocess", upstream_tests=folder
    )
    outcome = contains_workflow.execute(req, Reporter(Console(file=said, width=400)), needs=load_needs(needs))
    assert outcome.exit_code == 0
    doc = read(out, "contains.json")
    assert doc["environments"] == [
        {"digest": digests["tvm"], "pins": ["apache-tvm-ffi==0.1.0"], "releases": ["0.5.21", "0.5.22"]},
        {"digest": digests["xgrammar"], "pins": ["xgrammar==0.1.0"], "releases": ["0.5.20"]},
    ]
    assert {r["version"]: r["environment"] for r in doc["releases"]} == {
        "0.5.20": digests["xgrammar"],
        "0.5.21": digests["tvm"],
        "0.5.22": digests["tvm"],
    }
    started = {name: log.read_text() if log.exists() else "" for name, log in logs.items()}
    assert started["shared"] == ""
    assert started["xgrammar"].count("difflab.probe.child") == 1 and "upstream_child" not in started["xgrammar"]
    assert started["tvm"].count("difflab.probe.child") == 2 and started["tvm"].count("upstream_child") == 3
    assert {c["release"]: c["upstream"]["agrees"] for c in doc["cells"]} == dict.fromkeys(KEPT, True)
    text = said.getvalue()
    assert all(f"upstream tests on {r}: 2 test(s)" in text for r in KEPT)


HUNG_DOOR = '''def admit(req):
    """A release whose door never answers."""
    import time

    time.sleep(3600)
'''


def test_a_release_whose_probe_hangs_is_an_error_at_the_timeout(tmp_path: Path) -> None:
    m = matrix(tmp_path, {**KEPT, "0.5.23": HUNG_DOOR})
    out = tmp_path / "out"
    assert contains(m, out, "--release", "0.5.23", "--timeout", "1") == 1
    (cell,) = read(out, "contains.json")["cells"]
    assert cell["verdict"] == "error" and "probe hung: killed after 1 s" in cell["reason"]
    assert read(out, "observations/1/0.5.23/tiny_door.json")["status"] == "error"
