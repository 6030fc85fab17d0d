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
import sys
from collections.abc import Iterator
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
    loaded = set(sys.modules)
    for module, key in sites:
        setattr(module, key, value)
    try:
        yield [f"{getattr(m, '__name__', m)}.{k}" for m, k in sites]
    finally:
        for module, key in sites:
            setattr(module, key, original)
        # A module imported while the swap was on bound the stand-in: it gets the original back too.
        for module_name in set(sys.modules) - loaded:
            module = sys.modules.get(module_name)
            for key, bound in list(vars(module).items()) if module is not None else ():
                if bound is value:
                    setattr(module, key, original)


_LOADED: list[Any] = [None, []]
"""(``sys.modules`` size, its ``sglang`` entries) when last listed: :func:`sglang_modules`."""


def sglang_modules() -> list[tuple[str, Any]]:
    """The loaded ``sglang`` modules, (name, module), listed again only once more modules were loaded.

    ``sys.modules`` holds thousands of entries (torch, transformers, ...); a start-up swaps
    names in SGLang's own modules several times, so the list is kept while nothing new loads.
    """
    if _LOADED[0] != len(sys.modules):
        _LOADED[1] = [(n, m) for n, m in list(sys.modules.items()) if n.startswith("sglang") and m is not None]
        _LOADED[0] = len(sys.modules)
    return _LOADED[1]


_SITES: dict[int, tuple[set[str], list[tuple[Any, str]]]] = {}
"""id(original) -> (modules already scanned, their (module, global) pairs bound to it)."""


def _import_sites(original: Any, owner: Any) -> list[tuple[Any, str]]:
    """(module, global) pairs of loaded ``sglang`` modules bound to ``original``; modules loaded since are scanned."""
    scanned, sites = _SITES.setdefault(id(original), (set(), []))
    for module_name, module in sglang_modules():
        if module_name in scanned:
            continue
        scanned.add(module_name)
        if module is None or module is owner:
            continue
        try:
            sites += [(module, k) for k, v in vars(module).items() if v is original]
        except TypeError:  # a module object without a plain namespace
            continue
    return sites


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
