"""``ci/mutation_score.py`` reads mutmut's records as mutmut leaves them and reports every mutant left.

The ``mutants/`` folder here is laid out as ``mutmut run`` writes it (one ``.meta``
per mutated file, exit codes by mutant name); the diff of each surviving mutant is
what mutmut's own ``get_diff_for_mutant`` would give (stood in for: mutmut is not a
test dependency).
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "ci" / "mutation_score.py"

DIFFS = {
    "difflab.diff.verdict.x_judge_probe__mutmut_2": (("if a > b:",), ("if a >= b:",)),
    "difflab.diff.verdict.xǁRuleǁapply__mutmut_1": (("return x",), ("return None",)),
    "difflab.matrix.load.x__fix__mutmut_4": (("pr <= 0",), ("pr <= 1",)),
}


@pytest.fixture
def score() -> ModuleType:
    spec = importlib.util.spec_from_file_location("mutation_score_under_test", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    module.changed_lines = lambda name, source: DIFFS[name]
    return module


def _mutants(tmp_path: Path, codes: dict[str, dict[str, int | None]]) -> Path:
    for source, by_key in codes.items():
        meta = tmp_path / "mutants" / f"{source}.meta"
        meta.parent.mkdir(parents=True, exist_ok=True)
        meta.write_text(json.dumps({"exit_code_by_key": by_key}))
    return tmp_path / "mutants"


def _allowlist(tmp_path: Path) -> Path:
    path = tmp_path / "allow.toml"
    path.write_text(
        "[[equivalent]]\nmodule = 'difflab.matrix.load'\nfunction = '_fix'\nremoved = ['pr <= 0']\n"
        "added = ['pr <= 1']\nreason = 'pr is an integer'\n"
        "[[equivalent]]\nmodule = 'difflab.diff.verdict'\nfunction = 'gone'\nremoved = ['a']\nadded = ['b']\n"
        "reason = 'stale'\n"
    )
    return path


def test_the_score_the_survivors_and_the_stale_entries_are_reported(
    tmp_path: Path, score: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    mutants = _mutants(
        tmp_path,
        {
            "src/difflab/diff/verdict.py": {
                "difflab.diff.verdict.x_judge_probe__mutmut_1": 1,
                "difflab.diff.verdict.x_judge_probe__mutmut_2": 0,
                "difflab.diff.verdict.xǁRuleǁapply__mutmut_1": 0,
                "difflab.diff.verdict.xǁRuleǁapply__mutmut_2": 152,
            },
            "src/difflab/matrix/load.py": {
                "difflab.matrix.load.x__fix__mutmut_3": 3,
                "difflab.matrix.load.x__fix__mutmut_4": 0,
            },
        },
    )
    code = score.main(["--mutants", str(mutants), "--allowlist", str(_allowlist(tmp_path)), "--threshold", "60"])
    out = capsys.readouterr().out.splitlines()
    assert out[1].split() == ["difflab.diff.verdict", "4", "2", "0", "2", "50.0%"]
    assert out[2].split() == ["difflab.matrix.load", "2", "1", "1", "0", "100.0%"]
    assert out[4].startswith("mutation score: 60.0% (3 of 5 non-equivalent mutants killed; 1 equivalent,")
    assert out[4].endswith("raw 50.0% of 6); threshold 60%")
    survivors = out[out.index("2 mutant(s) no test killed (kill each with a test, or explain it as equivalent):") :]
    assert survivors[1:7] == [
        "  difflab.diff.verdict.x_judge_probe__mutmut_2 [survived]  (difflab.diff.verdict: judge_probe)",
        "      - if a > b:",
        "      + if a >= b:",
        "  difflab.diff.verdict.xǁRuleǁapply__mutmut_1 [survived]  (difflab.diff.verdict: Rule.apply)",
        "      - return x",
        "      + return None",
    ]
    assert out[-5:-3] == [
        "1 allowlist entr(ies) match no surviving mutant (the code changed, or a test kills it now; an entry that"
        " truly cannot change behaviour and reads killed means some test failed whatever the mutant, so this run's"
        " kills are suspect):",
        "  difflab.diff.verdict: gone: b",
    ]
    assert out[-2:] == ["1 module(s) below the threshold of 60%:", "  difflab.diff.verdict: 50.0%"]
    assert code == 1  # 60 % overall, but one module is below it


def test_every_module_must_reach_the_threshold(
    tmp_path: Path, score: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    mutants = _mutants(
        tmp_path,
        {
            "src/difflab/diff/verdict.py": {f"difflab.diff.verdict.x_judge_probe__mutmut_{i}": 1 for i in range(9)},
            "src/difflab/matrix/load.py": {
                "difflab.matrix.load.x__fix__mutmut_3": 3,
                "difflab.matrix.load.x__fix__mutmut_4": 0,
            },
        },
    )
    args = ["--mutants", str(mutants), "--allowlist", str(tmp_path / "none.toml")]
    assert score.main([*args, "--threshold", "50"]) == 0  # 10 of 11 overall, load at 50 %
    assert "below the threshold" not in capsys.readouterr().out
    assert score.main([*args, "--threshold", "90"]) == 1  # 90.9 % overall, but load at 50 %
    out = capsys.readouterr().out.splitlines()
    assert "mutation score: 90.9% (10 of 11" in out[4]
    assert out[-2:] == ["1 module(s) below the threshold of 90%:", "  difflab.matrix.load: 50.0%"]
    assert score.main([*args, "--only", "difflab.diff.*"]) == 0  # a partial run scores its own modules
    assert "difflab.matrix.load" not in capsys.readouterr().out
    assert score.main([*args, "--only", "difflab.diff.*", "--only", "difflab.matrix.*"]) == 1
    assert "difflab.matrix.load: 50.0%" in capsys.readouterr().out


def test_a_partial_pass_is_said_and_hides_the_stale_entries(
    tmp_path: Path, score: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    mutants = _mutants(
        tmp_path, {"src/difflab/diff/verdict.py": {"difflab.diff.verdict.x_judge_probe__mutmut_1": None}}
    )
    assert score.main(["--mutants", str(mutants), "--allowlist", str(_allowlist(tmp_path))]) == 1
    out = capsys.readouterr().out
    assert "1 mutant(s) not checked: a partial pass" in out
    assert "allowlist entr(ies)" not in out


def test_no_results_is_exit_2(tmp_path: Path, score: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    assert score.main(["--mutants", str(tmp_path / "none")]) == 2
    assert "run `mutmut run` first" in capsys.readouterr().err
