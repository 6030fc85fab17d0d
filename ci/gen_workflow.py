#!/usr/bin/env python3
"""Generate the GitHub workflow and its job matrices from the nox sessions, so neither can go stale.

The workflow text (.github/workflows/difflab.yml) is rendered from the tables below and committed;
``check`` fails when the committed file differs from what this script renders, or when it names a
nox session that ``nox --list --json`` does not report. At run time the ``plan`` job asks this
script for the CPU matrix (every nox session cell) and for the nightly matrix (the NIGHTLY entries
whose sessions and commands exist), so no session name is copied into the YAML by hand.

    python ci/gen_workflow.py write                       # render .github/workflows/difflab.yml
    python ci/gen_workflow.py check                       # committed == rendered, sessions exist
    python ci/gen_workflow.py matrix [--github-output]    # CPU cells: {"include": [...]}
    python ci/gen_workflow.py nightly [--github-output]   # nightly entries that can run here
    python ci/gen_workflow.py nightly-run SLUG            # run one nightly entry's commands
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
NOXFILE = ROOT / "noxfile.py"
WORKFLOW = ROOT / ".github" / "workflows" / "difflab.yml"
PYTHON = "3.11"
# nox lists only the *selected* sessions with --list; a keyword expression that is always true selects all.
ALL_SESSIONS = "not __no_session_is_named_this__"
# Sessions that are not CPU matrix cells, and why.
NOT_CELLS = {
    "lab": "the side cells plus the merge job do the same work in parallel",
    "merge": "runs as its own job once every side cell has finished",
    "pack": "packs the merge job's sealed run folder, in that job",
    "throughput": "a timing: the nightly job runs it, not every push on a shared runner",
    "mutation": "nightly: mutmut over the judging core takes several minutes",
    "wheel": "the tests cell runs the same script (tests/test_packaging.py drives ci/wheel_check.py)",
}
# Extra arguments per session name, so each cell leaves a JUnit file for the report job.
POSARGS = {"tests": "--junitxml=results/junit/tests.xml"}


@dataclass(frozen=True)
class Action:
    """A third-party action pinned by full commit SHA; ``version`` is the release tag at that commit."""

    repo: str
    sha: str
    version: str

    def uses(self) -> str:
        return f"{self.repo}@{self.sha} # {self.version}"


# Pinned by commit (a tag can be moved); Dependabot's github-actions updates bump SHA and comment together.
ACTIONS = {
    "checkout": Action("actions/checkout", "11bd71901bbe5b1630ceea73d27597364c9af683", "v4.2.2"),
    "setup-python": Action("actions/setup-python", "a26af69be951a213d495a4c3e4e4022e16d87065", "v5.6.0"),
    "cache": Action("actions/cache", "5a3ec84eff668545956fd18022155c47e93e2684", "v4.2.3"),
    "upload-artifact": Action("actions/upload-artifact", "ea165f8d65b6e75b540449e92b4886f43607fa02", "v4.6.2"),
    "download-artifact": Action("actions/download-artifact", "d3f86a106a0bac45b974a628896c90dbdf5c8093", "v4.3.0"),
    "pypi-publish": Action("pypa/gh-action-pypi-publish", "ba38be9e461d3875417946c167d0b5f3d385a247", "v1.14.1"),
}


@dataclass(frozen=True)
class Nightly:
    """One nightly job: the commands it runs and what must exist before it is scheduled.

    ``sessions`` must be listed by ``nox --list --json``; each of ``options`` is ``"COMMAND --flag"``
    and must appear in ``difflab COMMAND --help``. An entry whose prerequisites are missing is left
    out of the nightly matrix (the plan job says which and why), so an entry can land before its code.
    """

    slug: str
    title: str
    commands: tuple[str, ...]
    sessions: tuple[str, ...] = ()
    options: tuple[str, ...] = ()
    artifacts: tuple[str, ...] = ("results/",)


# The nightly job list: one entry per nightly check (schedule and manual dispatch only).
NIGHTLY: tuple[Nightly, ...] = (
    Nightly(
        "release-watch",
        "new SGLang releases: lock them, then which release carries which fix",
        commands=("difflab releases --lock", "difflab contains --all"),
        options=("releases --lock", "contains --all"),
        artifacts=("results/", "releases.lock", "matrices/*.lock"),
    ),
    Nightly(
        "throughput",
        "CPU throughput A/B of base and head",
        commands=("python -m nox -s throughput",),
        sessions=("throughput",),
    ),
    Nightly(
        "mutation",
        "mutation score of the lab's own tests",
        commands=("python -m nox -s mutation",),
        sessions=("mutation",),
    ),
)


# -- nox ---------------------------------------------------------------------------------------------
def nox_sessions(noxfile: Path = NOXFILE) -> list[dict[str, Any]]:
    """Every session nox knows, parametrizations expanded (``nox --list --json``)."""
    argv = [sys.executable, "-m", "nox", "--noxfile", str(noxfile), "--list", "--json", "-k", ALL_SESSIONS]
    env = {k: v for k, v in os.environ.items() if k != "NOXSESSION"}  # it would narrow the listing
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, cwd=noxfile.parent, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"nox --list failed ({proc.returncode}): {proc.stderr.strip()[-500:]}")
    return json.loads(proc.stdout)


def slug(session: dict[str, Any]) -> str:
    """``side(fix='36988', side='base')`` -> ``side-36988-base``: safe for artifact and job names."""
    parts = [session["name"], *(str(v) for v in session.get("call_spec", {}).values())]
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", "-".join(parts)).strip("-")


def nightly_sessions() -> set[str]:
    """Sessions that belong to a nightly entry: they run at night, not in every push's CPU matrix."""
    return {name for entry in NIGHTLY for name in entry.sessions}


