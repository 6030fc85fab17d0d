"""Process-wide SGLang set-up for probes that build real ``Req`` and scheduler objects.

A probe process launched no server and built no process group, yet
``Req.__init__`` reads the published server config and
``Req.set_finish_with_abort`` asks which tensor-parallel rank it runs on.
:func:`ensure_runtime` supplies both, once per process, with SGLang's own
mechanisms (``runtime_context.publish`` and ``ParallelContext.override``)
rather than by patching what SGLang reads.

The rest are small tools every probe needs: a module global swapped for one scenario
(:func:`swapped`), and the tree cache's abort API, which moved between releases
(:func:`fake_tree_cache`).
"""

from __future__ import annotations

import contextlib
import functools
import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from difflab.probe.kit import Kit, Recorder, StrictFake

# Holds the process-wide overrides open until the process ends.
_HELD = contextlib.ExitStack()
_READY = False
_SERVER_ARGS: list[Any] = []


def published_server_args() -> Any | None:
    """The real ``ServerArgs`` (this build's defaults) published by :func:`ensure_runtime`, if any."""
    return _SERVER_ARGS[0] if _SERVER_ARGS else None


def ensure_runtime() -> None:
    """Publish a default tokenizer-role config and make this process TP rank 0 (idempotent)."""
    global _READY
    if _READY:
        return
    from sglang.srt import runtime_context
    from sglang.srt.server_args import ServerArgs

    if not hasattr(runtime_context, "publish"):
        raise RuntimeError("this SGLang has no runtime_context.publish; the harness supports 0.5.19+")
    server_args = ServerArgs(model_path="dummy")
    runtime_context.publish(server_args, role="tokenizer")
    _SERVER_ARGS.append(server_args)
    parallel = runtime_context.get_parallel()
    if not hasattr(type(parallel), "override"):
        raise RuntimeError("this SGLang's ParallelContext has no override(); cannot state tp_rank=0")
    # What a launcher would have written: this process is rank 0 of a 1-wide TP group.
    _HELD.enter_context(parallel.override(tp_rank=0))
    _READY = True


def hold(context: contextlib.AbstractContextManager[Any]) -> Any:
    """Keep ``context`` entered until the process ends (process-wide SGLang state a launcher would set)."""
    return _HELD.enter_context(context)


@contextlib.contextmanager
def swapped(module: Any, name: str, value: Any) -> Iterator[Any]:
    """Replace ``module.name`` for one scenario; the name must exist (a rename is a probe error)."""
    if not hasattr(module, name):
        raise AttributeError(f"{module.__name__} has no {name!r} to swap")
    saved = getattr(module, name)
    setattr(module, name, value)
    try:
        yield value
    finally:
        setattr(module, name, saved)


@contextlib.contextmanager
def swapped_at_import_sites(owner: Any, name: str, value: Any) -> Iterator[list[str]]:
    """Replace the function ``owner.name`` in ``owner`` and in every loaded SGLang module that imported it.

    SGLang's tests patch a function where the code under test imported it. A build may
    import it in more places (a helper moved to a module of its own, an alias), so the
    sites are found by following the build's imports: every ``sglang`` module global that
    *is* the original object, under whatever name. Yields the sites (``module.global``).
    """
    original = getattr(owner, name)
    sites = [(owner, name), *_import_sites(original, owner)]
    mark, loaded = _modules_mark(), dict(sys.modules)
    for module, key in sites:
        setattr(module, key, value)
    _INDEX.placed(value, sites)
    try:
        yield [f"{getattr(m, '__name__', m)}.{k}" for m, k in sites]
    finally:
        _INDEX.removed(value)
        for module, key in sites:
            setattr(module, key, original)
        # A module imported while the swap was on bound the stand-in: it gets the original back too.
        imported = (
            [m for n, m in list(sys.modules.items()) if loaded.get(n) is not m] if _modules_mark() != mark else []
        )
        for module in imported:
            for key, bound in list(vars(module).items()) if module is not None else ():
                if bound is value:
                    setattr(module, key, original)


