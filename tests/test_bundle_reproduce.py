"""reproduce: re-run the recorded pins through an (injected) executor and compare every verdict and field."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

from difflab.bundle import checksums, layout, trust
from difflab.bundle.pack import pack
from difflab.bundle.sealing import seal
from difflab.errors import ConfigError, VerificationFailed
from difflab.workflows import reproduce as reproduce_workflow
from difflab.workflows.reproduce import (
    Executor,
    Overrides,
    RerunSpec,
    lab_mismatches,
    pipeline_executor,
    reproduce,
    spec_for,
)
from difflab.workflows.run import RunRequest
from difflab.workflows.session import Outcome
from difflab.workflows.throughput import ThroughputOptions
from matrix_samples import FIX, RELEASES
from test_bundle_support import (  # noqa: F401 - isolated_config is an autouse fixture
    GIT_HEAD,
    OBSERVATION,
    isolated_config,
    make_key,
    make_run_folder,
    sealed,
)

Bundle = tuple[Path, trust.TrustPolicy]


@pytest.fixture
def bundle(tmp_path: Path) -> Bundle:
    private, public = make_key(tmp_path / "keys")
    return sealed(tmp_path, private)[0], trust.build(key_files=[public])


def replaying(edit: Callable[[Path], None] | None = None, seen: list[RerunSpec] | None = None) -> Executor:
    """An executor that 're-runs' by copying the recorded run's results, optionally changed."""

    def execute(spec: RerunSpec) -> Path:
        if seen is not None:
            seen.append(spec)
        recorded = spec.matrix.parent
        spec.out.mkdir(parents=True)
        for name in ("run.json", "diff.json", "environment.json", "matrix.toml", "observations"):
            source = recorded / name
            copy = shutil.copytree if source.is_dir() else shutil.copyfile
            copy(source, spec.out / name)
        if edit:
            edit(spec.out)
        return spec.out

    return execute


def edit_json(path: Path, change: Callable[[dict], None]) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def test_identical_rerun_matches_and_uses_the_recorded_request(bundle: Bundle, tmp_path: Path) -> None:
    run_dir, policy = bundle
    seen: list[RerunSpec] = []
    report = reproduce(run_dir, policy, out=tmp_path / "rerun", executor=replaying(seen=seen))
    assert report.matches and report.notes == []
    assert seen == [
        RerunSpec(
            matrix=run_dir / "matrix.toml",
            fixes=["38935", "41404"],
            out=tmp_path / "rerun",
            source_kind="release",
            repo=None,
            runner="docker",
        )
    ]


def test_changed_field_verdict_and_source_are_reported(bundle: Bundle) -> None:
    run_dir, policy = bundle

    def drift(out: Path) -> None:
        edit_json(out / OBSERVATION, lambda o: o["fields"].update({"rejected.enqueued": False, "new.field": 1}))
        edit_json(out / "diff.json", lambda d: d["fixes"][0].update(verdict="not-reproduced"))
        edit_json(out / "observations/41404/head/pr41404_release.json", lambda o: o["source"].update(tree="0" * 40))
        edit_json(out / "environment.json", lambda e: e.update(python_version="3.11.10"))

    report = reproduce(run_dir, policy, executor=replaying(drift))
    recorded_source = json.dumps(GIT_HEAD, sort_keys=True)
    rerun_source = json.dumps({**GIT_HEAD, "tree": "0" * 40}, sort_keys=True)
    assert [str(d) for d in report.differences] == [
        'fix 38935 verdict: recorded "confirmed", now "not-reproduced"',
        "fix 38935 base pr38935_admission field rejected.enqueued: recorded true, now false",
        f"fix 41404 head pr41404_release source: recorded {recorded_source}, now {rerun_source}",
    ]
    # a field only the re-run observes (newer probe code observing more) is said, not counted against it
    assert report.notes == [
        "fix 38935 base pr38935_admission: the re-run also observed 1 field(s) not recorded: new.field",
        "environment: Python 3.11.10 now, 3.11.9 recorded",
    ]