def matrix(sessions: list[dict[str, Any]]) -> dict[str, list[dict[str, str]]]:
    """The ``include`` list of the CPU job: one cell per session except :data:`NOT_CELLS` and nightly ones."""
    include = []
    skip = set(NOT_CELLS) | nightly_sessions()
    for s in sessions:
        if s["name"] in skip:
            continue
        cell = {
            "session": s["session"],
            "name": s["name"],
            "slug": slug(s),
            "posargs": POSARGS.get(s["name"], ""),
        }
        cell.update({k: str(v) for k, v in s.get("call_spec", {}).items()})
        include.append(cell)
    return {"include": include}


# -- nightly -----------------------------------------------------------------------------------------
def difflab_help(command: str) -> str | None:
    """``difflab COMMAND --help`` text, or None when difflab or the command is missing."""
    exe = shutil.which("difflab")
    argv = [exe] if exe else [sys.executable, "-m", "difflab.cli"]
    try:
        proc = subprocess.run([*argv, command, "--help"], capture_output=True, text=True, check=False, timeout=120)
    except OSError:
        return None
    return proc.stdout if proc.returncode == 0 else None


def missing(entry: Nightly, sessions: list[dict[str, Any]], helper: Callable[[str], str | None]) -> list[str]:
    """What ``entry`` needs that does not exist yet (empty: it can run)."""
    names = {s["name"] for s in sessions} | {s["session"] for s in sessions}
    gaps = [f"nox session {name!r}" for name in entry.sessions if name not in names]
    helps: dict[str, str | None] = {}
    for option in entry.options:
        command, _, flag = option.partition(" ")
        if command not in helps:
            helps[command] = helper(command)
        text = helps[command]
        if text is None:
            gaps.append(f"command 'difflab {command}'")
        elif flag and not re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", text):
            gaps.append(f"option 'difflab {option}'")
    return gaps


