"""The mutation score of the judging core, from the results a ``mutmut run`` left in ``mutants/``.

Prints the score per module and overall, then every mutant that no test killed and that the allowlist
(``ci/mutation-allowlist.toml``) does not explain as equivalent. Exit status 1 when any module's score,
or the overall one, is below the threshold (the modules below it are listed: a well-tested module must
not hide a weak one in the average); an allowlist entry that matches no surviving mutant is reported as
stale (fix or drop it). ``--only "difflab.report.*"`` (repeatable) scores the mutants a ``mutmut run``
limited to those globs checked, leaving the rest out.

An allowlist entry names the module, the function, and the exact lines the mutant changes (as mutmut
shows them: ``-`` before, ``+`` after), never mutmut's numbered mutant names, which shift whenever a
function changes. Run from the repository root: ``python ci/mutation_score.py`` (``nox -s mutation``).
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import sys
import tomllib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ALLOWLIST = ROOT / "ci" / "mutation-allowlist.toml"
THRESHOLD = 90.0
# mutmut's exit codes per mutant (mutmut.stats.status_by_exit_code); anything else is "suspicious".
STATUS = {1: "killed", 3: "killed", 0: "survived", 5: "no tests", 33: "no tests", 34: "skipped", 37: "killed"}
STATUS.update(dict.fromkeys((24, -24, 36, 152, 255), "timeout"))
DETECTED = {"killed", "timeout"}


@dataclass(frozen=True)
class Mutant:
    name: str
    module: str
    function: str
    status: str
    removed: tuple[str, ...] = ()
    added: tuple[str, ...] = ()

    def key(self) -> tuple[str, str, tuple[str, ...], tuple[str, ...]]:
        return (self.module, self.function, self.removed, self.added)


@dataclass(frozen=True)
class Equivalent:
    module: str
    function: str
    removed: tuple[str, ...]
    added: tuple[str, ...]
    reason: str

    def key(self) -> tuple[str, str, tuple[str, ...], tuple[str, ...]]:
        return (self.module, self.function, self.removed, self.added)


def split_name(name: str) -> tuple[str, str]:
    """``difflab.diff.verdict.x_judge_probe__mutmut_3`` -> (``difflab.diff.verdict``, ``judge_probe``);
    methods are ``xǁClassǁmethod`` -> ``Class.method``."""
    module, _, generated = name.rpartition(".")
    function = generated.rsplit("__mutmut_", 1)[0]
    if function.startswith("xǁ"):
        function = ".".join(part for part in function[2:].split("ǁ") if part)
    else:
        function = function.removeprefix("x_")
    return module, function


def results(mutants_dir: Path) -> dict[str, tuple[str, str]]:
    """Mutant name -> (status, source file), from mutmut's per-file ``.meta`` records."""
    found: dict[str, tuple[str, str]] = {}
    for meta in sorted([*mutants_dir.glob("src/**/*.py.meta"), *mutants_dir.glob("probes/**/*.py.meta")]):
        source = meta.relative_to(mutants_dir).as_posix().removesuffix(".meta")
        for name, code in json.loads(meta.read_text())["exit_code_by_key"].items():
            found[name] = ("not checked" if code is None else STATUS.get(code, "suspicious"), source)
    return found


