#!/usr/bin/env python3
"""Generate the CI job matrix from the nox sessions, so the workflow can never go stale.

The workflow (ci/workflows/difflab.yml) has a ``plan`` job that runs this script
and feeds its JSON to the CPU job's ``strategy.matrix`` with ``fromJSON``; no
session name is copied by hand into the YAML.

    python ci/gen_workflow.py matrix [--github-output]   # {"include": [...]} (and matrix=... for Actions)
    python ci/gen_workflow.py check ci/workflows/difflab.yml   # every nox session the workflow names exists
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
NOXFILE = ROOT / "noxfile.py"
WORKFLOW = ROOT / "ci" / "workflows" / "difflab.yml"
# nox lists only the *selected* sessions with --list; a keyword expression that is always true selects all.
ALL_SESSIONS = "not __no_session_is_named_this__"
# Sessions that are not CPU matrix cells, and why.
NOT_CELLS = {
    "lab": "the side cells plus the merge job do the same work in parallel",
    "merge": "runs as its own job once every side cell has finished",
    "throughput": "a timing: the nightly job runs it, not every push on a shared runner",
}
# Extra arguments per session name, so each cell leaves a JUnit file for the report job.
POSARGS = {"tests": "--junitxml=results/junit/tests.xml"}


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


def matrix(sessions: list[dict[str, Any]]) -> dict[str, list[dict[str, str]]]:
    """The ``include`` list of the CPU job: one cell per session except :data:`NOT_CELLS`."""
    include = []
    for s in sessions:
        if s["name"] in NOT_CELLS:
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


_NOX_CALL = re.compile(r"\bnox\b[^\n]*?\s-s\s+(\"[^\"]+\"|'[^']+'|\S+)")


def referenced(workflow_text: str) -> list[str]:
    """Session names the workflow passes to ``nox -s`` (quotes removed; YAML comments ignored)."""
    code = "\n".join(line for line in workflow_text.splitlines() if not line.lstrip().startswith("#"))
    return [m.group(1).strip("\"'`") for m in _NOX_CALL.finditer(code)]


def check(workflow: Path, sessions: list[dict[str, Any]]) -> list[str]:
    """Problems: a literal ``nox -s X`` whose X is no session, or a matrix not fed from this script."""
    text = workflow.read_text()
    known = {s["session"] for s in sessions} | {s["name"] for s in sessions}
    problems = []
    for name in referenced(text):
        if "${{" in name:
            if name != "${{ matrix.session }}":
                problems.append(f"templated session {name!r}: only ${{{{ matrix.session }}}} is generated")
            continue
        if name not in known:
            problems.append(f"nox -s {name}: no such session (known: {', '.join(sorted(known))})")
    if "fromJSON(needs.plan.outputs.matrix)" not in text:
        problems.append("the CPU job's matrix is not fromJSON(needs.plan.outputs.matrix)")
    if "ci/gen_workflow.py matrix" not in text:
        problems.append("no job runs `python ci/gen_workflow.py matrix`")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("matrix", help="print the CPU job matrix as JSON")
    m.add_argument("--github-output", action="store_true", help="also append matrix=<json> to $GITHUB_OUTPUT")
    c = sub.add_parser("check", help="check that a workflow only names existing nox sessions")
    c.add_argument("workflow", type=Path, nargs="?", default=WORKFLOW)
    args = parser.parse_args(argv)
    sessions = nox_sessions()
    if args.cmd == "matrix":
        data = json.dumps(matrix(sessions), separators=(",", ":"))
        print(data)
        if args.github_output:
            with open(os.environ["GITHUB_OUTPUT"], "a") as fh:
                fh.write(f"matrix={data}\n")
        return 0
    problems = check(args.workflow, sessions)
    for p in problems:
        print(f"{args.workflow}: {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