@dataclass
class _GlobalsIndex:
    """Every function-valued global of every loaded SGLang module, by the identity of the function.

    One pass over a module's namespace serves every stand-in a probe swaps in (the release call,
    the socket factory, the clocks): each lookup scans only the modules loaded since the last one.
    Entries are (module name, global) string pairs in tuples, which the collector stops tracking,
    so the index adds nothing to the garbage collections of the scenarios that follow. An entry
    is a hint, checked at lookup (the global must still *be* the object), so a name the build
    rebound since is never taken for an import site.
    """

    seen: dict[str, Any] = field(default_factory=dict)
    """Every module looked at (SGLang's scanned, the rest skipped), by name: the module object then, held
    and compared by identity. Each lookup scans only modules new since, one imported again under a seen
    name included."""
    by_id: dict[int, tuple[tuple[str, str], ...]] = field(default_factory=dict)
    sglang: list[str] = field(default_factory=list)
    """The SGLang module names among :attr:`seen`, in the order they were found."""
    mark: tuple[int, str, Any] | None = None
    """``sys.modules`` as last scanned (:func:`_modules_mark`)."""
    stand_ins: dict[int, tuple[tuple[tuple[str, str], ...], int]] = field(default_factory=dict)
    """A stand-in swapped in now (by id): the sites it was placed at, and how many SGLang modules were
    indexed then. A swap nested in another (two sides of a pair each swap the socket factory) looks
    its original -- the outer stand-in, often a bound method the index never holds -- up here, not by
    a scan of every global of every module."""

    def placed(self, value: Any, sites: list[tuple[Any, str]]) -> None:
        named = tuple((m.__name__, k) for m, k in sites if isinstance(m, types.ModuleType))
        self.stand_ins[id(value)] = (named, len(self.sglang))

    def removed(self, value: Any) -> None:
        self.stand_ins.pop(id(value), None)

    def _scan_new_modules(self) -> None:
        mark = _modules_mark()
        if mark == self.mark:
            return
        self.mark = mark
        fresh = [(n, m) for n, m in list(sys.modules.items()) if self.seen.get(n) is not m]
        self.seen.update(fresh)
        for module_name, module in fresh:
            if module is None or not module_name.startswith("sglang"):
                continue
            self.sglang.append(module_name)
            try:
                names = list(vars(module).items())
            except TypeError:  # a module object without a plain namespace
                continue
            for key, value in names:
                if isinstance(value, _FUNCTIONS):
                    self.by_id[id(value)] = (*self.by_id.get(id(value), ()), (module_name, key))

    def sites(self, original: Any, owner: Any) -> list[tuple[Any, str]]:
        """(module, global) pairs of loaded ``sglang`` modules other than ``owner`` bound to ``original``."""
        self._scan_new_modules()
        stand_in = self.stand_ins.get(id(original))
        if stand_in is not None:  # where it was placed, and any module imported since that bound it
            placed, indexed = stand_in
            candidates = placed + self._bound_in(original, self.sglang[indexed:])
        elif isinstance(original, _FUNCTIONS):
            candidates = self.by_id.get(id(original), ())
        else:  # not indexed (a class, an object): every SGLang global, looked at now
            candidates = self._bound_in(original, self.sglang)
        found = []
        for module_name, key in dict.fromkeys(candidates):
            module = sys.modules.get(module_name)
            if module is not None and module is not owner and vars(module).get(key) is original:
                found.append((module, key))
        return found

    @staticmethod
    def _bound_in(original: Any, module_names: list[str]) -> tuple[tuple[str, str], ...]:
        return tuple(
            (module_name, key)
            for module_name in module_names
            for key, value in vars(sys.modules.get(module_name) or types).items()
            if value is original
        )