def nightly_matrix(
    sessions: list[dict[str, Any]], helper: Callable[[str], str | None] = difflab_help
) -> tuple[dict[str, list[dict[str, str]]], dict[str, list[str]]]:
    """The nightly ``include`` list (entries that can run) and, for the others, what they lack."""
    include, skipped = [], {}
    for entry in NIGHTLY:
        gaps = missing(entry, sessions, helper)
        if gaps:
            skipped[entry.slug] = gaps
        else:
            include.append({"slug": entry.slug, "title": entry.title, "paths": "\n".join(entry.artifacts)})
    return {"include": include}, skipped


def nightly_run(name: str, sessions: list[dict[str, Any]], helper: Callable[[str], str | None] = difflab_help) -> int:
    """Run one entry's commands in order; the first failing command's status is the result."""
    entry = next((e for e in NIGHTLY if e.slug == name), None)
    if entry is None:
        print(f"no nightly entry {name!r} (known: {', '.join(e.slug for e in NIGHTLY)})", file=sys.stderr)
        return 2
    gaps = missing(entry, sessions, helper)
    if gaps:
        print(f"nightly {name}: cannot run, missing {', '.join(gaps)}", file=sys.stderr)
        return 2
    for command in entry.commands:
        print(f"$ {command}", flush=True)
        code = subprocess.run(shlex.split(command), cwd=ROOT, check=False).returncode
        if code != 0:
            return code
    return 0


# -- the workflow text -------------------------------------------------------------------------------
def _steps_setup(indent: str = "      ") -> str:
    return (
        f"{indent}- uses: {ACTIONS['checkout'].uses()}\n"
        f"{indent}  with:\n"
        f"{indent}    persist-credentials: false\n"
        f"{indent}- uses: {ACTIONS['setup-python'].uses()}\n"
        f"{indent}  with:\n"
        f'{indent}    python-version: "{PYTHON}"\n'
        f"{indent}- name: tools (pinned in ci/requirements.txt)\n"
        f"{indent}  run: python -m pip install --quiet -r ci/requirements.txt\n"
    )


HEADER = """\
# GENERATED by ci/gen_workflow.py from its tables; edit those and run `python ci/gen_workflow.py write`.
# The tests (and the plan job) fail when this file differs from what the script renders.
#
# plan    -> checks this file, then emits the CPU matrix from `nox --list --json` (never hand-copied)
#            and, on schedule/dispatch, the nightly entries whose sessions and commands exist
# cpu     -> one job per nox session cell (side(fix, side), tests, lint, contains, ...)
# merge   -> `nox -s merge`: the side cells' observations judged into a sealed run folder,
#            `nox -s pack` (difflab pack) -> difflab-ci.tar.gz; the verdict table goes to the job summary
# sign    -> keyless Sigstore signature of that tarball (the only job with id-token: write)
# gpu     -> GPU tier on self-hosted H100 / H200 runners, only if the repository variable
#            DIFFLAB_GPU_RUNNERS is 'true', never for pull requests
# nightly -> the NIGHTLY table of ci/gen_workflow.py (schedule and manual dispatch only):
{nightly}# report  -> every JUnit file merged, the table written to the job summary
# dist    -> on a version tag (v*), once the CPU cells pass: `python -m build`, once; the tag must be the version
# publish -> uploads exactly those files to PyPI by trusted publishing (OIDC, no token), behind the `pypi`
#            environment (its protection rules are the gate)
#
# Secrets: none. Permissions: contents: read per job; id-token: write for `sign` and `publish` only.
name: difflab

on:
  push:
    branches: [main]
    tags: ["v*"]
  pull_request:
  workflow_dispatch:
  schedule:
    - cron: "17 3 * * *"

permissions: {{}}

concurrency:
  group: difflab-${{{{ github.ref }}}}
  cancel-in-progress: true

env:
  FORCE_COLOR: "1"
  PYTHONUNBUFFERED: "1"
  PIP_DISABLE_PIP_VERSION_CHECK: "1"

jobs:
"""


def _header() -> str:
    lines = []
    for entry in NIGHTLY:
        needs = [f"nox -s {s}" for s in entry.sessions] + [f"difflab {o}" for o in entry.options]
        lines.append(f"#              {entry.slug}: {' && '.join(entry.commands)}  (needs {', '.join(needs)})\n")
    return HEADER.format(nightly="".join(lines))


