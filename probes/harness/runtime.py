"""Process-wide SGLang set-up for probes that build real ``Req`` and scheduler objects.

A probe process launched no server and built no process group, yet
``Req.__init__`` reads the published server config and
``Req.set_finish_with_abort`` asks which tensor-parallel rank it runs on.
:func:`ensure_runtime` supplies both, once per process, with SGLang's own
mechanisms (``runtime_context.publish`` and ``ParallelContext.override``)
rather than by patching what SGLang reads.

The rest are small tools every probe needs: a real class instance without its
GPU-bound constructor (:func:`bare`), a module global swapped for one scenario
(:func:`swapped`), and the tree cache's abort API, which moved between releases
(:func:`fake_tree_cache`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, TypeVar

from difflab.probe.kit import Kit, Recorder, StrictFake

T = TypeVar("T")

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


def bare(kit: Kit, cls: type[T], name: str | None = None, **attrs: Any) -> T:
    """An instance of a real SGLang class, built without its constructor, holding ``attrs``.

    The constructors want GPUs, process groups and a model; SGLang's own CPU
    tests build objects the same way. Methods stay the real ones; any other
    attribute is answered by :func:`harness.strict.real_object` (the build's
    own constructor default, or a probe error naming it).
    """
    from harness.strict import real_object

    return real_object(kit, cls, name or cls.__name__, **attrs)


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
