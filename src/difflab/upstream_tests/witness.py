"""The replay as each workflow asks for it: base/head of a run, every release of ``contains``, a fork's ref.

Each builds the :class:`~difflab.upstream_tests.replay.Plan` s (which sides, which test
trees, the fix's own base and head for the symbol check), runs them, and sets the
agreement with the probes' verdicts. The verdicts keep their own answer; a disagreement
is added to their reason.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

from difflab.environment.shared import SharedEnvironment
from difflab.matrix.model import Fix, SidePin
from difflab.observation import SIDES
from difflab.source.base import MaterialisedSource
from difflab.source.release import ReleaseSource
from difflab.upstream_tests.agreement import Agreement, pair_agreement, single_agreement
from difflab.upstream_tests.files import Tree, folder_tree
from difflab.upstream_tests.outcomes import Reference
from difflab.upstream_tests.replay import FixReplay, Plan, replay
from difflab.upstream_tests.symbols import SymbolIndex

Say = Callable[[str], None]
Sources = Mapping[tuple[str, str], MaterialisedSource | str]


def _index(src: MaterialisedSource | str | None) -> SymbolIndex | None:
    return SymbolIndex(src.root) if isinstance(src, MaterialisedSource) else None


def own_tree(src: MaterialisedSource | str | None, name: str) -> list[Tree]:
    """A source's own ``test/`` tree (a git checkout made with its tests), if it has one."""
    if isinstance(src, MaterialisedSource) and src.tests_root is not None:
        return [Tree(src.tests_root, f"{name} {src.label}'s own test/ tree")]
    return []


def release_reference(fix: Fix, releases: ReleaseSource) -> Reference:
    """The fix's base and head as the matrix pins them, where those are releases."""

    def one(pin: SidePin) -> SymbolIndex | None:
        return SymbolIndex(releases.release(pin.release).root) if pin.release and not pin.unavailable else None

    return Reference(one(fix.base), one(fix.head))


def run_plans(fixes: list[Fix], sources: Sources, tests_dir: Path | None) -> list[Plan]:
    """Base and head of each fix with upstream tests; files from the head's own tree, the base's, then ``tests_dir``."""
    plans = []
    for fix in fixes:
        if not fix.upstream_tests:
            continue
        sides = {side: sources[(fix.id, side)] for side in SIDES if (fix.id, side) in sources}
        base, head = sides.get("base"), sides.get("head")
        trees = own_tree(head, "head") + own_tree(base, "base") + folder_tree(tests_dir)
        plans.append(Plan(fix, sides, trees, Reference(_index(base), _index(head)), pair=SIDES))
    return plans


def for_run(
    fixes: list[Fix], sources: Sources, env: SharedEnvironment, tests_dir: Path | None, say: Say | None = None
) -> list[FixReplay]:
    """The replay of :func:`run_plans`."""
    return replay(run_plans(fixes, sources, tests_dir), env, say)


def source_plans(
    fixes: list[Fix],
    sides: Mapping[str, MaterialisedSource],
    references: Mapping[str, Reference],
    tests_dir: Path | None,
) -> list[Plan]:
    """Each fix's files on every one of ``sides`` (releases, or a fork); its own tree first, then ``tests_dir``."""
    plans = []
    for fix in fixes:
        if not fix.upstream_tests:
            continue
        trees = [t for name, src in sides.items() for t in own_tree(src, name)] + folder_tree(tests_dir)
        plans.append(Plan(fix, dict(sides), trees, references[fix.id]))
    return plans


def for_sources(
    fixes: list[Fix],
    sides: Mapping[str, MaterialisedSource],
    references: Mapping[str, Reference],
    env: SharedEnvironment,
    tests_dir: Path | None,
    say: Say | None = None,
) -> list[FixReplay]:
    """The replay of :func:`source_plans`."""
    return replay(source_plans(fixes, sides, references, tests_dir), env, say)


def agree_with_run(replays: list[FixReplay], verdicts: Mapping[str, str]) -> dict[str, Agreement]:
    """The pair agreement for each fix's replay, given each fix's verdict."""
    out = {}
    for r in replays:
        r.agreement = pair_agreement(verdicts.get(r.fix.id, "error"), r.rows)
        out[r.fix.id] = r.agreement
    return out


def agree_on_side(
    replays: list[FixReplay], verdicts: Mapping[tuple[str, str], str]
) -> dict[tuple[str, str], Agreement]:
    """Per fix and side (a release, the fork): the single-source agreement with that side's verdict."""
    out = {}
    for r in replays:
        for side in r.sides:
            out[(r.fix.id, side)] = single_agreement(verdicts.get((r.fix.id, side), "error"), side, r.rows)
        if len(r.sides) == 1:
            r.agreement = next(iter(out[(r.fix.id, s)] for s in r.sides))
    return out


def with_flag(reason: str, agreement: Agreement | None) -> str:
    """The reason, with a disagreement of SGLang's tests added to it."""
    flag = agreement.flag if agreement else ""
    if not flag:
        return reason
    return f"{reason}; {flag}" if reason else flag