PLAN = """\
  plan:
    name: plan (matrices from nox sessions)
    runs-on: ubuntu-latest
    timeout-minutes: 15
    permissions:
      contents: read
    outputs:
      matrix: ${{ steps.cpu.outputs.matrix }}
      nightly: ${{ steps.nightly.outputs.nightly }}
      nightly-any: ${{ steps.nightly.outputs.nightly-any }}
    steps:
@@setup@@      - name: this workflow is what ci/gen_workflow.py renders, naming only existing sessions
        run: python ci/gen_workflow.py check
      - id: cpu
        name: the CPU matrix
        run: python ci/gen_workflow.py matrix --github-output
      - name: difflab (the nightly entries' commands are looked up in its --help)
        if: ${{ github.event_name == 'schedule' || github.event_name == 'workflow_dispatch' }}
        run: python -m pip install --quiet .
      - id: nightly
        name: the nightly matrix (entries whose sessions and commands exist)
        if: ${{ github.event_name == 'schedule' || github.event_name == 'workflow_dispatch' }}
        run: python ci/gen_workflow.py nightly --github-output

"""

CPU = """\
  cpu:
    name: cpu ${{ matrix.slug }}
    needs: plan
    runs-on: ubuntu-latest
    timeout-minutes: 60
    permissions:
      contents: read
    strategy:
      fail-fast: false
      matrix: ${{ fromJSON(needs.plan.outputs.matrix) }}
    env:
      NOX_SESSION_NAME: ${{ matrix.session }}
      NOX_POSARGS: ${{ matrix.posargs }}
    steps:
@@setup@@      - uses: @@cache@@
        with:
          path: ~/.cache/sglang-difflab
          key: difflab-${{ runner.os }}-${{ hashFiles('matrices/*.toml', 'src/difflab/environment/*.txt') }}
          # a release (tag) run never restores a cache another run could have written
          lookup-only: ${{ startsWith(github.ref, 'refs/tags/') }}
      - name: nox session
        run: python -m nox -s "$NOX_SESSION_NAME" -- $NOX_POSARGS
      - uses: @@upload-artifact@@
        if: ${{ !cancelled() }}
        with:
          name: cpu-${{ matrix.slug }}
          path: results/
          if-no-files-found: warn

"""

MERGE = """\
  merge:
    name: merge side cells (sealed run folder, packed)
    needs: cpu
    if: ${{ !cancelled() }}
    runs-on: ubuntu-latest
    timeout-minutes: 30
    permissions:
      contents: read
    steps:
@@setup@@      - uses: @@download-artifact@@
        with:
          pattern: cpu-side-*
          path: results
          merge-multiple: true
      - name: judge the cells into results/ci-merged (sealed)
        run: python -m nox -s merge
      - name: pack the sealed run folder (difflab pack -> results/difflab-ci.tar.gz)
        if: ${{ !cancelled() && hashFiles('results/ci-merged/SHA256SUMS') != '' }}
        run: python -m nox -s pack
      - name: verdict table in the job summary
        if: ${{ !cancelled() && hashFiles('results/ci-merged/summary.md') != '' }}
        run: |
          sed '/^## /,$d' results/ci-merged/summary.md >> "$GITHUB_STEP_SUMMARY"
          {
            echo ""
            echo "Signing key of this run (Ed25519): \\`$(cat results/ci-merged/keys/signing-key.fingerprint)\\`"
            echo ""
            echo "Bundle: \\`difflab-ci.tar.gz\\` sha256 \\`$(sha256sum results/difflab-ci.tar.gz | cut -d' ' -f1)\\`"
          } >> "$GITHUB_STEP_SUMMARY"
      - uses: @@upload-artifact@@
        if: ${{ !cancelled() }}
        with:
          name: evidence
          path: |
            results/difflab-ci.tar.gz
            results/ci-merged/junit.xml
          if-no-files-found: error

"""