def test_a_recorded_field_the_rerun_lost_is_a_difference(bundle: Bundle) -> None:
    run_dir, policy = bundle

    def lose(out: Path) -> None:
        edit_json(out / OBSERVATION, lambda o: o["fields"].pop("rejected.enqueued"))

    report = reproduce(run_dir, policy, executor=replaying(lose))
    assert [str(d) for d in report.differences] == [
        'fix 38935 base pr38935_admission field rejected.enqueued: recorded true, now "(absent)"'
    ]


def test_missing_observation_is_a_difference(bundle: Bundle) -> None:
    run_dir, policy = bundle
    report = reproduce(run_dir, policy, executor=replaying(lambda out: (out / OBSERVATION).unlink()))
    assert [str(d) for d in report.differences] == [
        'fix 38935 base pr38935_admission observation: recorded "present", now "(absent)"'
    ]


def test_works_from_a_tarball(bundle: Bundle) -> None:
    run_dir, policy = bundle
    assert reproduce(pack(run_dir, environ={}), policy, executor=replaying()).matches


def test_refuses_a_bundle_that_does_not_verify(bundle: Bundle) -> None:
    run_dir, policy = bundle
    (run_dir / "matrix.toml").write_text('[[fixes]]\nid = "evil"\n')
    ran: list[RerunSpec] = []
    with pytest.raises(VerificationFailed, match="matrix.toml"):
        reproduce(run_dir, policy, executor=replaying(seen=ran))
    assert ran == []


HERMETIC = Overrides(runner="docker")


def test_skipping_signatures_still_checks_integrity(bundle: Bundle, tmp_path: Path) -> None:
    run_dir, _ = bundle
    assert reproduce(run_dir, None, executor=replaying(), overrides=HERMETIC).matches  # no trusted key needed
    (run_dir / "matrix.toml").write_text("changed")
    with pytest.raises(VerificationFailed):
        reproduce(run_dir, None, executor=replaying(), overrides=HERMETIC)


@pytest.mark.parametrize("runner", [None, "subprocess", "warm"])
def test_skipping_signatures_needs_a_hermetic_back_end_given_explicitly(bundle: Bundle, runner: str | None) -> None:
    """The bundle records docker, but an unverified run.json does not get to say so: the user must."""
    run_dir, _ = bundle
    ran: list[RerunSpec] = []
    with pytest.raises(ConfigError, match="--skip-signatures: .* pass --backend docker"):
        reproduce(run_dir, None, executor=replaying(seen=ran), overrides=Overrides(runner=runner))
    assert ran == []


def _git_bundle(tmp_path: Path, repo: str) -> Path:
    """A bundle, signed by whoever made it, that re-runs git commits of ``repo``."""
    from difflab.bundle.sealing import seal
    from test_bundle_support import make_run_folder

    run_dir = make_run_folder(tmp_path, "crafted")
    edit_json(
        run_dir / "run.json",
        lambda r: r.update(source_kind="git", repo=repo, fixes=["38935"], runner={"name": "subprocess"}),
    )
    attacker, _ = make_key(tmp_path / "attacker")
    seal(run_dir, attacker, echo=lambda _m: None, environ={})
    return run_dir


def test_skipping_signatures_on_a_git_bundle_needs_the_repository_from_the_user(tmp_path: Path) -> None:
    crafted = _git_bundle(tmp_path, "https://attacker.example/sglang.git")
    ran: list[RerunSpec] = []
    with pytest.raises(
        ConfigError, match=r"pass --repo .* \(it records 'https://attacker.example/sglang.git'\)|--repo"
    ):
        reproduce(crafted, None, executor=replaying(seen=ran), overrides=HERMETIC)
    assert ran == []
    mine = Overrides(repo="https://github.com/sgl-project/sglang", runner="docker")
    reproduce(crafted, None, executor=replaying(seen=ran), overrides=mine)
    assert [(s.repo, s.runner, s.source_kind) for s in ran] == [
        ("https://github.com/sgl-project/sglang", "docker", "git")
    ]


