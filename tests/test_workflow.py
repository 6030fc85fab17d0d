"""The CI workflow: rendered by ci/gen_workflow.py and committed, matrices from nox, hardened, valid, JUnit merge."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from junitparser import Failure, JUnitXml, TestCase, TestSuite

from difflab.matrix import load_matrix
from difflab.paths import default_matrix

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW = ROOT / ".github" / "workflows" / "difflab.yml"
DEPENDABOT = ROOT / ".github" / "dependabot.yml"
BIN = Path(sys.executable).parent


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "ci" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    sys.modules[name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


gen = _load("gen_workflow")
merge_junit = _load("merge_junit")


@pytest.fixture(scope="module")
def sessions():
    return gen.nox_sessions()


FIX_IDS = tuple(f.id for f in load_matrix(default_matrix()).fixes)  # one CI cell per fix x side, from the matrix


@pytest.fixture(scope="module")
def doc():
    return yaml.safe_load(WORKFLOW.read_text())


def _tool(name: str) -> str:
    """A dev dependency's console script next to this Python (it is in the [dev] extra)."""
    found = shutil.which(name, path=str(BIN)) or shutil.which(name)
    assert found, f"{name} is not installed: pip install -e '.[dev]'"
    return found


# -- generated, and only from the tables and nox ----------------------------------------------------
def test_the_only_workflow_is_the_generated_one(sessions):
    workflows = sorted(p.relative_to(ROOT).as_posix() for p in ROOT.glob(".github/workflows/*"))
    assert workflows == [".github/workflows/difflab.yml"]
    assert not (ROOT / "ci" / "workflows").exists()
    assert WORKFLOW.read_text() == gen.render()  # committed == rendered
    assert gen.check(WORKFLOW, sessions) == []


@pytest.mark.inventory
def test_matrix_is_generated_from_every_nox_session(sessions):
    names = {s["name"] for s in sessions}
    assert {"lab", "side", "merge", "pack", "contains", "tests", "lint", "mutation"} <= names
    include = gen.matrix(sessions)["include"]
    cells = {c["session"] for c in include}
    # lab and merge do the cells' work in another shape, pack runs in the merge job; the nightly
    # sessions (throughput, mutation) are the nightly job's
    assert cells == {"contains", "tests", "lint"} | {
        f"side(fix='{f}', side='{s}')" for f in FIX_IDS for s in ("base", "head")
    }
    assert set(gen.NOT_CELLS) == {"lab", "merge", "pack", "throughput", "mutation", "wheel"}
    side = [c for c in include if c["name"] == "side"]
    assert len(side) == 2 * len(FIX_IDS)  # one cell per fix x side
    assert {(c["fix"], c["side"]) for c in side} == {(f, s) for f in FIX_IDS for s in ("base", "head")}
    assert len({c["slug"] for c in include}) == len(include)  # artifact names never collide
    tests = next(c for c in include if c["name"] == "tests")
    assert tests["posargs"] == "--junitxml=results/junit/tests.xml"


def test_nightly_sessions_never_become_push_cells(sessions):
    extra = [{"session": n, "name": n} for n in ("throughput", "mutation")]
    cells = {c["name"] for c in gen.matrix([*sessions, *extra])["include"]}
    assert not cells & {"throughput", "mutation", "lab", "merge", "pack"}
    assert {"tests", "lint", "side"} <= cells


def test_check_catches_a_stale_or_injecting_workflow(sessions, tmp_path: Path):
    stale = tmp_path / "w.yml"
    stale.write_text("jobs:\n  x:\n    steps:\n      - run: nox -s integration\n      - run: nox -s ${{ matrix.s }}\n")
    problems = gen.check(stale, sessions)
    assert any("nox -s integration: no such session" in p for p in problems)
    assert any("a template expanded into a script" in p for p in problems)
    assert any("fromJSON(needs.plan.outputs.matrix)" in p for p in problems)
    edited = tmp_path / "edited.yml"
    edited.write_text(gen.render().replace(gen.ACTIONS["checkout"].sha, "v4", 1))
    (problem,) = gen.check(edited, sessions)
    assert "differs from what ci/gen_workflow.py renders" in problem and "-      - uses: actions/checkout@v4" in problem


