"""One ``git bisect run`` step: probe the checked-out commit and answer good (0), bad (1) or skip (125).

``python -m difflab.workflows.bisect_step --matrix M --fix F --good-like base|head [--probe P ...]``
runs in the bisect worktree (the current directory); its ``python/`` holds
``sglang``. The commit is classified by the fix's probes against the
matrix's declared values: every probe head-like → ``head``, every probe
base-like → ``base``; anything else (a probe error, a control off, some
probes each way) cannot place the commit, so the step says skip. Exit codes
above 127 make ``git bisect run`` abort; this script uses 128 for its own
failures (bad arguments, a broken environment), never for a commit.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import NoReturn

from difflab.diff.likeness import BackportVerdict, judge_backport
from difflab.environment.shared import SharedEnvironment
from difflab.errors import ConfigError
from difflab.files.names import argument_path
from difflab.matrix import Fix, load_matrix
from difflab.matrix.model import ProbeSpec
from difflab.runner.base import DEFAULT_TIMEOUT_S
from difflab.runner.jobs import build_jobs
from difflab.runner.subprocess import SubprocessRunner
from difflab.source.base import MaterialisedSource

GOOD, BAD, SKIP, ABORT = 0, 1, 125, 128
LIKE = {"present": "head", "absent": "base"}


def select_probes(fix: Fix, names: list[str] | None) -> list[ProbeSpec]:
    if not fix.probes:
        raise ConfigError(f"fix {fix.id!r} declares no probes in the matrix")
    if not names:
        return list(fix.probes)
    known = {p.name: p for p in fix.probes}
    missing = [n for n in names if n not in known]
    if missing:
        raise ConfigError(f"fix {fix.id!r} has no probe(s) {missing} (known: {sorted(known)})")
    return [known[n] for n in names]


def behaviours(
    fix: Fix,
    probes: list[ProbeSpec],
    sources: dict[str, MaterialisedSource],
    env: SharedEnvironment,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> dict[str, tuple[str, BackportVerdict]]:
    """``base``, ``head`` or ``undetermined`` per named source (probed in parallel), with the comparison."""
    sub = Fix(id=fix.id, pr=fix.pr, title=fix.title, base=fix.base, head=fix.head, probes=tuple(probes))
    jobs, known = build_jobs([sub], {(fix.id, name): src for name, src in sources.items()}, None, timeout_s)
    observed = known + SubprocessRunner(environment=env).run(jobs)
    out = {}
    for name in sources:
        verdict = judge_backport(sub, {o.probe: o for o in observed if o.side == name})
        out[name] = (LIKE.get(verdict.verdict, "undetermined"), verdict)
    return out


def _commit() -> tuple[str, str]:
    out = subprocess.run(["git", "log", "-1", "--format=%H%x00%s"], capture_output=True, text=True, check=True)
    sha, _, subject = out.stdout.strip().partition("\x00")
    return sha, subject


class _Parser(argparse.ArgumentParser):
    """Bad arguments are the lab's failure (128): argparse's own exit status 2 would tell git "bad commit"."""

    def error(self, message: str) -> NoReturn:
        raise ConfigError(f"{self.prog}: {message}")


def main(argv: list[str] | None = None) -> int:
    parser = _Parser(prog="python -m difflab.workflows.bisect_step")
    parser.add_argument("--matrix", type=argument_path, required=True)
    parser.add_argument("--fix", required=True)
    parser.add_argument("--good-like", choices=["base", "head"], required=True)
    parser.add_argument("--probe", action="append", dest="probes")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S)
    parser.add_argument("--log", type=argument_path, help="append one JSON line per step here")
    try:
        args = parser.parse_args(argv)
        fix = load_matrix(args.matrix).fix(args.fix)
        probes = select_probes(fix, args.probes)
        sha, subject = _commit()
        root = Path.cwd() / "python"
        source = MaterialisedSource(
            label=sha[:12], kind="git", root=root, identity={"kind": "git", "commit": sha}, digest=f"git-commit:{sha}"
        )
        started = time.perf_counter()
        if not (root / "sglang" / "__init__.py").is_file():
            like, reason = "undetermined", "no python/sglang package at this commit"
        else:
            env = SharedEnvironment().ensure()
            like, verdict = behaviours(fix, probes, {"step": source}, env, args.timeout)["step"]
            reason = verdict.reason
    except Exception as exc:  # noqa: BLE001 - any failure of the lab itself must abort the bisection
        print(f"bisect step failed: {exc}", file=sys.stderr)
        return ABORT
    code = SKIP if like == "undetermined" else (GOOD if like == args.good_like else BAD)
    answer = {GOOD: "good", BAD: "bad", SKIP: "skip"}[code]
    print(f"difflab bisect: {sha[:12]} behaves like {like}: {answer} ({reason})")
    if args.log:
        with args.log.open("a") as fh:
            fh.write(
                json.dumps(
                    {
                        "commit": sha,
                        "subject": subject,
                        "like": like,
                        "answer": answer,
                        "reason": reason,
                        "duration_s": round(time.perf_counter() - started, 3),
                    }
                )
                + "\n"
            )
    return code


if __name__ == "__main__":
    raise SystemExit(main())