def test_a_crafted_bundle_never_runs_the_code_it_names(tmp_path: Path) -> None:
    """End to end: a bundle naming a repository whose sglang/__init__.py leaves a mark when imported."""
    marker = tmp_path / "imported"
    evil = tmp_path / "evil"
    (evil / "python" / "sglang").mkdir(parents=True)
    (evil / "python" / "sglang" / "__init__.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    subprocess.run(["git", "init", "-q", "-b", "main", str(evil)], check=True)
    subprocess.run(["git", "-C", str(evil), "add", "-A"], check=True)
    commit = ["git", "-C", str(evil), "-c", "user.name=x", "-c", "user.email=x@x", "commit", "-qm", "x"]
    subprocess.run(commit, check=True)
    sha = subprocess.run(["git", "-C", str(evil), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    crafted = _git_bundle(tmp_path, str(evil))
    pins = "".join(f'[fixes.commits.{side}]\nsha = "{sha}"\nconfirmed = true\n' for side in ("base", "head"))
    (crafted / "matrix.toml").write_text(RELEASES + FIX + pins)
    files = [f for f in layout.scan(crafted).files if f not in layout.OUTSIDE_CHECKSUMS]
    (crafted / layout.CHECKSUMS).write_text(checksums.render(checksums.digests(crafted, files)))
    env = {**os.environ, "DIFFLAB_CACHE": str(tmp_path / "cache")}
    out = subprocess.run(
        [sys.executable, "-m", "difflab", "reproduce", str(crafted), "--skip-signatures"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert out.returncode == 2, out.stdout + out.stderr
    assert "--skip-signatures" in out.stderr and not marker.exists()
    out = subprocess.run(
        [sys.executable, "-m", "difflab", "reproduce", str(crafted), "--skip-signatures", "--backend", "docker"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert out.returncode == 2 and "pass --repo" in out.stderr, out.stdout + out.stderr
    assert not marker.exists()


# -- the re-run's request, read from the bundle's run.json -------------------------------------------------------
def _recording(tmp_path: Path, run: object) -> Path:
    root = tmp_path / "bundle"
    root.mkdir()
    (root / "run.json").write_text(json.dumps(run))
    return root


def test_a_one_side_recording_reruns_that_side_with_its_throughput_settings(tmp_path: Path) -> None:
    settings = {"rounds": 3, "sizes": [10, 40], "fail_above": 1.5}
    run = {"fixes": [38935], "sides": ["head"], "throughput": settings, "source_kind": "git", "repo": "/r"}
    root = _recording(tmp_path, {**run, "runner": {"name": "warm"}})
    assert spec_for(root, tmp_path / "out") == RerunSpec(
        matrix=root / "matrix.toml",
        fixes=["38935"],
        out=tmp_path / "out",
        source_kind="git",
        repo="/r",
        runner="warm",
        sides=("head",),
        throughput=settings,
    )


@pytest.mark.parametrize("sides", [["head", "base"], ["base", "head"], None, "head"])
def test_a_recording_of_both_sides_or_none_named_reruns_both(tmp_path: Path, sides: object) -> None:
    """Both sides in either order (or no list): the run workflow's own default, never a one-side re-run."""
    spec = spec_for(_recording(tmp_path, {"sides": sides, "throughput": "no"}), tmp_path / "out")
    assert (spec.sides, spec.throughput, spec.fixes) == (None, None, None)
    assert (spec.source_kind, spec.repo, spec.runner) == ("release", None, "subprocess")  # what run.json omits


def test_an_unreadable_run_json_is_refused_naming_it(tmp_path: Path) -> None:
    root = tmp_path / "bundle"
    root.mkdir()
    (root / "run.json").write_text("{not json")
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(root / 'run.json'))}: cannot read \("):
        spec_for(root, tmp_path / "out")
    assert lab_mismatches(root) == []
    (root / "run.json").write_text("[1, 2]")  # JSON, but not a run record
    assert lab_mismatches(root) == []
    (root / "run.json").unlink()
    assert lab_mismatches(root) == []


def test_the_pipeline_executor_reruns_every_probe_unsealed_with_the_recorded_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[RunRequest] = []

    def execute(req: RunRequest) -> Outcome:
        seen.append(req)
        return Outcome(out_dir=req.out, exit_code=0)

    monkeypatch.setattr(reproduce_workflow, "execute", execute)
    spec = RerunSpec(
        matrix=tmp_path / "m.toml",
        fixes=["1"],
        out=tmp_path / "out",
        source_kind="git",
        repo="/r",
        runner="warm",
        sides=("base",),
        throughput={"rounds": 3, "sizes": [10, 40]},
    )
    assert pipeline_executor(spec) == tmp_path / "out"
    assert pipeline_executor(dataclasses.replace(spec, sides=None, throughput=None)) == tmp_path / "out"
    one, both = seen
    assert (one.matrix, one.fixes, one.out) == (tmp_path / "m.toml", ["1"], tmp_path / "out")
    assert (one.source_kind, one.repo, one.runner) == ("git", "/r", "warm")
    assert (one.bundle, one.use_cache) == (False, False)  # compared, never sealed; nothing from the cache
    assert one.sides == ("base",) and one.throughput == ThroughputOptions(rounds=3, sizes=(10, 40))
    assert both.sides == RunRequest(matrix=spec.matrix).sides and both.throughput is None


# -- what reproduce refuses, and what it says beside the differences ---------------------------------------------
def test_a_rerun_that_wrote_no_verdicts_is_refused_naming_it(bundle: Bundle, tmp_path: Path) -> None:
    run_dir, policy = bundle
    rerun = tmp_path / "rerun"
    with pytest.raises(VerificationFailed) as err:
        reproduce(run_dir, policy, out=rerun, executor=replaying(lambda out: (out / "diff.json").unlink()))
    assert str(err.value) == f"{rerun}: the re-run wrote no diff.json; nothing to compare"


def test_a_one_side_recording_compares_its_observations_without_verdicts(tmp_path: Path) -> None:
    """A sealed one-side run (``RunRequest(sides=("head",))``) has no diff.json: its observations decide."""
    private, public = make_key(tmp_path / "keys")
    run_dir = make_run_folder(tmp_path, "run")
    (run_dir / "diff.json").unlink()
    edit_json(run_dir / "run.json", lambda d: d.update(sides=["head"]))
    seal(run_dir, private, echo=lambda _m: None, environ={})
    policy = trust.build(key_files=[public])

    def one_side(edit: Callable[[Path], None] | None = None) -> Executor:
        def execute(spec: RerunSpec) -> Path:
            assert spec.sides == ("head",)
            spec.out.mkdir(parents=True)
            shutil.copytree(run_dir / "observations", spec.out / "observations")
            if edit:
                edit(spec.out)
            return spec.out

        return execute

    report = reproduce(run_dir, policy, out=tmp_path / "same", executor=one_side())
    assert report.matches and report.differences == []
    gone = reproduce(
        run_dir, policy, out=tmp_path / "lost", executor=one_side(lambda out: shutil.rmtree(out / "observations"))
    )
    assert not gone.matches and gone.differences
    assert all(d.where.endswith("observation") and d.now == "(absent)" for d in gone.differences)


def test_a_bundle_of_another_lab_version_is_said_before_the_differences(tmp_path: Path) -> None:
    from difflab.bundle.sealing import seal
    from test_bundle_support import make_run_folder

    run_dir = make_run_folder(tmp_path, "older")
    edit_json(run_dir / "run.json", lambda r: r.update(tool_version="0.0.1"))
    private, public = make_key(tmp_path / "keys")
    seal(run_dir, private, echo=lambda _m: None, environ={})
    drift = replaying(lambda out: edit_json(out / "environment.json", lambda e: e.update(python_version="3.11.10")))
    report = reproduce(run_dir, trust.build(key_files=[public]), executor=drift)
    assert report.matches and len(report.notes) == 2
    assert report.notes[0].startswith("recorded with sglang-difflab 0.0.1, re-run with ")
    assert report.notes[1] == "environment: Python 3.11.10 now, 3.11.9 recorded"


def test_an_archive_over_the_unpacked_limit_is_refused_before_anything_runs(bundle: Bundle) -> None:
    run_dir, policy = bundle
    ran: list[RerunSpec] = []
    with pytest.raises(VerificationFailed, match="unpacks to more than 0 MiB"):
        reproduce(pack(run_dir, environ={}), policy, executor=replaying(seen=ran), max_bytes=100)
    assert ran == []


def test_a_bundle_that_does_not_verify_is_refused_listing_each_problem(bundle: Bundle) -> None:
    run_dir, policy = bundle
    (run_dir / "matrix.toml").write_text("changed")
    with pytest.raises(VerificationFailed) as err:
        reproduce(run_dir, policy, executor=replaying())
    head, *problems = str(err.value).split("\n")
    assert head == "refusing to reproduce a bundle that does not verify:"
    assert problems and all(p.startswith("  ") for p in problems) and any("matrix.toml" in p for p in problems)


def test_skipping_signatures_names_the_hermetic_back_end_and_the_recorded_repository(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        reproduce(tmp_path / "any", None, overrides=Overrides(runner="subprocess"))
    assert str(err.value) == (
        "--skip-signatures: nobody vouches for this bundle, so its run.json may not choose what runs; "
        "pass --backend docker (no network, the source read-only) explicitly"
    )
    crafted = _git_bundle(tmp_path, "/their/sglang")
    with pytest.raises(ConfigError) as err:
        reproduce(crafted, None, executor=replaying(), overrides=HERMETIC)
    assert str(err.value) == (
        "--skip-signatures: this bundle re-runs git commits (it records '/their/sglang'); "
        "pass --repo with the SGLang repository you trust to hold them"
    )
    edit_json(crafted / "run.json", lambda r: r.update(repo=None))
    files = [f for f in layout.scan(crafted).files if f not in layout.OUTSIDE_CHECKSUMS]
    (crafted / layout.CHECKSUMS).write_text(checksums.render(checksums.digests(crafted, files)))
    with pytest.raises(ConfigError) as err:
        reproduce(crafted, None, executor=replaying(), overrides=HERMETIC)
    assert str(err.value).startswith("--skip-signatures: this bundle re-runs git commits; pass --repo ")


def test_a_signed_git_bundle_reruns_from_its_recorded_repository(tmp_path: Path) -> None:
    """Signatures checked: the signer vouches for run.json, so its repository is used without ``--repo``."""
    from difflab.bundle.sealing import seal
    from test_bundle_support import make_run_folder

    run_dir = make_run_folder(tmp_path, "git")
    edit_json(run_dir / "run.json", lambda r: r.update(source_kind="git", repo="/their/sglang"))
    private, public = make_key(tmp_path / "keys")
    seal(run_dir, private, echo=lambda _m: None, environ={})
    ran: list[RerunSpec] = []
    assert reproduce(run_dir, trust.build(key_files=[public]), executor=replaying(seen=ran)).matches
    assert [(s.source_kind, s.repo, s.runner) for s in ran] == [("git", "/their/sglang", "docker")]


def test_a_bundle_signed_by_a_key_nobody_trusts_is_refused(tmp_path: Path) -> None:
    private, _ = make_key(tmp_path / "theirs")
    _, mine = make_key(tmp_path / "mine", "mine")
    run_dir = sealed(tmp_path, private)[0]
    ran: list[RerunSpec] = []
    with pytest.raises(VerificationFailed, match="^refusing to reproduce a bundle that does not verify:"):
        reproduce(run_dir, trust.build(key_files=[mine]), executor=replaying(seen=ran))
    assert ran == []


def test_skipping_signatures_with_a_kept_rerun_still_needs_the_repository(tmp_path: Path) -> None:
    crafted = _git_bundle(tmp_path, "/their/sglang")
    ran: list[RerunSpec] = []
    with pytest.raises(ConfigError, match=r"^--skip-signatures: this bundle re-runs git commits"):
        reproduce(crafted, None, out=tmp_path / "rerun", executor=replaying(seen=ran), overrides=HERMETIC)
    assert ran == [] and not (tmp_path / "rerun").exists()


def test_a_rerun_without_out_goes_to_a_named_temporary_folder_removed_afterwards(
    bundle: Bundle, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir, policy = bundle
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    seen: list[RerunSpec] = []
    report = reproduce(run_dir, policy, executor=replaying(seen=seen))
    (spec,) = seen
    assert spec.out.name == "rerun" and spec.out.parent.parent == scratch
    assert spec.out.parent.name.startswith("difflab-reproduce-")
    assert report.matches and report.rerun_dir is None and list(scratch.iterdir()) == []
