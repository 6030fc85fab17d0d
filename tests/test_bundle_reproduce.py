"""reproduce: re-run the recorded pins through an (injected) executor and compare every verdict and field."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from difflab.bundle import layout, trust
from difflab.bundle.pack import pack
from difflab.bundle.verify import verify_folder
from difflab.cli import main
from difflab.errors import VerificationFailed
from difflab.workflows import reproduce as reproduce_module
from difflab.workflows.reproduce import Executor, RerunSpec, reproduce
from test_bundle_support import (  # noqa: F401 - isolated_config is an autouse fixture
    GIT_HEAD,
    OBSERVATION,
    isolated_config,
    make_key,
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


def test_skipping_signatures_still_checks_integrity(bundle: Bundle, tmp_path: Path) -> None:
    run_dir, _ = bundle
    assert reproduce(run_dir, None, executor=replaying()).matches  # no trusted key needed
    (run_dir / "matrix.toml").write_text("changed")
    with pytest.raises(VerificationFailed):
        reproduce(run_dir, None, executor=replaying())


def test_cli_prints_differences_and_exits_1(
    bundle: Bundle, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir, _ = bundle
    fingerprint = (run_dir / layout.FINGERPRINT).read_text().strip()
    monkeypatch.setattr(reproduce_module, "pipeline_executor", replaying())
    assert main(["reproduce", str(run_dir), "--fingerprint", fingerprint]) == 0
    flip = replaying(lambda out: edit_json(out / "diff.json", lambda d: d["fixes"][1].update(verdict="not-fixed")))
    monkeypatch.setattr(reproduce_module, "pipeline_executor", flip)
    assert main(["reproduce", str(run_dir), "--fingerprint", fingerprint]) == 1
    assert 'fix 41404 verdict: recorded "confirmed", now "not-fixed"' in capsys.readouterr().out


@pytest.mark.sglang
@pytest.mark.xdist_group("release")
def test_real_pipeline_run_reproduces(tmp_path: Path) -> None:
    """End to end with real SGLang: run one fix with bundling, verify, then reproduce it (slow, downloads)."""
    from difflab.paths import default_matrix
    from difflab.workflows.run import RunRequest, execute

    private, public = make_key(tmp_path / "keys")
    outcome = execute(RunRequest(matrix=default_matrix(), fixes=["38935"], out=tmp_path / "run", key=private))
    policy = trust.build(key_files=[public])
    report = verify_folder(outcome.out_dir, policy)
    assert report.ok, report.failure_message()
    again = reproduce(pack(outcome.out_dir, environ={}), policy)
    assert again.matches, "\n".join(str(d) for d in again.differences)


def _name_trees(out: Path, tree: str = "7" * 64) -> None:
    """What today's lab records: observation schema 2, release sources naming their unpacked tree."""
    for path in (out / "observations").glob("*/*/*.json"):

        def upgrade(obs: dict) -> None:
            obs["schema"] = 2
            if obs["source"].get("kind") == "release":
                obs["source"]["tree_sha256"] = tree

        edit_json(path, upgrade)


def test_a_recording_made_before_trees_were_named_still_reproduces(bundle: Bundle) -> None:
    run_dir, policy = bundle
    assert reproduce(run_dir, policy, executor=replaying(_name_trees)).matches


def test_a_different_tree_is_a_difference_once_the_recording_names_it(tmp_path: Path) -> None:
    from difflab.bundle.compare import compare_runs
    from test_bundle_support import make_run_folder

    recorded, rerun = make_run_folder(tmp_path, "recorded"), make_run_folder(tmp_path, "rerun")
    _name_trees(recorded, "7" * 64)
    _name_trees(rerun, "8" * 64)
    report = compare_runs(recorded, rerun)
    assert [d.where for d in report.differences] == [
        "fix 38935 base pr38935_admission source",
        "fix 38935 head pr38935_admission source",
    ]