SIGN = """\
  sign:
    name: sign the packed bundle (Sigstore, keyless)
    needs: merge
    if: ${{ !cancelled() && github.event_name != 'pull_request' }}
    runs-on: ubuntu-latest
    timeout-minutes: 15
    permissions:
      contents: read
      id-token: write # Sigstore keyless signing: the OIDC token names this workflow as the signer
    steps:
@@setup@@      - uses: @@download-artifact@@
        with:
          name: evidence
          path: evidence
      - name: sign difflab-ci.tar.gz with this workflow's OIDC identity
        run: python -m sigstore sign --bundle evidence/difflab-ci.tar.gz.sigstore.json evidence/difflab-ci.tar.gz
      - name: verify it as a user would (offline, pinned to this workflow's identity)
        run: |
          python -m pip install --quiet '.[sigstore]'
          difflab verify evidence/difflab-ci.tar.gz --sigstore-identity "https://github.com/$GITHUB_WORKFLOW_REF"
      - uses: @@upload-artifact@@
        with:
          name: evidence-signed
          path: |
            evidence/difflab-ci.tar.gz
            evidence/difflab-ci.tar.gz.sigstore.json
            evidence/ci-merged/junit.xml
          if-no-files-found: error

"""

GPU = """\
  gpu:
    name: gpu ${{ matrix.gpu }}
    # Self-hosted GPU runners never run pull-request code, and only where the repository opts in.
    if: ${{ vars.DIFFLAB_GPU_RUNNERS == 'true' && github.event_name != 'pull_request' }}
    runs-on: [self-hosted, linux, gpu, "${{ matrix.gpu }}"]
    timeout-minutes: 240
    permissions:
      contents: read
    strategy:
      fail-fast: false
      matrix:
        gpu: [h100, h200]
    env:
      GPU_LABEL: ${{ matrix.gpu }}
      # TOML, e.g.  [images]
      #             "0.5.20" = "lmsysorg/sglang:v0.5.20@sha256:<digest>"
      DIFFLAB_GPU_IMAGES: ${{ vars.DIFFLAB_GPU_IMAGES }}
    steps:
      - uses: @@checkout@@
        with:
          persist-credentials: false
      - name: environment
        run: |
          python3.11 -m venv .venv
          .venv/bin/pip install --quiet -e '.[gpu]'
      - name: pinned images
        run: |
          if [ -z "$DIFFLAB_GPU_IMAGES" ]; then
            echo "::error::set the repository variable DIFFLAB_GPU_IMAGES: a TOML [images] table of REF@sha256 digests"
            exit 2
          fi
          printf '%s\\n' "$DIFFLAB_GPU_IMAGES" > gpu-images.toml
      - name: difflab gpu (exit 3 = this runner lacks a GPU prerequisite, which is a failure here)
        run: >-
          .venv/bin/difflab gpu --images gpu-images.toml --out "results/gpu-$GPU_LABEL"
          --hf-cache "$HOME/.cache/huggingface"
      - uses: @@upload-artifact@@
        if: ${{ !cancelled() }}
        with:
          name: gpu-${{ matrix.gpu }}
          path: results/gpu-${{ matrix.gpu }}/
          if-no-files-found: warn

"""

