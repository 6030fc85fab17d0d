"""nox sessions: the CI matrix.

``nox`` (default) runs the lab on the default matrix. ``nox -s side`` fans
out per fix x side (one CI job each) and ``nox -s merge`` turns their
observations into verdicts (a sealed run folder) and ``nox -s pack`` packs it
into the deterministic tarball CI signs. ``nox -s throughput`` adds each fix's
CPU throughput A/B. ``nox -s tests`` runs the test suite. ``nox -s mutation``
(nightly) measures how many small edits to the judging core the fast tests catch.
"""

from __future__ import annotations

import shutil
import tomllib
from pathlib import Path

import nox

nox.options.default_venv_backend = "venv"
nox.options.sessions = ["lab"]
nox.options.reuse_existing_virtualenvs = True

ROOT = Path(__file__).parent
MATRIX = ROOT / "matrices" / "upstream.toml"
PYTHON = "3.11"


def fix_ids() -> list[str]:
    """Fix ids straight from the default matrix, so the CI matrix never goes stale."""
    with MATRIX.open("rb") as fh:
        return [f["id"] for f in tomllib.load(fh)["fixes"]]


def _install(session: nox.Session, extras: str = "") -> None:
    session.install("-e", f".{extras}")


@nox.session(python=PYTHON)
def lab(session: nox.Session) -> None:
    """Run every fix of the default matrix (the main job)."""
    _install(session)
    session.run("difflab", "run", *session.posargs)


@nox.session(python=PYTHON)
@nox.parametrize("side", ["base", "head"])
@nox.parametrize("fix", fix_ids())
def side(session: nox.Session, fix: str, side: str) -> None:
    """Observe one side of one fix (a CI matrix cell); pass ``-- --source git`` etc. through."""
    _install(session)
    session.run(
        "difflab",
        "observe",
        "--fix",
        fix,
        "--side",
        side,
        "--out",
        f"results/ci/{fix}-{side}",
        "--force",
        *session.posargs,
    )


@nox.session(python=PYTHON)
def merge(session: nox.Session) -> None:
    """Judge the observations the ``side`` sessions left under results/ci/."""
    _install(session)
    session.run("difflab", "merge", "results/ci", "--out", "results/ci-merged", "--force", *session.posargs)


@nox.session(python=PYTHON)
def pack(session: nox.Session) -> None:
    """Pack the sealed folder ``merge`` wrote into results/difflab-ci.tar.gz (what CI signs with Sigstore)."""
    _install(session)
    session.run("difflab", "pack", "results/ci-merged", "--output", "results/difflab-ci.tar.gz", *session.posargs)


@nox.session(python=PYTHON)
def throughput(session: nox.Session) -> None:
    """The default matrix with each fix's hot path timed base vs head (``difflab run --throughput``)."""
    _install(session, "[stats]")
    session.run("difflab", "run", "--throughput", "--out", "results/throughput", *session.posargs)


@nox.session(python=PYTHON)
def contains(session: nox.Session) -> None:
    """Every fix on every release in matrices/releases.lock: which release carries which fix, and regressions."""
    _install(session)
    session.run("difflab", "contains", "--all", *session.posargs)


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """The test suite, parallel with pytest-xdist."""
    _install(session, "[dev]")
    session.run("pytest", "-n", "auto", "--dist", "loadgroup", *session.posargs)


@nox.session(python=PYTHON)
def wheel(session: nox.Session) -> None:
    """The package as a user gets it (ci/wheel_check.py): build sdist and wheel, install the wheel into a fresh
    virtualenv outside the checkout, run ``difflab run --fix 38935``, ``verify`` and a ``backport`` from a temporary
    folder.

    ``tests`` runs the same script (tests/test_packaging.py); this session runs it alone.
    """
    session.install("-e", ".", "build>=1.2")  # the checkout's difflab builds the fork corpus
    session.run("python", "ci/wheel_check.py", *session.posargs)


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """ruff: lint and formatting, the whole tree (the settings are in pyproject.toml)."""
    session.install("ruff>=0.6")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session(python=PYTHON)
def mutation(session: nox.Session) -> None:
    """Mutation score of the judging core and the modules whose bugs change a verdict, an exit code or the
    evidence (mutmut, settings in pyproject.toml); fails when any module is below 90 %.

    Too slow for every push (over an hour on 2 cores): the nightly job runs it, and a fixed sample
    of mutants runs with the tests (tests/test_mutation_examples.py). Arguments go to ``mutmut run``.
    """
    _install(session, "[dev,mutation]")
    shutil.rmtree(ROOT / "mutants", ignore_errors=True)  # mutmut never refreshes its copy of unmutated files
    # ci/mutmut_run.py is mutmut naming the probe harness's modules as the probes import them
    session.run("nice", "-n", "10", "python", "ci/mutmut_run.py", "run", *session.posargs, external=True)
    globs = [f"--only={g}" for g in session.posargs if not g.startswith("-")]  # a partial run scores its own
    session.run("python", "ci/mutation_score.py", *globs)
