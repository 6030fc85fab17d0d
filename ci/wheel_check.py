"""The built package as a user gets it: sdist and wheel, a fresh virtualenv outside the checkout, commands from a
temporary folder.

    python ci/wheel_check.py [--work DIR]

1. ``python -m build``: the sdist, then the wheel built from that sdist;
2. a fresh virtualenv, ``pip install <wheel>`` (dependencies from the package index pip is configured with);
3. from an empty folder: ``difflab --version`` and ``python -m difflab --version`` name the package's version;
4. ``difflab run --fix 38935 --no-cache``: exit 0, ``confirmed``, and run.json says the probes came from the
   installed package; ``difflab verify`` on the result;
5. ``difflab backport`` on a fork of the corpus (``tests/fork_corpus.py``, the release 0.5.21 as shipped):
   #38935 ``present``.

The SGLang wheels and the shared environment come from the lab's cache (``$DIFFLAB_CACHE``), as for any
run, so a warm cache makes this cost a build, an install and a few probes. Exit 0 when every step holds,
1 naming the step that did not. Run by ``nox -s wheel`` and by ``tests/test_packaging.py`` (so the README's
test command runs it).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIX = "38935"
FORK = "release-0.5.21"  # carries #38935 as released
TIMEOUT_S = 900


class StepFailed(Exception):
    """A step did not hold; the message names it and shows what the command said."""


def _clean_env(venv: Path, work: Path) -> dict[str, str]:
    """The user's environment, minus anything that would let the checkout or another environment leak in."""
    drop = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "DIFFLAB_PROBES", "DIFFLAB_LOCK", "PYTHONSTARTUP")
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("NOX_")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["DIFFLAB_CONFIG"] = str(work.parent / "config")  # a signing key of its own, not the user's
    return env


def _run(args: list[str], *, cwd: Path, env: dict[str, str] | None = None, what: str) -> str:
    started = time.monotonic()
    proc = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    print(f"  {what}: exit {proc.returncode} in {time.monotonic() - started:.1f} s", flush=True)
    if proc.returncode != 0:
        raise StepFailed(
            f"{what}: `{' '.join(args)}` exited {proc.returncode}\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}"
        )
    return proc.stdout


def _expect(condition: bool, message: str) -> None:
    if not condition:
        raise StepFailed(message)


def build(dist: Path) -> Path:
    """sdist, then the wheel from the sdist; returns the wheel (its size and file count printed)."""
    _run([sys.executable, "-m", "build", "--outdir", str(dist), str(ROOT)], cwd=dist.parent, what="python -m build")
    wheels, sdists = sorted(dist.glob("*.whl")), sorted(dist.glob("*.tar.gz"))
    _expect(len(wheels) == 1 and len(sdists) == 1, f"{dist}: expected one wheel and one sdist, found {wheels + sdists}")
    with zipfile.ZipFile(wheels[0]) as zf:
        count = len(zf.namelist())
    print(f"  wheel {wheels[0].name}: {wheels[0].stat().st_size / 1024:.0f} KiB, {count} files")
    print(f"  sdist {sdists[0].name}: {sdists[0].stat().st_size / 1024:.0f} KiB")
    return wheels[0]


def install(wheel: Path, venv: Path, env: dict[str, str]) -> None:
    """A fresh virtualenv holding the wheel and its dependencies, nothing from this environment."""
    _run([sys.executable, "-m", "venv", str(venv)], cwd=venv.parent, env=env, what="python -m venv")
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", str(wheel)]
    _run(pip, cwd=venv.parent, env=env, what="pip install <wheel>")


def versions(venv: Path, work: Path, env: dict[str, str]) -> str:
    from difflab import __version__  # the checkout's, which built the wheel

    tool = _run([str(venv / "bin" / "difflab"), "--version"], cwd=work, env=env, what="difflab --version").strip()
    module = _run([str(venv / "bin" / "python"), "-m", "difflab", "--version"], cwd=work, env=env, what="-m difflab")
    _expect(tool == module.strip() == f"difflab {__version__}", f"--version said {tool!r} / {module.strip()!r}")
    return __version__


def run_and_verify(venv: Path, work: Path, env: dict[str, str]) -> None:
    difflab = str(venv / "bin" / "difflab")
    _run([difflab, "run", "--fix", FIX, "--no-cache", "--out", "run-38935"], cwd=work, env=env, what="difflab run")
    out = work / "run-38935"
    verdicts = {f["id"]: f["verdict"] for f in json.loads((out / "diff.json").read_text())["fixes"]}
    _expect(verdicts == {FIX: "confirmed"}, f"difflab run --fix {FIX}: verdicts {verdicts}")
    probes = json.loads((out / "run.json").read_text())["probes"]
    where = [str(venv / "bin" / "python"), "-c", "import difflab; print(difflab.__file__)"]
    package = Path(_run(where, cwd=work, env=env, what="where difflab is").strip()).parent
    _expect(
        probes["origin"] == "package" and Path(probes["path"]).is_relative_to(package),
        f"run.json probes {probes}: not the installed package's ({package})",
    )
    print(f"  {FIX}: confirmed, probes from {probes['path']} (sha256 {probes['sha256'][:16]})")
    _run([difflab, "verify", "run-38935"], cwd=work, env=env, what="difflab verify")


def backport(venv: Path, work: Path, env: dict[str, str]) -> None:
    sys.path[:0] = [str(ROOT / "tests")]
    from fork_corpus import corpus_repos
    from test_git_support import matrix_copy

    corpus = corpus_repos()
    matrix = matrix_copy(work.parent / "matrix")
    args = [str(venv / "bin" / "difflab"), "backport", "--repo", str(corpus.repo), "--ref", f"corpus/{FORK}"]
    args += ["--fix", FIX, "--matrix", str(matrix), "--upstream", str(corpus.upstream)]  # default --out
    _run(args, cwd=work, env=env, what="difflab backport")
    folders = sorted((work / "results").glob("backport-*"))
    _expect(
        len(folders) == 1, f"backport without --out: expected results/backport-<time>/ under {work}, found {folders}"
    )
    fixes = {f["id"]: f["verdict"] for f in json.loads((folders[0] / "backport.json").read_text())["fixes"]}
    _expect(fixes == {FIX: "present"}, f"difflab backport {FORK}: verdicts {fixes}")
    print(f"  fork {FORK}: {FIX} present")


def check(top: Path) -> None:
    dist, venv, work = top / "dist", top / "venv", top / "work"
    dist.mkdir()
    work.mkdir()
    print("== build", flush=True)
    wheel = build(dist)
    print("== install into a fresh virtualenv, commands from an empty folder", flush=True)
    started = time.monotonic()
    env = _clean_env(venv, work)
    install(wheel, venv, env)
    version = versions(venv, work, env)
    run_and_verify(venv, work, env)
    print(f"  install to first verdict: {time.monotonic() - started:.1f} s (sglang-difflab {version})")
    print("== backport on a corpus fork", flush=True)
    backport(venv, work, env)
    written = sorted(str(p) for p in venv.glob("lib/python*/site-packages/**/results"))
    _expect(not written, f"results written inside the installed package: {written}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--work", type=Path, help="folder for the build, the virtualenv and the runs (default: temporary)"
    )
    args = parser.parse_args(argv)
    try:
        if args.work is not None:
            args.work.mkdir(parents=True)
            check(args.work.resolve())
        else:
            with tempfile.TemporaryDirectory(prefix="difflab-wheel-") as tmp:
                check(Path(tmp))
    except StepFailed as exc:
        print(f"wheel check failed: {exc}", file=sys.stderr)
        return 1
    print("wheel check passed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
