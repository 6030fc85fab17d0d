"""Judge observations recorded by separate ``difflab observe`` runs (CI fan-out cells)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from difflab.bundle import seal
from difflab.diff.verdict import FixVerdict, judge_all
from difflab.errors import ConfigError
from difflab.files.atomic import results_folder
from difflab.matrix import load_matrix
from difflab.observation import Observation
from difflab.progress import Reporter
from difflab.report import write_reports
from difflab.report.record import RunRecord, is_run_folder


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


def merge(
    folders: list[Path],
    out: Path,
    matrix_path: Path | None,
    bundle: bool,
    reporter: Reporter | None = None,
    force: bool = False,
) -> list[FixVerdict]:
    observations = collect(folders)
    if matrix_path is None:
        copies = sorted(p for f in folders for p in f.glob("**/matrix.toml"))
        if not copies:
            raise ConfigError("no matrix.toml in the observed folders: pass --matrix")
        matrix_path = copies[0]
    matrix = load_matrix(matrix_path)
    matrix.select(sorted({o.fix for o in observations}))  # an observation of a fix the matrix lacks: bad input
    # Every fix of the matrix is judged: one whose cells left no observation is an error, never left out.
    fixes = list(matrix.fixes)
    ids = [f.id for f in fixes]
    labels = {(o.fix, o.side): label(o) for o in observations}
    verdicts = judge_all(fixes, observations, labels)
    record = RunRecord(command="merge", fixes=ids)
    record.details = {
        "inputs": [str(f) for f in folders],
        "sources": {label(o)["label"]: o.source for o in observations if o.source},
    }
    with results_folder(out, force=force, ours=is_run_folder) as work:
        for obs in observations:
            obs.write(work / "observations" / obs.fix / obs.side / f"{obs.probe}.json")
        record.write(work, 0 if all(v.passed for v in verdicts) else 1, matrix=(matrix.path, matrix.sha256))
        write_reports(work, verdicts)
        if bundle:
            seal(work, echo=(reporter or Reporter()).say)
    return verdicts
