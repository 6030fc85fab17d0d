"""The result cache: reuse what nothing changed, re-run exactly what did, never replay an error."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from difflab.observation import Observation
from difflab.runner.base import ProbeJob, Progress
from difflab.runner.cache import CachingRunner
from difflab.source.base import MaterialisedSource


@dataclass
class Env:
    digest: str = "env-1"


@dataclass
class FakeRunner:
    """Records which jobs it was asked to run; ``status`` decides each outcome."""

    status: Callable[[ProbeJob], str] = lambda job: "ok"
    name: str = "fake"
    ran: list[tuple[str, str, str]] = field(default_factory=list)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "workers": 3}

    def run(self, jobs: Sequence[ProbeJob], on_done: Progress | None = None) -> list[Observation]:
        out = []
        for job in jobs:
            self.ran.append((job.fix_id, job.probe, job.side))
            if job.log_path:
                job.log_path.parent.mkdir(parents=True, exist_ok=True)
                job.log_path.write_text(f"log of {job.probe}\n")
            status = self.status(job)
            obs = Observation(
                fix=job.fix_id,
                probe=job.probe,
                side=job.side,
                source=dict(job.source.identity),
                status=status,
                fields={"x.value": len(self.ran)},
                runner=self.name,  # type: ignore[arg-type]
                error=None if status == "ok" else "boom",
                duration_s=1.5,
            )
            if on_done:
                on_done(obs)
            out.append(obs)
        return out


@pytest.fixture
def lab(tmp_path: Path) -> Path:
    probes = tmp_path / "probes"
    (probes / "harness").mkdir(parents=True)
    (probes / "harness" / "__init__.py").write_text("")
    (probes / "harness" / "runtime.py").write_text("X = 1\n")
    for name in ("p1", "p2"):
        (probes / f"{name}.py").write_text(f"# {name}\ndef observe(kit):\n    return {{}}\n")
    return tmp_path


SRC = MaterialisedSource(
    label="0.5.21", kind="release", root=Path("/nowhere"), identity={"version": "0.5.21"}, digest="sha256:aaa"
)


def jobs(lab: Path, source: MaterialisedSource = SRC, side: str = "base", fix: str = "1") -> list[ProbeJob]:
    return [
        ProbeJob(
            fix_id=fix,
            probe=p,
            side=side,
            source=source,
            probe_file=lab / "probes" / f"{p}.py",
            log_path=lab / "out" / side / f"{p}.log",
        )
        for p in ("p1", "p2")
    ]


def cached(inner: FakeRunner, lab: Path, env: Env | None = None) -> CachingRunner:
    env = env or Env()
    return CachingRunner(inner=inner, environment=env, cache_dir=lab / "cache", secret=b"k")  # type: ignore[arg-type]


def test_second_run_is_served_from_the_cache(lab: Path) -> None:
    inner = FakeRunner()
    first = cached(inner, lab).run(jobs(lab))
    (lab / "out").rename(lab / "out-first")
    seen: list[Observation] = []
    second = cached(inner, lab).run(jobs(lab), on_done=seen.append)
    assert len(inner.ran) == 2  # nothing ran the second time
    assert [o.cached for o in first] == [False, False] and [o.cached for o in second] == [True, True]
    assert [o.fields for o in second] == [o.fields for o in first]
    assert [o.probe for o in seen] == ["p1", "p2"] and all(o.cached for o in seen)
    assert (lab / "out" / "base" / "p1.log").read_text() == "log of p1\n"  # the log comes back too
    assert not list((lab / "cache").rglob("*.part"))


def test_changing_one_probe_reruns_only_that_probe(lab: Path) -> None:
    inner = FakeRunner()
    cached(inner, lab).run(jobs(lab))
    (lab / "probes" / "p2.py").write_text("# p2, edited\ndef observe(kit):\n    return {}\n")
    obs = cached(inner, lab).run(jobs(lab))
    assert inner.ran[2:] == [("1", "p2", "base")]
    assert [o.cached for o in obs] == [True, False]


def test_harness_environment_source_side_and_fix_are_part_of_the_key(lab: Path) -> None:
    inner = FakeRunner()
    cached(inner, lab).run(jobs(lab))
    (lab / "probes" / "harness" / "runtime.py").write_text("X = 2\n")
    cached(inner, lab).run(jobs(lab))
    assert len(inner.ran) == 4
    cached(inner, lab, Env("env-2")).run(jobs(lab))
    assert len(inner.ran) == 6
    other = MaterialisedSource(label="0.5.21+mut", kind="mutated", root=Path("/x"), identity={}, digest="sha256:aaa+m")
    cached(inner, lab).run(jobs(lab, source=other))
    cached(inner, lab).run(jobs(lab, side="head"))
    cached(inner, lab).run(jobs(lab, fix="2"))
    assert len(inner.ran) == 12
    cached(inner, lab).run(jobs(lab) + jobs(lab, side="head") + jobs(lab, fix="2"))
    assert len(inner.ran) == 12  # and each of those is now cached


def test_lab_code_inside_the_probe_process_is_part_of_the_key(lab: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    inner = FakeRunner()
    cached(inner, lab).run(jobs(lab))
    monkeypatch.setattr("difflab.runner.childlib.child_digest", lambda: "another kit")
    cached(inner, lab).run(jobs(lab))
    assert len(inner.ran) == 4


def test_errors_are_never_cached_but_not_applicable_is(lab: Path) -> None:
    inner = FakeRunner(status=lambda job: "error" if job.probe == "p1" else "n/a")
    cached(inner, lab).run(jobs(lab))
    obs = cached(inner, lab).run(jobs(lab))
    assert inner.ran == [("1", "p1", "base"), ("1", "p2", "base"), ("1", "p1", "base")]
    assert [(o.status, o.cached) for o in obs] == [("error", False), ("n/a", True)]


def test_a_damaged_entry_is_a_miss(lab: Path) -> None:
    inner = FakeRunner()
    cached(inner, lab).run(jobs(lab))
    for entry in (lab / "cache").rglob("*.json"):
        entry.write_text("{not json")
    obs = cached(inner, lab).run(jobs(lab))
    assert len(inner.ran) == 4 and not any(o.cached for o in obs)


def test_describe_is_the_inner_runners_plus_cache(lab: Path) -> None:
    runner = cached(FakeRunner(), lab)
    assert runner.describe() == {"name": "fake", "workers": 3, "cache": True}
    assert runner.name == "fake"


def test_the_pipeline_wraps_runners_unless_told_not_to(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from difflab.environment.shared import SharedEnvironment
    from difflab.runner.warm import WarmRunner
    from difflab.workflows.run import RunRequest, make_runner

    env = SharedEnvironment(cache=tmp_path)
    wrapped = make_runner(RunRequest(runner="warm"), env)
    assert isinstance(wrapped, CachingRunner) and isinstance(wrapped.inner, WarmRunner)
    assert isinstance(make_runner(RunRequest(runner="warm", use_cache=False), env), WarmRunner)
