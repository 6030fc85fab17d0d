"""Judge observations recorded by separate ``difflab observe`` runs (CI fan-out cells)."""

from __future__ import annotations

import datetime as dt
import json
import shutil
from pathlib import Path
from typing import Any

from difflab.diff.verdict import FixVerdict
from difflab.errors import ConfigError
from difflab.files.atomic import atomic_folder
from difflab.matrix import load_matrix
from difflab.observation import Observation
from difflab.workflows.run import judge_all, write_reports


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


def merge(folders: list[Path], out: Path, matrix_path: Path | None, bundle: bool) -> list[FixVerdict]:
    observations = collect(folders)
    if matrix_path is None:
        copies = sorted(p for f in folders for p in f.glob("**/matrix.toml"))
        if not copies:
            raise ConfigError("no matrix.toml in the observed folders: pass --matrix")
        matrix_path = copies[0]
    matrix = load_matrix(matrix_path)
    ids = sorted({o.fix for o in observations})
    fixes = matrix.select(ids)
    labels = {(o.fix, o.side): label(o) for o in observations}
    verdicts = judge_all(fixes, observations, labels)
    out = out.resolve()
    now = dt.datetime.now(dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
    sources = {label(o)["label"]: o.source for o in observations if o.source}
    with atomic_folder(out) as work:
        for obs in observations:
            obs.write(work / "observations" / obs.fix / obs.side / f"{obs.probe}.json")
        shutil.copyfile(matrix_path, work / "matrix.toml")
        (work / "run.json").write_text(
            json.dumps(
                {
                    "schema": 1,
                    "tool": "sglang-difflab",
                    "command": "merge",
                    "inputs": [str(f) for f in folders],
                    "fixes": ids,
                    "started_at": now,
                    "finished_at": now,
                    "sources": sources,
                    "exit_code": 0 if all(v.passed for v in verdicts) else 1,
                },
                indent=2,
                sort_keys=True,
            )
            + "\n"
        )
        write_reports(work, verdicts)
        if bundle:
            from difflab.bundle import seal

            seal(work)
    return verdicts