def _modules_mark() -> tuple[int, str, Any]:
    """``sys.modules``'s size, newest name and that module's identity: all unchanged means no module was
    imported since.

    An import appends its name (a dict keeps insertion order), so it changes the newest name; the
    newest removed and imported again keeps name and size but is a new object. Comparing the mark
    costs nothing, a pass over the thousands of modules torch & co. load costs ~1 ms, once per swap.
    """
    newest = next(reversed(sys.modules), "")
    return len(sys.modules), newest, sys.modules.get(newest)  # a module compares by identity


_FUNCTIONS = (types.FunctionType, types.BuiltinFunctionType, functools.partial)


_INDEX = _GlobalsIndex()


def sglang_modules() -> list[tuple[str, Any]]:
    """The loaded ``sglang`` modules, (name, module), from the index (only modules new since are looked at).

    ``sys.modules`` holds thousands of entries (torch, transformers, ...); a start-up swaps
    names in SGLang's own modules several times, so they are listed once and kept.
    """
    _INDEX._scan_new_modules()
    return [(name, module) for name in _INDEX.sglang if (module := sys.modules.get(name)) is not None]


def _import_sites(original: Any, owner: Any) -> list[tuple[Any, str]]:
    """(module, global) pairs of loaded ``sglang`` modules bound to ``original``; modules loaded since are scanned."""
    return _INDEX.sites(original, owner)


def scheduler_metrics(kit: Kit) -> dict[str, Any]:
    """A scheduler's metrics reporter and stage-time recorder, as the build's start-up makes them.

    The collector context reads ``enable_metrics`` from the published server config
    (the build's ``ServerArgs`` default: off), and the reporter builds its
    ``SchedulerStageMetricsRecorder(enabled=...)`` (0.5.20+) from it; the scheduler
    keeps that recorder. With metrics off no collector exists, so a counter gated
    the way SGLang gates its own does not run.
    """
    ensure_runtime()
    enabled = bool(published_server_args().enable_metrics)
    reporter = kit.fake("metrics_reporter")
    reporter.enable_metrics = enabled  # set after: a fake's label is its first argument
    reporter.current_scheduler_metrics_enabled = enabled
    parts: dict[str, Any] = {"metrics_reporter": reporter}
    try:
        from sglang.srt.observability.scheduler_stage_metrics import SchedulerStageMetricsRecorder
    except ImportError:  # <= 0.5.19: no stage-time recorder
        return parts
    recorder = SchedulerStageMetricsRecorder(enabled=enabled)
    reporter.scheduler_stage_metrics = recorder
    return parts | {"scheduler_stage_metrics": recorder}


# ---------------------------------------------------------------------------
# Version adaptation: how the scheduler tells the tree cache a request was aborted.
#   0.5.19 : tree_cache.release_aborted_request(rid)
#   0.5.20+: tree_cache.finish(handle, CacheRequestOutcome.ABORT)
# Detected by the presence of CacheRequestOutcome.
# ---------------------------------------------------------------------------
def _cache_outcome_enum() -> Any | None:
    try:
        from sglang.srt.mem_cache.base_prefix_cache import CacheRequestOutcome
    except ImportError:
        return None
    return CacheRequestOutcome


def fake_tree_cache(kit: Kit, name: str = "tree_cache", **attrs: Any) -> tuple[StrictFake, Recorder]:
    """A strict tree-cache fake with this release's abort call recorded; returns (fake, recorder)."""
    method = "finish" if _cache_outcome_enum() is not None else "release_aborted_request"
    recorder = kit.recorder(f"{name}.{method}")
    return kit.fake(name, **{method: recorder}, **attrs), recorder


def cache_aborts(recorder: Recorder) -> int:
    """How many times the tree cache was told a request ended aborted."""
    outcome = _cache_outcome_enum()
    if outcome is None:
        return recorder.count
    return sum(1 for call in recorder.calls if outcome.ABORT in (*call.args, *call.kwargs.values()))