def test_workflow_names_only_existing_sessions(sessions):
    assert set(gen.referenced(WORKFLOW.read_text())) == {"$NOX_SESSION_NAME", "merge", "pack"}


# -- structure and hardening -----------------------------------------------------------------------
def test_triggers_jobs_and_gpu_opt_in(doc):
    assert set(doc[True]) == {"push", "pull_request", "schedule", "workflow_dispatch"}  # YAML 1.1 reads `on` as True
    jobs = doc["jobs"]
    assert list(jobs) == ["plan", "cpu", "merge", "sign", "gpu", "nightly", "dist", "publish", "report"]
    assert doc[True]["push"] == {"branches": ["main"], "tags": ["v*"]}
    assert jobs["cpu"]["strategy"]["matrix"] == "${{ fromJSON(needs.plan.outputs.matrix) }}"
    assert jobs["plan"]["outputs"]["matrix"] == "${{ steps.cpu.outputs.matrix }}"
    plan_runs = [s.get("run") for s in jobs["plan"]["steps"]]
    assert "python ci/gen_workflow.py matrix --github-output" in plan_runs
    assert "python ci/gen_workflow.py check" in plan_runs
    gpu = jobs["gpu"]
    assert gpu["runs-on"] == ["self-hosted", "linux", "gpu", "${{ matrix.gpu }}"]
    assert gpu["strategy"]["matrix"]["gpu"] == ["h100", "h200"]
    assert "vars.DIFFLAB_GPU_RUNNERS == 'true'" in gpu["if"] and "github.event_name != 'pull_request'" in gpu["if"]
    for name, job in jobs.items():
        if name != "gpu":
            assert job["runs-on"] == "ubuntu-latest", name  # only the opt-in GPU job is self-hosted
    assert set(jobs["report"]["needs"]) == {"cpu", "merge", "gpu", "nightly"}
    report_runs = " ".join(s.get("run", "") for s in jobs["report"]["steps"])
    assert "ci/merge_junit.py" in report_runs and "$GITHUB_STEP_SUMMARY" in report_runs


def test_least_privilege_and_pinned_actions(doc):
    assert doc["permissions"] == {}
    for name, job in doc["jobs"].items():
        want = {"contents": "read", "id-token": "write"} if name == "sign" else {"contents": "read"}
        if name == "publish":
            want = {"id-token": "write"}  # trusted publishing; it checks nothing out
        assert job["permissions"] == want, name
        for step in job["steps"]:
            assert "${{" not in step.get("run", ""), f"{name}: an expression expanded into a script"
            if step.get("uses", "").startswith("actions/checkout@"):
                assert step["with"]["persist-credentials"] is False, name
    uses = re.findall(r"uses: (\S+)@(\S+) # (v\d+\.\d+\.\d+)\n", WORKFLOW.read_text())
    assert len(uses) == WORKFLOW.read_text().count("uses: ")
    for repo, ref, version in uses:
        assert re.fullmatch(r"[0-9a-f]{40}", ref), f"{repo} pinned by {ref}"
        assert (repo, ref, version) in {(a.repo, a.sha, a.version) for a in gen.ACTIONS.values()}