NIGHTLY_JOB = """\
  nightly:
    name: nightly ${{ matrix.slug }}
    needs: plan
    if: ${{ needs.plan.outputs.nightly-any == 'true' }}
    runs-on: ubuntu-latest
    timeout-minutes: 120
    permissions:
      contents: read
    strategy:
      fail-fast: false
      matrix: ${{ fromJSON(needs.plan.outputs.nightly) }}
    env:
      NIGHTLY_SLUG: ${{ matrix.slug }}
    steps:
@@setup@@      - uses: @@cache@@
        with:
          path: ~/.cache/sglang-difflab
          key: difflab-${{ runner.os }}-${{ hashFiles('matrices/*.toml', 'src/difflab/environment/*.txt') }}
          # a release (tag) run never restores a cache another run could have written
          lookup-only: ${{ startsWith(github.ref, 'refs/tags/') }}
      - name: difflab
        run: python -m pip install --quiet .
      - name: the entry's commands (NIGHTLY in ci/gen_workflow.py)
        run: python ci/gen_workflow.py nightly-run "$NIGHTLY_SLUG"
      - uses: @@upload-artifact@@
        if: ${{ !cancelled() }}
        with:
          name: nightly-${{ matrix.slug }}
          path: ${{ matrix.paths }}
          if-no-files-found: warn

"""

REPORT = """\
  report:
    name: report (JUnit + summary)
    needs: [cpu, merge, gpu, nightly]
    if: ${{ !cancelled() }}
    runs-on: ubuntu-latest
    timeout-minutes: 15
    permissions:
      contents: read
    steps:
@@setup@@      - uses: @@download-artifact@@
        with:
          path: artifacts
      - name: merge JUnit files and write the job summary
        run: >-
          python ci/merge_junit.py --out results/junit-merged.xml --summary "$GITHUB_STEP_SUMMARY"
          'artifacts/**/junit*.xml' 'artifacts/**/junit/*.xml'
"""

RELEASE = """\
  dist:
    name: build the release (sdist and wheel, once)
    needs: cpu
    if: ${{ github.event_name == 'push' && startsWith(github.ref, 'refs/tags/v') }}
    runs-on: ubuntu-latest
    timeout-minutes: 15
    permissions:
      contents: read
    steps:
@@setup@@      - name: sdist and wheel (the publish job uploads exactly these)
        run: python -m build --outdir dist
      - name: the tag names the version being released (difflab.__version__)
        env:
          TAG: ${{ github.ref_name }}
        run: |
          if [ ! -f "dist/sglang_difflab-${TAG#v}-py3-none-any.whl" ]; then
            echo "::error::tag $TAG is not the package's version; built: $(ls dist)"
            exit 1
          fi
      - uses: @@upload-artifact@@
        with:
          name: dist
          path: dist/
          if-no-files-found: error

  publish:
    name: publish to PyPI (trusted publishing)
    needs: dist
    if: ${{ github.event_name == 'push' && startsWith(github.ref, 'refs/tags/v') }}
    runs-on: ubuntu-latest
    timeout-minutes: 15
    environment:
      name: pypi
      url: https://pypi.org/project/sglang-difflab/
    permissions:
      id-token: write # PyPI trusted publishing: the OIDC token names this workflow and environment
    steps:
      - uses: @@download-artifact@@
        with:
          name: dist
          path: dist
      - uses: @@pypi-publish@@
        with:
          packages-dir: dist/

"""

JOBS = (PLAN, CPU, MERGE, SIGN, GPU, NIGHTLY_JOB, RELEASE, REPORT)


def render() -> str:
    """The whole workflow file, deterministic: the tables above are its only inputs."""
    body = "".join(JOBS).replace("@@setup@@", _steps_setup())
    for name, action in ACTIONS.items():
        body = body.replace(f"@@{name}@@", action.uses())
    leftover = re.findall(r"@@[\w-]+@@", body)
    if leftover:
        raise SystemExit(f"unknown placeholders {sorted(set(leftover))}")
    return _header() + body


# -- checks --------------------------------------------------------------------------------------------
_NOX_CALL = re.compile(r"\bnox\b[^\n]*?\s-s\s+(\"[^\"]+\"|'[^']+'|\S+)")
# The one session name that comes from the generated matrix (through the job's env, never expanded).
MATRIX_SESSION = "$NOX_SESSION_NAME"


def referenced(workflow_text: str) -> list[str]:
    """Session names the workflow passes to ``nox -s`` (quotes removed; YAML comments ignored)."""
    code = "\n".join(line for line in workflow_text.splitlines() if not line.lstrip().startswith("#"))
    return [m.group(1).strip("\"'`") for m in _NOX_CALL.finditer(code)]


