"""Judge observations recorded by separate ``difflab observe`` runs (CI fan-out cells)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from difflab.diff.verdict import FixVerdict, judge_all
from difflab.errors import ConfigError
from difflab.matrix import Fix, Matrix
from difflab.observation import Observation
from difflab.progress import Reporter
from difflab.report import write_reports
from difflab.workflows.session import Outcome, ProbeOptions, Session


def collect(folders: list[Path]) -> list[Observation]:
    """Every observation under ``folders`` (``observations/<fix>/<side>/<probe>.json``)."""
    found: dict[tuple[str, str, str], Observation] = {}
    for folder in folders:
        if not folder.is_dir():
            raise ConfigError(f"{folder}: not a folder")
        for path in sorted(folder.glob("**/observations/*/*/*.json")):
            obs = Observation.read(path)
            key = (obs.fix, obs.side, obs.probe)
            if key in found:
                raise ConfigError(f"{path}: a second observation of {obs.fix}/{obs.side}/{obs.probe}")
            found[key] = obs
    if not found:
        raise ConfigError(f"no observations under {', '.join(map(str, folders))}")
    return list(found.values())


def label(obs: Observation) -> dict[str, Any]:
    src = obs.source or {}
    name = src.get("version") or (str(src.get("commit", ""))[:12] or "unavailable")
    return {"label": name, **src}


@dataclass(kw_only=True)
class MergeRequest(ProbeOptions):
    """``difflab merge``: the folders the ``observe`` cells wrote; ``matrix`` None: the copy they recorded."""

    folders: list[Path]
    matrix: Path | None = None  # found in the folders when not given


@dataclass
class MergeOutcome(Outcome):
    verdicts: list[FixVerdict] = field(default_factory=list)


def _recorded_matrix(folders: list[Path]) -> Path:
    copies = sorted(p for f in folders for p in f.glob("**/matrix.toml"))
    if not copies:
        raise ConfigError("no matrix.toml in the observed folders: pass --matrix")
    return copies[0]


def execute(req: MergeRequest, reporter: Reporter | None = None) -> MergeOutcome:
    """Every fix of the matrix judged from the cells' observations; a fix whose cells left none is an error."""
    observations = collect(req.folders)
    observed = sorted({o.fix for o in observations})

    def every_fix(matrix: Matrix) -> list[Fix]:
        matrix.select(observed)  # an observation of a fix the matrix lacks: bad input
        return list(matrix.fixes)  # one whose cells left no observation is an error, never left out

    options = dataclasses.replace(req, matrix=req.matrix or _recorded_matrix(req.folders))
    session = Session.open("merge", options, reporter, select=every_fix, probe_files=False)
    labels = {(o.fix, o.side): label(o) for o in observations}
    verdicts = judge_all(session.fixes, observations, labels)
    session.record.details = {
        "inputs": [str(f) for f in req.folders],
        "sources": {label(o)["label"]: o.source for o in observations if o.source},
    }
    exit_code = 0 if all(v.passed for v in verdicts) else 1
    with session.folder() as work:
        for obs in observations:
            obs.write(work / "observations" / obs.fix / obs.side / f"{obs.probe}.json")
        write_reports(work, verdicts)
        session.finish(work, exit_code)
    return MergeOutcome(out_dir=session.out, exit_code=exit_code, verdicts=verdicts)


def merge(
    folders: list[Path],
    out: Path,
    matrix_path: Path | None,
    bundle: bool,
    reporter: Reporter | None = None,
    force: bool = False,
) -> list[FixVerdict]:
    """:func:`execute` with positional arguments; the verdicts only."""
    req = MergeRequest(folders=folders, out=out, matrix=matrix_path, bundle=bundle, force=force)
    return execute(req, reporter).verdicts