def changed_lines(name: str, source: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The lines the mutant removes and adds, stripped (from mutmut's own diff)."""
    from mutmut.mutation.diff_apply import get_diff_for_mutant

    diff = get_diff_for_mutant(name, path=source).splitlines()
    body = [line for line in diff if not line.startswith(("---", "+++", "@@"))]
    removed = tuple(line[1:].strip() for line in body if line.startswith("-"))
    added = tuple(line[1:].strip() for line in body if line.startswith("+"))
    return removed, added


def load_allowlist(path: Path) -> list[Equivalent]:
    data = tomllib.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    entries = []
    for i, raw in enumerate(data.get("equivalent", [])):
        missing = {"module", "function", "removed", "added", "reason"} - set(raw)
        if missing or not str(raw.get("reason", "")).strip():
            raise SystemExit(f"{path}: equivalent[{i}]: needs module, function, removed, added and a reason")
        entries.append(
            Equivalent(raw["module"], raw["function"], tuple(raw["removed"]), tuple(raw["added"]), raw["reason"])
        )
    return entries


@dataclass
class Tally:
    """What a run's mutants came to: counts per module, and the mutants neither killed nor allowlisted."""

    per_module: dict[str, Counter[str]] = field(default_factory=dict)
    survivors: list[Mutant] = field(default_factory=list)
    used: set[tuple] = field(default_factory=set)
    """The allowlist keys some surviving mutant matched (the rest are stale)."""
    equivalent: int = 0

    @classmethod
    def of(cls, statuses: dict[str, tuple[str, str]], allowed: dict[tuple, Equivalent]) -> Tally:
        tally = cls()
        for name, (status, source) in sorted(statuses.items()):
            module, function = split_name(name)
            tally.per_module.setdefault(module, Counter())[status] += 1
            if status in DETECTED:
                continue
            if status == "not checked":  # an interrupted pass: counted as not killed, not diffed
                tally.survivors.append(Mutant(name, module, function, status))
                continue
            mutant = Mutant(name, module, function, status, *changed_lines(name, source))
            if mutant.key() in allowed:
                tally.used.add(mutant.key())
                tally.per_module[module]["equivalent"] += 1
                tally.equivalent += 1
            else:
                tally.survivors.append(mutant)
        return tally


def print_modules(per_module: dict[str, Counter[str]]) -> dict[str, float]:
    """One line per module; returns each module's score."""
    scores = {}
    print(f"{'module':34} {'mutants':>8} {'killed':>7} {'equiv.':>7} {'left':>5} {'score':>7}")
    for module, counts in sorted(per_module.items()):
        total = sum(v for k, v in counts.items() if k != "equivalent")
        killed = sum(counts[s] for s in DETECTED)
        left = total - killed - counts["equivalent"]
        scores[module] = 100.0 * killed / max(1, total - counts["equivalent"])
        print(f"{module:34} {total:8} {killed:7} {counts['equivalent']:7} {left:5} {scores[module]:6.1f}%")
    return scores


def print_score(statuses: dict[str, tuple[str, str]], equivalent: int, allowlist: Path, threshold: float) -> float:
    """The overall line; returns the score."""
    total = len(statuses)
    killed = sum(1 for s, _ in statuses.values() if s in DETECTED)
    score = 100.0 * killed / max(1, total - equivalent)
    where = allowlist.relative_to(ROOT) if allowlist.is_relative_to(ROOT) else allowlist
    print(
        f"\nmutation score: {score:.1f}% ({killed} of {total - equivalent} non-equivalent mutants killed; "
        f"{equivalent} equivalent, allowlisted in {where}; "
        f"raw {100.0 * killed / total:.1f}% of {total}); threshold {threshold:.0f}%"
    )
    return score


def print_left(tally: Tally, allow: list[Equivalent]) -> None:
    """The mutants not checked, those no test killed (with their lines), and the stale allowlist entries."""
    unchecked = [m for m in tally.survivors if m.status == "not checked"]
    survivors = [m for m in tally.survivors if m.status != "not checked"]
    if unchecked:
        print(f"\n{len(unchecked)} mutant(s) not checked: a partial pass (mutant names given, or interrupted)")
    if survivors:
        print(f"\n{len(survivors)} mutant(s) no test killed (kill each with a test, or explain it as equivalent):")
        for m in survivors:
            print(f"  {m.name} [{m.status}]  ({m.module}: {m.function})")
            for line in m.removed:
                print(f"      - {line}")
            for line in m.added:
                print(f"      + {line}")
    stale = [e for e in allow if e.key() not in tally.used]
    if stale and not unchecked:
        print(
            f"\n{len(stale)} allowlist entr(ies) match no surviving mutant (the code changed, or a test kills it now;"
            " an entry that truly cannot change behaviour and reads killed means some test failed whatever the"
            " mutant, so this run's kills are suspect):"
        )
        for e in stale:
            print(f"  {e.module}: {e.function}: {' / '.join(e.added)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mutants", type=Path, default=ROOT / "mutants")
    parser.add_argument("--allowlist", type=Path, default=ALLOWLIST)
    parser.add_argument("--threshold", type=float, default=THRESHOLD, help="for each module and overall")
    parser.add_argument(
        "--only", metavar="GLOB", action="append", help="score only the mutants whose names match one (a partial run)"
    )
    args = parser.parse_args(argv)

    statuses = results(args.mutants)
    if args.only:
        statuses = {name: v for name, v in statuses.items() if any(fnmatch.fnmatchcase(name, g) for g in args.only)}
    if not statuses:
        print(f"no mutmut results under {args.mutants}: run `mutmut run` first", file=sys.stderr)
        return 2
    allow = load_allowlist(args.allowlist)
    if args.only:  # the other modules' entries are neither used nor stale in a partial run
        allow = [e for e in allow if any(fnmatch.fnmatchcase(f"{e.module}.x", g) for g in args.only)]
    tally = Tally.of(statuses, {e.key(): e for e in allow})
    below = {m: s for m, s in print_modules(tally.per_module).items() if s < args.threshold}
    score = print_score(statuses, tally.equivalent, args.allowlist, args.threshold)
    print_left(tally, allow)
    if below:
        print(f"\n{len(below)} module(s) below the threshold of {args.threshold:.0f}%:")
        for module, value in sorted(below.items()):
            print(f"  {module}: {value:.1f}%")
    return 0 if score >= args.threshold and not below else 1


if __name__ == "__main__":
    sys.exit(main())
