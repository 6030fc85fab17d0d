"""The release watch end to end: a local package index serves the real 0.5.23 wheel and a fake
later release -- 0.5.23 repacked as 0.5.24 with #38935's prefill-door check reverted (the
matrix's own reverting mutation). ``difflab releases --lock`` pins both from the index pip is
configured with; ``difflab contains --all`` runs every fix's real probes on both, finds the
regression, lists it first and exits 1; the sealed folder verifies; a re-uploaded wheel is
refused; and the HTML grid is checked in real headless Chromium the way a person reads it.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from filelock import FileLock
from junitparser import JUnitXml

from difflab.cli import main
from difflab.environment.plan import load_needs
from difflab.environment.shared import SharedEnvironment
from difflab.matrix import Fix, load_matrix
from difflab.observation import Observation
from difflab.paths import cache_root, default_matrix
from difflab.source.release import ReleaseSource
from difflab.source.release_lock import load_lock
from difflab.workflows.contains import ContainsRequest
from difflab.workflows.contains import execute as contains
from fake_index import pip_env, repack_release, serve, sha256, write_project_page
from release_map import Carried, load_release_map

pytestmark = [pytest.mark.sglang, pytest.mark.xdist_group("release")]

REAL, FAKE = "0.5.23", "0.5.24"
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)


@dataclass
class Watch:
    lock: Path
    run: Path
    lock_rc: int
    lock_out: str
    rc: int
    out: str
    real: Path
    fake: Path
    index: Path
    url: str
    env: dict[str, str]


def carried_verdict(fix: Fix, carried: Carried, release: str) -> str:
    """What ``contains`` must read for a fix on a release the release map places it on.

    A fix older than every pin that no probe judges is ``not-judged`` on every release: the map says each
    release carries it, but the lab has not seen it, so the cell must not read ``present``.
    """
    if not fix.probes and fix.base.unavailable:
        return "not-judged"
    return "present" if carried.carried_on(release) else "absent"


def _run(argv: list[str]) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(argv)
    return rc, out.getvalue() + err.getvalue()


def _forget(cache: Path, wheel: Path, sha: str) -> None:
    """Drop the fake release from the shared cache (it is fetched through the index each time)."""
    cached = cache / "wheels" / wheel.name
    if cached.is_file() and sha256(cached) == sha:
        cached.unlink()
    shutil.rmtree(cache / "sources" / "release" / f"{FAKE}-{sha[:12]}", ignore_errors=True)


@pytest.fixture(scope="module")
def watch(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Watch]:
    matrix = load_matrix(default_matrix())
    cache = cache_root()
    tmp = tmp_path_factory.mktemp("watch")
    with FileLock(str(cache / "test-fake-release.lock")), pytest.MonkeyPatch.context() as mp:
        real = ReleaseSource(matrix.releases).wheel(REAL)
        revert = next(m for m in matrix.fix("38935").mutations if m.name == "drop-prefill-door-guard")
        (tmp / "files").mkdir()
        fake = repack_release(real, FAKE, {revert.file: (revert.find, revert.replace)}, tmp / "files")
        fake_sha = sha256(fake)
        _forget(cache, fake, fake_sha)
        index = tmp / "simple"
        write_project_page(index, "sglang", [real, fake])
        mp.setenv("DIFFLAB_CONFIG", str(tmp / "config"))  # the run's signing key stays in the test
        try:
            with serve(index) as (url, _):
                env = pip_env(f"{url}/")
                for key, value in env.items():
                    mp.setenv(key, value)
                lock = tmp / "releases.lock"
                lock_rc, lock_out = _run(["releases", "--lock", "--since", REAL, "--lock-file", str(lock)])
                run = tmp / "run"
                rc, out = _run(["contains", "--all", "--lock-file", str(lock), "--out", str(run)])
                yield Watch(lock, run, lock_rc, lock_out, rc, out, real, fake, index, url, env)
        finally:
            _forget(cache, fake, fake_sha)


def test_the_index_pip_uses_gives_both_releases_and_the_lock_pins_them(watch: Watch) -> None:
    assert watch.lock_rc == 0, watch.lock_out
    lock = load_lock(watch.lock)
    assert lock.versions == [REAL, FAKE]
    assert lock.releases[REAL].sha256 == load_matrix(default_matrix()).releases[REAL].sha256
    assert lock.releases[FAKE].sha256 == sha256(watch.fake)
    assert f"new: {FAKE} pinned" in watch.lock_out


def test_the_reverted_fix_is_a_regression_listed_first_and_the_run_fails(watch: Watch) -> None:
    assert watch.rc == 1, watch.out
    doc = json.loads((watch.run / "contains.json").read_text())
    cells = {(c["fix"], c["release"]): c for c in doc["cells"]}
    assert [(r["fix"], r["present_in"], r["lost_in"], r["verdict"]) for r in doc["regressions"]] == [
        ("38935", REAL, FAKE, "partial")
    ]
    lost = cells[("38935", FAKE)]
    assert lost["regression"] and "prefill-door" in lost["reason"] and "decode-door" in lost["reason"]
    # every other fix behaves on the fake exactly as on the release it was made from, as the release map says
    carried = load_release_map()
    for fix in (f for f in load_matrix(default_matrix()).fixes if f.id != "38935"):
        assert cells[(fix.id, FAKE)]["verdict"] == cells[(fix.id, REAL)]["verdict"], fix.id
        assert cells[(fix.id, REAL)]["verdict"] == carried_verdict(fix, carried[fix.id], REAL), fix.id
    assert doc["new_releases"] == [FAKE] and doc["releases"][1]["first_seen"]
    first = watch.out.strip().splitlines()
    assert any(line.startswith("REGRESSION #38935 present in 0.5.23, partial in 0.5.24") for line in first)
    assert watch.out.index("REGRESSION") < watch.out.index("which release carries which fix")
    md = (watch.run / "contains.md").read_text()
    assert md.index("## Regressions (1)") < md.index("| fix |")
    observation = json.loads((watch.run / lost["probes"]["pr38935_prefill_door"]["observation"]).read_text())
    assert observation["sglang_version"] == FAKE and observation["source"]["sha256"] == sha256(watch.fake)


def test_junit_has_a_case_per_fix_and_release_and_the_folder_is_sealed(watch: Watch, matrix) -> None:
    cases = {(c.classname, c.name): c for suite in JUnitXml.fromfile(str(watch.run / "junit.xml")) for c in suite}
    assert len(cases) == len(matrix.fixes) * 2
    assert cases[("contains.38935", FAKE)].result[0].type == "regression"
    # a fix no probe judges is skipped, never a passed case: a green JUnit must not read as checked
    unjudged = {f"contains.{f.id}" for f in matrix.fixes if not f.probes}
    others = {key: c for key, c in cases.items() if key != ("contains.38935", FAKE)}
    assert all(c.is_skipped for (fix, _), c in others.items() if fix in unjudged)
    assert all(c.is_passed for (fix, _), c in others.items() if fix not in unjudged)
    run = json.loads((watch.run / "run.json").read_text())
    assert run["command"] == "contains" and run["exit_code"] == 1 and set(run["sources"]) == {REAL, FAKE}
    env = json.loads((watch.run / "environment.json").read_text())
    assert [e["releases"] for e in env["environments"]] == [[REAL, FAKE]]
    assert (watch.run / "releases.lock").read_bytes() == watch.lock.read_bytes()
    fingerprint = (watch.run / "keys" / "signing-key.fingerprint").read_text().strip()
    rc, out = _run(["verify", str(watch.run), "--fingerprint", fingerprint])
    assert rc == 0, out


def test_a_reuploaded_wheel_is_refused_naming_old_and_new_hash(watch: Watch, monkeypatch: pytest.MonkeyPatch) -> None:
    reuploaded = watch.index.parent / "reuploaded" / watch.fake.name
    reuploaded.parent.mkdir()
    shutil.copyfile(watch.fake, reuploaded)
    with reuploaded.open("ab") as fh:  # the same file name, other bytes
        fh.write(b"\0")
    old, new = sha256(watch.fake), sha256(reuploaded)
    index = watch.index.parent / "simple-reuploaded"
    write_project_page(index, "sglang", [watch.real, reuploaded])
    before = watch.lock.read_bytes()
    with serve(index) as (url, _):
        for key, value in (watch.env | {"PIP_INDEX_URL": f"{url}/"}).items():
            monkeypatch.setenv(key, value)
        rc, out = _run(["releases", "--lock", "--since", REAL, "--lock-file", str(watch.lock)])
    assert rc == 2, out
    assert FAKE in out and old in out and new in out
    assert watch.lock.read_bytes() == before


# -- what a person sees --------------------------------------------------------------
@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory):
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not binary or not driver:
        pytest.skip("headless Chromium is absent (Debian packages chromium, chromium-driver; .ci/run installs them)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={tmp_path_factory.mktemp('chromium')}", "--window-size=1400,1000"):
        options.add_argument(flag)
    chrome = webdriver.Chrome(service=Service(executable_path=driver), options=options)
    try:
        yield chrome
    finally:
        chrome.quit()


def test_the_html_grid_shows_every_release_fix_regression_and_working_links(watch: Watch, browser) -> None:
    from selenium.webdriver.common.by import By

    page = (watch.run / "contains.html").resolve().as_uri()
    browser.get(page)
    heads = [th.text for th in browser.find_elements(By.CSS_SELECTOR, "#grid thead th.release")]
    assert [h.split()[0] for h in heads] == [REAL, FAKE]
    assert "NEW" in heads[1].upper() and "NEW" not in heads[0].upper()
    matrix = load_matrix(default_matrix())
    rows = [th.text.splitlines()[0] for th in browser.find_elements(By.CSS_SELECTOR, "#grid tbody th.fix")]
    assert rows == [f.label for f in matrix.fixes]

    banner = browser.find_element(By.ID, "regressions")
    assert banner.is_displayed() and "#38935: present in 0.5.23, partial in 0.5.24" in banner.text
    marked = browser.find_elements(By.CSS_SELECTOR, "td.cell.regression")
    assert [c.get_attribute("id") for c in marked] == [f"cell-38935-{FAKE}"]
    cell = marked[0]
    assert cell.is_displayed() and "regression" in cell.text and "partial" in cell.text
    colours = {
        c.get_attribute("data-verdict"): c.value_of_css_property("background-color")
        for c in browser.find_elements(By.CSS_SELECTOR, "td.cell")
    }
    assert {"present", "absent", "partial"} <= set(colours)
    assert len({colours["present"], colours["absent"], colours["partial"]}) == 3  # a colour per verdict

    links = {
        a.get_attribute("href"): a.find_element(By.XPATH, "./ancestor::td").get_attribute("id")
        for a in browser.find_elements(By.CSS_SELECTOR, "td.cell a")
    }
    assert len(links) == sum(len(f.probes) for f in matrix.fixes) * 2
    for href, cell_id in links.items():
        browser.get(href)
        shown = json.loads(browser.find_element(By.TAG_NAME, "body").text)
        fix, release = cell_id.removeprefix("cell-").rsplit("-", 1)  # a fix id may hold a dash: 41404-mori
        assert (shown["fix"], shown["side"]) == (fix, release), href
    browser.get(page)
    browser.find_element(By.ID, f"cell-38935-{FAKE}").find_element(By.CSS_SELECTOR, "a.verdict").click()
    assert browser.current_url.endswith(f"observations/38935/{FAKE}/pr38935_prefill_door.json")
    assert json.loads(browser.find_element(By.TAG_NAME, "body").text)["sglang_version"] == FAKE


# -- releases that need other pins -----------------------------------------------------
@dataclass
class _ReadyEnvironment(SharedEnvironment):
    """An environment the test declares built: planning and routing are under test, not pip."""

    def ensure(self, progress: object = None) -> _ReadyEnvironment:
        return self

    def document(self) -> dict[str, object]:
        return {"digest": self.digest, "pins": list(self.pins), "python_version": "3.11"}


@dataclass
class _RecordingRunner:
    """Answers every job as not applicable, noting which environment it ran in."""

    environment: SharedEnvironment
    seen: list[tuple[str, str]]
    name: str = "recording"

    def describe(self) -> dict[str, object]:
        return {"name": self.name, "environment": self.environment.digest}

    def run(self, jobs, on_done=None):
        out = []
        for job in jobs:
            self.seen.append((job.source.label, self.environment.digest))
            obs = Observation(
                fix=job.fix_id,
                probe=job.probe,
                side=job.side,
                source=job.source.identity,
                status="n/a",
                error=f"not applicable: ran in {self.environment.digest[:12]}",
            )
            if on_done:
                on_done(obs)
            out.append(obs)
        return out


def test_releases_that_need_other_pins_get_the_fewest_environments(tmp_path: Path) -> None:
    needs_file = tmp_path / "needs.toml"
    needs_file.write_text(
        'schema = 1\n[[needs]]\nreleases = ">=0.5.22"\nrequires = ["orjson<3.13"]\npins = ["orjson==3.12.0"]\n'
        '[[needs]]\nreleases = ">=0.5.23"\nrequires = ["orjson>=3.11"]\npins = ["orjson==3.12.0"]\n'
    )
    seen: list[tuple[str, str]] = []
    req = ContainsRequest(all_releases=True, fixes=["38935"], out=tmp_path / "run", bundle=False)
    outcome = contains(
        req,
        needs=load_needs(needs_file),
        environments=lambda pins: _ReadyEnvironment(pins=pins),
        runners=lambda env: _RecordingRunner(env, seen),
    )
    shared, pinned = _ReadyEnvironment().digest, _ReadyEnvironment(pins=("orjson==3.12.0",)).digest
    assert [(p.pins, p.releases) for p in outcome.environments] == [
        ((), ("0.5.19", "0.5.20", "0.5.21")),
        (("orjson==3.12.0",), ("0.5.22", "0.5.23")),
    ]
    ran = dict(seen)
    assert ran == {"0.5.19": shared, "0.5.20": shared, "0.5.21": shared, "0.5.22": pinned, "0.5.23": pinned}
    env = json.loads((outcome.out_dir / "environment.json").read_text())
    assert [(e["digest"], e["pins"], e["releases"]) for e in env["environments"]] == [
        (shared, [], ["0.5.19", "0.5.20", "0.5.21"]),
        (pinned, ["orjson==3.12.0"], ["0.5.22", "0.5.23"]),
    ]
    doc = json.loads((outcome.out_dir / "contains.json").read_text())
    assert {r["version"]: r["environment"] for r in doc["releases"]}["0.5.23"] == pinned
    assert {c["verdict"] for c in doc["cells"]} == {"not-applicable"}