def test_sign_job_signs_what_difflab_pack_wrote(doc):
    """merge seals, `nox -s pack` runs `difflab pack` into results/difflab-ci.tar.gz, sign signs exactly that."""
    noxfile = (ROOT / "noxfile.py").read_text()
    assert '"difflab", "pack", "results/ci-merged", "--output", "results/difflab-ci.tar.gz"' in noxfile
    merge, sign = doc["jobs"]["merge"], doc["jobs"]["sign"]
    assert [s["run"] for s in merge["steps"] if "nox -s" in s.get("run", "")] == [
        "python -m nox -s merge",
        "python -m nox -s pack",
    ]
    upload = next(s for s in merge["steps"] if s.get("uses", "").startswith("actions/upload-artifact@"))
    assert upload["with"]["name"] == "evidence"
    assert upload["with"]["path"].split() == ["results/difflab-ci.tar.gz", "results/ci-merged/junit.xml"]
    summary = next(s for s in merge["steps"] if "GITHUB_STEP_SUMMARY" in s.get("run", ""))
    assert "results/ci-merged/summary.md" in summary["run"]  # the verdict table
    download = next(s for s in sign["steps"] if s.get("uses", "").startswith("actions/download-artifact@"))
    assert download["with"] == {"name": "evidence", "path": "evidence"}
    runs = [s.get("run", "") for s in sign["steps"]]
    assert any(
        r.startswith("python -m sigstore sign --bundle evidence/difflab-ci.tar.gz.sigstore.json")
        and r.endswith(" evidence/difflab-ci.tar.gz")
        for r in runs
    )
    assert any("difflab verify evidence/difflab-ci.tar.gz --sigstore-identity" in r for r in runs)
    signed = next(s for s in sign["steps"] if s.get("uses", "").startswith("actions/upload-artifact@"))
    assert signed["with"]["path"].split() == [
        "evidence/difflab-ci.tar.gz",
        "evidence/difflab-ci.tar.gz.sigstore.json",
        "evidence/ci-merged/junit.xml",
    ]
    assert "pull_request" in sign["if"]


TAG_ONLY = "${{ github.event_name == 'push' && startsWith(github.ref, 'refs/tags/v') }}"


def test_release_builds_once_and_publishes_by_trusted_publishing(doc):
    """dist builds the sdist and wheel once, after the CPU cells; publish uploads exactly those, behind a gate."""
    dist, publish = doc["jobs"]["dist"], doc["jobs"]["publish"]
    assert dist["if"] == publish["if"] == TAG_ONLY
    assert dist["needs"] == "cpu" and publish["needs"] == "dist"
    runs = [s.get("run", "") for s in dist["steps"]]
    assert runs.count("python -m build --outdir dist") == 1
    assert "build==" in (ROOT / "ci" / "requirements.txt").read_text()  # the setup step installs it, pinned
    tag = next(s for s in dist["steps"] if "TAG" in s.get("env", {}))
    assert (
        tag["env"] == {"TAG": "${{ github.ref_name }}"}
        and "dist/sglang_difflab-${TAG#v}-py3-none-any.whl" in tag["run"]
    )
    upload = next(s for s in dist["steps"] if s.get("uses", "").startswith("actions/upload-artifact@"))
    assert upload["with"] == {"name": "dist", "path": "dist/", "if-no-files-found": "error"}
    assert publish["environment"] == {"name": "pypi", "url": "https://pypi.org/project/sglang-difflab/"}
    steps = publish["steps"]
    assert [s["uses"].split("@")[0] for s in steps] == ["actions/download-artifact", "pypa/gh-action-pypi-publish"]
    assert steps[0]["with"] == {"name": "dist", "path": "dist"} and steps[1]["with"] == {"packages-dir": "dist/"}
    assert not any("run" in s for s in steps)  # nothing of the repository runs where the OIDC token is
    assert gen.ACTIONS["pypi-publish"].uses() in WORKFLOW.read_text()
    # no job that builds what is released restores a cache, and a tag run restores none at all
    assert not any("actions/cache@" in s.get("uses", "") for job in (dist, publish) for s in job["steps"])
    for job in doc["jobs"].values():
        for step in job["steps"]:
            if step.get("uses", "").startswith("actions/cache@"):
                assert step["with"]["lookup-only"] == "${{ startsWith(github.ref, 'refs/tags/') }}"