def check(workflow: Path, sessions: list[dict[str, Any]]) -> list[str]:
    """Problems: stale text, a ``nox -s X`` whose X is no session, a matrix not fed from this script."""
    try:
        text = workflow.read_text()
    except OSError as exc:
        return [f"cannot read the workflow ({exc.strerror}): run `python ci/gen_workflow.py write`"]
    known = {s["session"] for s in sessions} | {s["name"] for s in sessions}
    problems = []
    for name in referenced(text):
        if "${{" in name:
            problems.append(f"nox -s {name}: a template expanded into a script (pass it through env:)")
        elif name.startswith("$"):
            if name != MATRIX_SESSION:
                problems.append(f"nox -s {name}: only {MATRIX_SESSION} (the generated matrix) may be a variable")
        elif name not in known:
            problems.append(f"nox -s {name}: no such session (known: {', '.join(sorted(known))})")
    if "fromJSON(needs.plan.outputs.matrix)" not in text:
        problems.append("the CPU job's matrix is not fromJSON(needs.plan.outputs.matrix)")
    if "ci/gen_workflow.py matrix" not in text:
        problems.append("no job runs `python ci/gen_workflow.py matrix`")
    rendered = render()
    if text != rendered:
        diff = difflib.unified_diff(text.splitlines(), rendered.splitlines(), "committed", "rendered", n=1, lineterm="")
        shown = "\n".join(list(diff)[:40])
        fix = "run `python ci/gen_workflow.py write`"
        problems.append(f"differs from what ci/gen_workflow.py renders ({fix}):\n{shown}")
    return problems


def _github_output(**values: str) -> None:
    path = os.environ.get("GITHUB_OUTPUT")
    if not path:
        raise SystemExit("--github-output: $GITHUB_OUTPUT is not set")
    with open(path, "a") as fh:
        for key, value in values.items():
            fh.write(f"{key}={value}\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("matrix", help="print the CPU job matrix as JSON")
    m.add_argument("--github-output", action="store_true", help="also append matrix=<json> to $GITHUB_OUTPUT")
    n = sub.add_parser("nightly", help="print the nightly matrix as JSON (entries whose prerequisites exist)")
    n.add_argument("--github-output", action="store_true", help="also append nightly=<json> to $GITHUB_OUTPUT")
    r = sub.add_parser("nightly-run", help="run one nightly entry's commands")
    r.add_argument("slug", choices=[e.slug for e in NIGHTLY])
    w = sub.add_parser("write", help="render the workflow file")
    w.add_argument("workflow", type=Path, nargs="?", default=WORKFLOW)
    c = sub.add_parser("check", help="the workflow is what this script renders and names only existing sessions")
    c.add_argument("workflow", type=Path, nargs="?", default=WORKFLOW)
    args = parser.parse_args(argv)
    if args.cmd == "write":
        args.workflow.parent.mkdir(parents=True, exist_ok=True)
        args.workflow.write_text(render())
        print(f"wrote {args.workflow}")
        return 0
    sessions = nox_sessions()
    if args.cmd == "matrix":
        data = json.dumps(matrix(sessions), separators=(",", ":"))
        print(data)
        if args.github_output:
            _github_output(matrix=data)
        return 0
    if args.cmd == "nightly":
        found, skipped = nightly_matrix(sessions)
        for entry, gaps in skipped.items():
            print(f"::notice::nightly {entry} not scheduled: missing {', '.join(gaps)}", file=sys.stderr)
        data = json.dumps(found, separators=(",", ":"))
        print(data)
        if args.github_output:
            _github_output(nightly=data, **{"nightly-any": "true" if found["include"] else "false"})
        return 0
    if args.cmd == "nightly-run":
        return nightly_run(args.slug, sessions)
    problems = check(args.workflow, sessions)
    for p in problems:
        print(f"{args.workflow}: {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