def test_zizmor_offline_reports_nothing_at_medium_or_above(tmp_path: Path):
    zizmor = _tool("zizmor")
    argv = [zizmor, "--offline", "--no-progress", "--min-severity", "medium", "--format", "json"]
    proc = subprocess.run([*argv, str(ROOT / ".github")], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0 and json.loads(proc.stdout) == [], proc.stdout + proc.stderr
    # the same audit does find what this workflow avoids
    bad = tmp_path / ".github" / "workflows" / "bad.yml"
    bad.parent.mkdir(parents=True)
    bad.write_text(
        "on: push\njobs:\n  x:\n    runs-on: ubuntu-latest\n    strategy:\n      matrix:\n"
        "        name: ${{ fromJSON(github.event.head_commit.message) }}\n    steps:\n"
        "      - uses: actions/checkout@v4\n      - run: echo ${{ matrix.name }}\n"
    )
    proc = subprocess.run([*argv, str(tmp_path / ".github")], capture_output=True, text=True, timeout=120, check=False)
    found = {f["ident"] for f in json.loads(proc.stdout)}
    assert {"unpinned-uses", "artipacked", "template-injection", "excessive-permissions"} <= found, found


def test_workflow_and_dependabot_match_githubs_schemas(tmp_path: Path):
    check = _tool("check-jsonschema")
    for schema, path in (("vendor.github-workflows", WORKFLOW), ("vendor.dependabot", DEPENDABOT)):
        proc = subprocess.run(
            [check, "--builtin-schema", schema, str(path)], capture_output=True, text=True, timeout=120, check=False
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
    broken = tmp_path / "broken.yml"
    broken.write_text(WORKFLOW.read_text().replace("    runs-on: ubuntu-latest\n", "    runs_on: ubuntu-latest\n", 1))
    proc = subprocess.run(
        [check, "--builtin-schema", "vendor.github-workflows", str(broken)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 1 and "runs_on" in proc.stdout + proc.stderr


def test_dependabot_updates_actions_and_pip():
    config = yaml.safe_load(DEPENDABOT.read_text())
    by_ecosystem = {u["package-ecosystem"]: u for u in config["updates"]}
    assert set(by_ecosystem) == {"github-actions", "pip"}
    assert by_ecosystem["github-actions"]["directory"] == "/"
    assert set(by_ecosystem["pip"]["directories"]) == {"/", "/ci"}  # pyproject.toml and ci/requirements.txt
    pins = (ROOT / "ci" / "requirements.txt").read_text()
    assert re.search(r"^sigstore==\d", pins, re.M) and re.search(r"^nox==\d", pins, re.M)


# -- the nightly table -----------------------------------------------------------------------------
def _help(texts: dict[str, str]):
    return lambda command: texts.get(command)


def test_nightly_entries_run_only_once_their_sessions_and_commands_exist(sessions):
    slugs = [e.slug for e in gen.NIGHTLY]
    assert slugs == ["release-watch", "throughput", "mutation"]
    none, skipped = gen.nightly_matrix(sessions, _help({}))
    names = {s["name"] for s in sessions}
    expect_skipped = {"release-watch"} | {n for n in ("throughput", "mutation") if n not in names}
    assert set(skipped) == expect_skipped
    assert skipped["release-watch"] == ["command 'difflab releases'", "command 'difflab contains'"]
    with_all = [*sessions, {"session": "throughput", "name": "throughput"}, {"session": "mutation", "name": "mutation"}]
    helps = {"releases": "usage: difflab releases [--lock]\n  --lock  write releases.lock", "contains": "--all  x"}
    found, skipped = gen.nightly_matrix(with_all, _help(helps))
    assert skipped == {} and [c["slug"] for c in found["include"]] == slugs
    assert found["include"][0]["paths"].splitlines()[0] == "results/"
    # an option named only as part of a longer one does not count
    _, skipped = gen.nightly_matrix(with_all, _help({"releases": "--lockfile", "contains": "--all"}))
    assert skipped == {"release-watch": ["option 'difflab releases --lock'"]}
    expected = [e for e in gen.NIGHTLY if e.slug not in expect_skipped]
    assert none["include"] == [{"slug": e.slug, "title": e.title, "paths": "\n".join(e.artifacts)} for e in expected]


def test_nightly_matrix_from_the_real_cli(sessions):
    """Against this checkout's own difflab: the result follows what exists, whatever has landed."""
    found, skipped = gen.nightly_matrix(sessions)
    assert {c["slug"] for c in found["include"]} | set(skipped) == {e.slug for e in gen.NIGHTLY}
    assert ("throughput" in skipped) == ("throughput" not in {s["name"] for s in sessions})


def test_nightly_run(sessions, monkeypatch, capsys):
    assert gen.nightly_run("nope", sessions) == 2
    monkeypatch.setattr(
        gen,
        "NIGHTLY",
        (
            gen.Nightly("ok", "t", (f"{sys.executable} -c 'print(1)'", f"{sys.executable} -c 'raise SystemExit(4)'")),
            gen.Nightly("gated", "t", ("true",), sessions=("no_such_session",)),
        ),
    )
    assert gen.nightly_run("ok", sessions) == 4  # the first failing command decides
    assert gen.nightly_run("gated", sessions) == 2
    assert "missing nox session 'no_such_session'" in capsys.readouterr().err


def test_generator_cli(tmp_path: Path):
    out = tmp_path / "gh_output"
    env = {"GITHUB_OUTPUT": str(out), "PATH": "/usr/bin:/bin"}
    for cmd in ("matrix", "nightly"):
        proc = subprocess.run(
            [sys.executable, str(ROOT / "ci" / "gen_workflow.py"), cmd, "--github-output"],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr
    lines = out.read_text().splitlines()
    assert lines[0].startswith('matrix={"include":[')
    assert lines[1].startswith("nightly={") and lines[2] in ("nightly-any=true", "nightly-any=false")
    rendered = tmp_path / "w.yml"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "ci" / "gen_workflow.py"), "write", str(rendered)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0 and rendered.read_text() == WORKFLOW.read_text()


# -- JUnit merge -----------------------------------------------------------------------------------
def _junit(path: Path, suite: str, failing: bool) -> None:
    s = TestSuite(suite)
    ok = TestCase("passes", "fix.a")
    bad = TestCase("fails", "fix.b")
    if failing:
        bad.result = [Failure("not-fixed: head still shows the bug", "not-fixed")]
    s.add_testcase(ok)
    s.add_testcase(bad)
    doc = JUnitXml()
    doc.add_testsuite(s)
    path.parent.mkdir(parents=True, exist_ok=True)
    doc.write(str(path))


def test_merge_junit_and_summary(tmp_path: Path, capsys):
    _junit(tmp_path / "a" / "cpu-tests" / "junit.xml", "tests", failing=False)
    _junit(tmp_path / "a" / "gpu-h100" / "junit.xml", "difflab-gpu", failing=True)
    summary = tmp_path / "summary.md"
    code = merge_junit.main(
        [
            "--out",
            str(tmp_path / "merged.xml"),
            "--summary",
            str(summary),
            str(tmp_path / "a" / "**" / "junit*.xml"),
        ]
    )
    assert code == 1  # a failing case fails the report job, after writing everything
    merged = JUnitXml.fromfile(str(tmp_path / "merged.xml"))
    assert sorted(s.name for s in merged) == ["difflab-gpu (gpu-h100)", "tests (cpu-tests)"]
    text = summary.read_text()
    assert "| ✅ tests (cpu-tests) | 2 | 0 | 0 | 0 |" in text
    assert "| ❌ difflab-gpu (gpu-h100) | 2 | 1 | 0 | 0 |" in text
    assert "`fix.b.fails`: not-fixed: head still shows the bug" in text
    assert merge_junit.main(["--out", str(tmp_path / "m2.xml"), str(tmp_path / "none" / "*.xml")]) == 2
