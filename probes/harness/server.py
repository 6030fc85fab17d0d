"""A PD side (prefill / decode / null) as the build's own start-up builds it, stopped before its event loop.

:func:`start` runs the build's ``run_scheduler_process`` itself: ``load_plugins()``
(entry points and ``HookRegistry`` hooks), ``publish(server_args, role="scheduler")``,
``configure_scheduler_process`` and whatever else the build's entry runs before it
constructs the scheduler class it looks up *at call time* (so a plugin, a start-up
patch or a subclass the build swaps in is what gets built). That class's own
``__init__`` runs -- a fork's wrappers, the build's mixin order, every ``init_*``
step it calls -- and the queues, KV manager, metadata buffers, senders and
receivers come from the build's own ``init_disaggregation()``. The run ends where
the build calls ``scheduler.run_event_loop()``: :class:`Started` (a
``BaseException``, so the entry's ``except Exception`` cannot take it) carries the
instance out; the entry's own ``finally`` still runs.

What is replaced, and why. Constructor steps (each an attribute of the instance while the
constructor runs, removed afterwards, so later calls resolve through the build's class order):

- ``init_model_config``: no checkpoint. The build's own ``ModelConfig.from_server_args`` runs
  on a folder holding only a tiny model's ``config.json``.
- ``init_model_worker``: no weights, GPU or CUDA graphs. A strict fake worker and model runner
  hold the build's real KV pools, built on the CPU and tiny (:func:`memory_pools`), and the
  capacity values a worker reports; the architecture the loader would resolve is recorded.
- ``init_tokenizer`` (no tokenizer files; the server args name no grammar backend either),
  ``init_soft_watchdog`` / ``init_watch_dog_memory_saver_input_blocker`` / ``init_profiler``
  (threads, profiler files), ``init_rank_consensus_checker`` (process groups).

Collaborators swapped for the construction only: ``kv_cache_builder.build_kv_cache`` (the real
pools from the fake worker, and a recorded strict-fake tree cache: the probe's window on cache
outcomes), ``bootstrap.init_parallel_runtime`` / ``init_layer_runtime`` (no process group: the
process groups are 1-rank fakes over one real gloo group, :func:`one_rank_groups`), ``psutil``
as the entry sees it (a signal to the launcher is recorded, not sent) and ``get_zmq_socket``
in every module of the build that imported it (:class:`Sockets`: the build's own IPC set-up
runs, each socket keeps what it sent). A probe that needs a transfer engine faked passes
``transport`` (context managers entered around the start-up).

Everything else the constructor runs is the build's code with the build's values. Any
attribute a replaced step would have set and a probe path later reads is answered by
:mod:`harness.strict` (the build's own constructor expression, or a probe error naming it) --
never by a harness default. Costs: the first side of a process ~0.1-0.6 s (the construction
index is cached on disk), each further side ~50-150 ms, so a probe builds one side per mode
and runs its scenarios on it.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from difflab.probe.kit import Kit
from harness.runtime import ensure_runtime


class Started(BaseException):  # noqa: N818 - a signal, not an error
    """Raised where the build's entry starts the event loop; carries the built scheduler."""

    ends_scenario = True

    def __init__(self, scheduler: Any) -> None:
        super().__init__("scheduler built; event loop not started")
        self.scheduler = scheduler


class Published:
    """The runtime context one side's start-up published, put back while that side runs.

    The build's entry publishes its server arguments, config namespaces, parallel state and
    flags process-wide (``runtime_context.publish``, last publish wins): one server per
    process. Two sides in one process (the CPU pair's prefill and decode) each need their own
    in effect while their code runs. :meth:`active` swaps them with the build's own
    ``snapshot_context`` / ``restore_context``: the side that was active is snapshotted
    (what it changed since is kept), this side's context is restored. Every :func:`start`
    captures one, so the last side started is the one in effect.
    """

    _current: Published | None = None

    def __init__(self) -> None:
        from sglang.srt.runtime_context import snapshot_context

        self.state = self.initial = snapshot_context()
        Published._current = self

    @classmethod
    def set_aside(cls) -> None:
        """Keep what the side in effect changed since it became active: another start-up publishes next."""
        from sglang.srt.runtime_context import snapshot_context

        if cls._current is not None:
            cls._current.state = snapshot_context()
            cls._current = None

    def reset(self) -> None:
        """Back to what this side's start-up published (a kept side's next scenario, :mod:`harness.kept`)."""
        from sglang.srt.runtime_context import restore_context

        self.state = self.initial
        if Published._current is self:
            restore_context(self.initial)

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        from sglang.srt.runtime_context import restore_context, snapshot_context

        current = Published._current
        if current is not self:
            if current is not None:
                current.state = snapshot_context()
            restore_context(self.state)
            Published._current = self
        yield


@dataclass
class Side:
    """One side the build's start-up built: its scheduler and what the harness lets a probe watch."""

    mode: str
    backend: str
    scheduler: Any
    init_info: list[Any] = field(default_factory=list)
    """What the entry sent its parent once the scheduler was built (``pipe_writer.send``)."""
    seen: dict[str, Any] = field(default_factory=dict)
    """The probe's windows: ``sockets`` (:class:`Sockets`), ``cache_abort`` (the tree cache's abort call)."""
    published: Published | None = None
    """The runtime context this side's start-up published (:class:`Published`)."""


MAX_TOTAL_TOKENS = 1024  # below an intake-rejected prompt (1500), above its one-token stub
MAX_RUNNING_REQUESTS = 8
KV_HEADS = 8


# ---------------------------------------------------------------------------
# Version adaptations of the start-up path, by feature.
#   run_scheduler_process(...): attn_cp_rank / moe_dp_rank / moe_ep_rank parameters (<= 0.5.20)
#   bootstrap.init_parallel_runtime / init_layer_runtime called inline by __init__ (0.5.22+;
#       earlier releases set up the process group inside the model worker)
#   kv_cache_builder.build_kv_cache called inline by __init__ (every release here)
# ---------------------------------------------------------------------------
_ENTRY_RANKS = {
    "gpu_id": 0,
    "tp_rank": 0,
    "pp_rank": 0,
    "dp_rank": None,
    "attn_cp_rank": 0,
    "moe_dp_rank": 0,
    "moe_ep_rank": 0,
}

STAND_INS = (
    "init_soft_watchdog",
    "init_model_config",
    "init_tokenizer",
    "init_model_worker",
    "init_watch_dog_memory_saver_input_blocker",
    "init_profiler",
    "init_rank_consensus_checker",
)
"""The constructor steps replaced while the build's ``__init__`` runs (see the module docstring)."""


_TINY_MODEL = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": KV_HEADS,
    "num_key_value_heads": KV_HEADS,
    "num_hidden_layers": 2,
    "vocab_size": 256,
    "max_position_embeddings": 4096,
    "torch_dtype": "float32",
    "rms_norm_eps": 1e-5,
}
_MODEL_DIR: list[str] = []


def tiny_model_dir() -> str:
    """A folder holding only a tiny model's ``config.json`` (no weights, no tokenizer), shared by probes."""
    if not _MODEL_DIR:
        import hashlib
        import json
        import os
        import tempfile

        text = json.dumps(_TINY_MODEL, sort_keys=True)
        folder = os.path.join(
            tempfile.gettempdir(), f"difflab-tiny-model-{hashlib.sha256(text.encode()).hexdigest()[:12]}"
        )
        path = os.path.join(folder, "config.json")
        if not os.path.exists(path):
            os.makedirs(folder, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=folder, suffix=".part")
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(text)
            os.replace(tmp, path)
        _MODEL_DIR.append(folder)
    return _MODEL_DIR[0]


Pools = Callable[[int, int], tuple[Any, Any, Any]]
"""Builds a side's KV memory from (request rows, KV tokens): (req_to_token_pool, allocator, KV pool)."""


@dataclass(frozen=True)
class Memory:
    """What a side's memory is when a probe brings its own (the CPU pair: paged pools with a real cache).

    ``pools`` replaces :func:`memory_pools`; ``tree_cache`` (given the side's request and token
    pools) replaces the recorded strict-fake tree cache, with ``disable_radix_cache`` the
    value the build's cache result reports for it.
    """

    pools: Pools
    tree_cache: Callable[[Any, Any], Any] | None = None
    disable_radix_cache: bool = False


class _StandIns:
    """The replaced constructor steps of one scheduler, and the fakes they hand it."""

    def __init__(self, kit: Kit, pools: Pools | None = None) -> None:
        self.kit = kit
        self.pools = pools or memory_pools

    def bind(self, scheduler: Any) -> dict[str, Callable[..., None]]:
        steps: dict[str, Callable[..., None]] = {}
        for name in STAND_INS:
            own = getattr(self, name, None)
            steps[name] = (lambda fn: lambda *a, **k: fn(scheduler, *a, **k))(own or self._nothing)
        return steps

    @staticmethod
    def _nothing(scheduler: Any, *args: Any, **kwargs: Any) -> None:
        return None

    def init_model_config(self, scheduler: Any) -> None:
        from sglang.srt.configs.model_config import ModelConfig

        scheduler.model_config = ModelConfig.from_server_args(scheduler.server_args, model_path=tiny_model_dir())

    def init_tokenizer(self, scheduler: Any) -> None:
        scheduler.is_generation = True
        scheduler.tokenizer = scheduler.processor = None

    def init_model_worker(self, scheduler: Any) -> None:
        from sglang.srt.runtime_context import get_schedule

        # What loading the checkpoint would have resolved: its native architecture class
        # (the build's own get_resolved_model_impl maps it to an implementation).
        scheduler.model_config._resolved_model_arch = _TINY_MODEL["architectures"][0]
        # The worker admits --max-running-requests when the launch gives one (a request row each).
        running = scheduler.server_args.max_running_requests or MAX_RUNNING_REQUESTS
        # --max-total-tokens likewise sizes the KV pool (a bench holding many rooms at once).
        tokens = scheduler.server_args.max_total_tokens or MAX_TOTAL_TOKENS
        req_pool, allocator, kv_pool = self.pools(running, tokens)
        runner = self.kit.fake(
            "model_runner",
            canary_manager=None,
            ngram_embedding_manager=None,
            attn_backend=None,
            forward_stream=None,
            model_config=scheduler.model_config,
            token_to_kv_pool=kv_pool,
            token_to_kv_pool_allocator=allocator,
            req_to_token_pool=req_pool,
            logical_max_total_num_tokens=tokens,
            effective_logical_max_total_num_tokens=tokens,
            effective_max_total_num_tokens=tokens,
            max_token_pool_size=tokens,
            weight_load_mem_usage=0.0,  # no weights loaded
            kv_cache_dtype_str="auto",
            max_total_num_tokens=tokens,
            max_running_requests=running,
        )
        scheduler.tp_worker = self.kit.fake(
            "tp_worker",
            weight_load_time=0.0,
            graph_time_usage={},
            graph_memory_usage={},  # no CUDA graphs captured
            model_runner=runner,
            get_memory_pool=lambda: (req_pool, allocator),
            is_hybrid_swa=False,
            model_config=scheduler.model_config,
        )
        # The build's own draft-worker step: with no speculative algorithm it sets no draft worker (and,
        # where the build has one, no n-gram corpus manager) and returns before loading anything.
        type(scheduler).maybe_init_draft_worker(scheduler)
        scheduler.model_worker = scheduler.tp_worker
        scheduler.kv_cache_allocation_time = 0.0
        scheduler.max_total_num_tokens = tokens
        scheduler.max_prefill_tokens = get_schedule().max_prefill_tokens
        scheduler.max_running_requests = running
        scheduler.max_queued_requests = get_schedule().max_queued_requests
        # As the worker's get_worker_info derives them from the context length and KV capacity.
        scheduler.max_req_len = min(scheduler.model_config.context_len - 1, tokens - 1)
        scheduler.max_req_input_len = scheduler.max_req_len - 5
        scheduler.random_seed = 0
        scheduler.device = "cpu"
        scheduler.forward_stream = None
        # The groups the real step takes from the process it launched: one rank each (:func:`one_rank_groups`).
        groups = _GROUPS[0]
        for name in ("tp", "attn_tp", "attn_cp", "pp", "world"):
            group = groups.get(f"{name}_group", groups["tp_group"])
            setattr(scheduler, f"{name}_group", group)
            setattr(scheduler, f"{name}_cpu_group", group.cpu_group)
        scheduler.dp_tp_group = groups["tp_group"]
        scheduler.dp_tp_cpu_group = groups["tp_group"].cpu_group
        _dp_attention_world(scheduler)


def _dp_attention_world(scheduler: Any) -> None:
    """What the model runner's start-up states for attention data parallelism, once per process.

    The build's own ``compute_dp_attention_world_info`` for this one-rank launch (TP rank 0 of 1,
    the server's DP and context-parallel widths) fills what ``initialize_dp_attention`` would;
    up to 0.5.20 a transport back end's KV manager asks ``get_attention_dp_size()``.
    """
    from sglang.srt.layers import dp_attention
    from sglang.srt.runtime_context import get_parallel

    if getattr(dp_attention, "_ATTN_DP_SIZE", 0) is not None or not hasattr(
        dp_attention, "compute_dp_attention_world_info"
    ):
        return
    parallel = get_parallel()
    _, _, rank, size = dp_attention.compute_dp_attention_world_info(
        parallel.enable_dp_attention, 0, 1, parallel.dp_size, parallel.attn_cp_size
    )
    dp_attention._ATTN_DP_RANK, dp_attention._ATTN_DP_SIZE = rank, size


def memory_pools(rows: int = MAX_RUNNING_REQUESTS, tokens: int = MAX_TOTAL_TOKENS) -> tuple[Any, Any, Any]:
    """This build's real KV pools, on the CPU and tiny: (req_to_token_pool, allocator, KV pool)."""
    import torch
    from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool

    kv_pool = MHATokenToKVPool(
        size=tokens,
        page_size=1,
        dtype=torch.float32,
        head_num=KV_HEADS,
        head_dim=8,
        layer_num=2,
        device="cpu",
        enable_memory_saver=False,
    )
    allocator = TokenToKVPoolAllocator(size=tokens, dtype=torch.float32, device="cpu", kvcache=kv_pool, need_sort=False)
    req_pool = ReqToTokenPool(size=rows, max_context_len=4096, device="cpu", enable_memory_saver=False)
    return req_pool, allocator, kv_pool


def _kv_cache(kit: Kit, seen: dict[str, Any], memory: Memory | None = None) -> Callable[..., Any]:
    """``kv_cache_builder.build_kv_cache`` for a CPU: the build's real pools, a recorded strict-fake tree cache
    (or the cache a probe's :class:`Memory` builds over those pools)."""

    def build_kv_cache(**kwargs: Any) -> Any:
        from sglang.srt.mem_cache.kv_cache_builder import KVCacheBuildResult

        req_pool, allocator = kwargs["tp_worker"].get_memory_pool()
        if memory is not None and memory.tree_cache is not None:
            tree_cache, disable = memory.tree_cache(req_pool, allocator), memory.disable_radix_cache
        else:
            tree_cache, disable = _recorded_tree_cache(kit, seen), False
        fields = {
            "is_hybrid_swa": False,
            "is_hybrid_ssm": False,
            "sliding_window_size": None,
            "full_tokens_per_layer": None,
            "swa_tokens_per_layer": None,
            "req_to_token_pool": req_pool,
            "token_to_kv_pool_allocator": allocator,
            "disable_radix_cache": disable,
            "tree_cache": tree_cache,
        }
        accepted = inspect.signature(KVCacheBuildResult).parameters
        return KVCacheBuildResult(**{k: v for k, v in fields.items() if k in accepted})

    return build_kv_cache


def _recorded_tree_cache(kit: Kit, seen: dict[str, Any]) -> Any:
    """A strict-fake tree cache that records its abort call (the probe's window on cache outcomes)."""
    from harness.runtime import fake_tree_cache

    tree_cache, cache_abort = fake_tree_cache(
        kit,
        # An empty cache, as the scheduler's bookkeeping asks it after each step (load snapshot,
        # 0.5.23's load inquirer): nothing evictable, protected or waiting on storage.
        waiting_storage_span=kit.recorder("tree_cache.waiting_storage_span", returns=0),
        evictable_size=kit.recorder("tree_cache.evictable_size", returns=0),
        protected_size=kit.recorder("tree_cache.protected_size", returns=0),
        flush_pending_backups=kit.recorder("tree_cache.flush_pending_backups"),
        supports_fast_match_prefix=kit.recorder("tree_cache.supports_fast_match_prefix", returns=False),
        supports_mamba=kit.recorder("tree_cache.supports_mamba", returns=False),  # a dense model
        # 0.5.22's decode preallocation offers each row to a streaming session: this cache keeps none.
        maybe_hand_to_session=kit.recorder("tree_cache.maybe_hand_to_session"),
        # 0.5.22's decode transfer queue drops a request's (absent) hicache restore lock.
        unlock=kit.recorder("tree_cache.unlock"),
        # No host/storage tier: the prefix cache base class's own answer (intake asks it).
        cache_controller=_base_prefix_cache().cache_controller,
    )
    seen["cache_abort"] = cache_abort
    return tree_cache


def _base_prefix_cache() -> type:
    from sglang.srt.mem_cache.base_prefix_cache import BasePrefixCache

    return BasePrefixCache


def _pipe(kit: Kit, sink: list[Any]) -> Any:
    return kit.fake("pipe_writer", send=sink.append)


def _status(reason: Any) -> int | None:
    """The HTTP status of an abort as the wire carries it (a finish-reason dict), None otherwise."""
    if isinstance(reason, dict) and reason.get("type") == "abort":
        code = reason.get("status_code")
        return int(code) if code is not None else None
    return None


class Sockets:
    """The ZMQ sockets the build opens, faked: what each sends is kept (decoded), nothing is received.

    ``get_zmq_socket`` is swapped in every module of the build that imported it, so the
    build's own channel set-up (``SchedulerIpcChannels.create``, the load publisher) runs.
    """

    def __init__(self, kit: Kit) -> None:
        self.kit = kit
        self.sent: dict[str, list[Any]] = {}

    def get_zmq_socket(self, context: Any, socket_type: Any, endpoint: Any = None, *args: Any, **kwargs: Any) -> Any:
        import zmq
        from sglang.srt.managers import io_struct

        sink = self.sent.setdefault(str(endpoint), [])

        def again(*a: Any, **k: Any) -> Any:
            raise zmq.Again()  # nothing pending: no tokenizer or peer is sending

        return self.kit.fake(
            f"zmq_socket({endpoint})",
            send_pyobj=lambda obj, *a, **k: sink.append(obj),
            send=lambda data, *a, **k: sink.append(io_struct.msgpack_decode(data)),
            send_multipart=lambda parts, *a, **k: sink.append(list(parts)),
            recv_pyobj=again,
            recv=again,
            recv_multipart=again,
            poll=lambda *a, **k: 0,
            setsockopt=lambda *a, **k: None,
            close=lambda *a, **k: None,
        )

    def streamed(self, rid: str) -> list[int | None]:
        """What the client of ``rid`` received, one entry per output naming it: its abort's HTTP status, or None."""
        out: list[int | None] = []
        for sent in self.sent.values():
            for obj in sent:
                rids = getattr(obj, "rids", None)
                if rids is None:
                    if getattr(obj, "rid", None) == rid:
                        out.append(_status(getattr(obj, "finished_reason", None)))
                    continue
                reasons = getattr(obj, "finished_reasons", None) or [None] * len(rids)
                out.extend(_status(reasons[i]) for i, r in enumerate(rids) if r == rid)
        return out

    def swapped_everywhere(self, stack: contextlib.ExitStack) -> None:
        from sglang.srt.utils import network

        from harness.runtime import sglang_modules, swapped

        real = network.get_zmq_socket
        for name, module in sglang_modules():
            if name.startswith("sglang.") and getattr(module, "get_zmq_socket", None) is real:
                stack.enter_context(swapped(module, "get_zmq_socket", self.get_zmq_socket))


def _parent(kit: Kit, signals: list[Any]) -> Any:
    """``psutil`` as the entry sees it: its parent (the launcher) only records a signal sent to it.

    On an exception the entry logs it and sends its parent SIGQUIT; here that parent is the
    probe's supervisor, so the signal is recorded (and reported) instead of delivered.
    """
    launcher = kit.fake("launcher_process", send_signal=signals.append)
    process = kit.fake("scheduler_process", parent=lambda: launcher)
    return kit.fake("psutil", Process=lambda *a: process)


@contextlib.contextmanager
def _constructing(kit: Kit, seen: dict[str, Any], memory: Memory | None = None) -> Iterator[None]:
    """What the constructor must not reach for real, swapped for the construction only."""
    from sglang.srt.managers import scheduler as entry

    from harness.runtime import swapped

    with contextlib.ExitStack() as stack:
        stack.enter_context(swapped(entry.kv_cache_builder, "build_kv_cache", _kv_cache(kit, seen, memory)))
        stack.enter_context(swapped(entry, "psutil", _parent(kit, seen.setdefault("signals", []))))
        seen["sockets"].swapped_everywhere(stack)
        _one_rank_pipeline(stack)
        boot = getattr(entry, "bootstrap", None)
        if boot is not None:
            for name in ("init_parallel_runtime", "init_layer_runtime"):
                if hasattr(boot, name):
                    stack.enter_context(swapped(boot, name, lambda *a, **k: None))
        yield


_GROUPS: list[Any] = []


def _one_rank_pipeline(stack: contextlib.ExitStack) -> None:
    """Up to 0.5.20 a transport back end's manager asks ``get_pp_group()`` (prefill): the 1-rank pipeline group."""
    from sglang.srt.distributed import parallel_state

    from harness.runtime import sglang_modules, swapped

    if getattr(parallel_state, "_PP", 0) is not None:
        return
    group, real = _GROUPS[0]["pp_group"], parallel_state.get_pp_group
    for name, module in sglang_modules():
        if name.startswith("sglang.srt.disaggregation") and getattr(module, "get_pp_group", None) is real:
            stack.enter_context(swapped(module, "get_pp_group", lambda: group))


def one_rank_groups(kit: Kit) -> None:
    """State, for the rest of the process, the process groups a 1-rank launch would build (idempotent).

    Each is a strict fake group coordinator whose CPU and device groups are one real
    1-rank gloo group (:mod:`harness.gloo`): with one rank every collective is the
    identity, so nothing an outcome depends on is invented.
    """
    if _GROUPS:
        return
    from sglang.srt import runtime_context

    from harness.gloo import single_rank_group
    from harness.runtime import hold

    # Version adaptation: the parallel names are _PARALLEL_FIELDS (<= 0.5.20), _parallel_fields() (0.5.21+).
    known = getattr(runtime_context, "_PARALLEL_FIELDS", None)
    fields = known if known is not None else runtime_context._parallel_fields()
    group = single_rank_group()
    names = sorted(name for name in fields if name.endswith("_group"))
    fakes = {
        name: kit.fake(
            name,
            cpu_group=group,
            device_group=group,
            world_size=1,
            rank_in_group=0,
            rank=0,
            ranks=[0],
            first_rank=0,
            last_rank=0,
            is_first_rank=True,
            is_last_rank=True,
        )
        for name in names
    }
    # A width or rank the build would derive from a group it asks parallel_state for: one rank of one.
    widths = {f"{n[: -len('_group')]}_size": 1 for n in names} | {f"{n[: -len('_group')]}_rank": 0 for n in names}
    widths = {k: v for k, v in widths.items() if k in fields and k != "tp_rank"}
    hold(runtime_context.get_parallel().override(**fakes, **widths))
    _GROUPS.append(fakes)


def server_args(mode: str, backend: str, **fields: Any) -> Any:
    """This build's ``ServerArgs`` for one side: its defaults, the side's mode and back end, no checkpoint."""
    from sglang.srt.server_args import ServerArgs

    # No checkpoint: "dummy" skips resolving it; no tokenizer, so no grammar backend either.
    return ServerArgs(
        model_path="dummy",
        grammar_backend="none",
        disaggregation_mode=mode,
        disaggregation_transfer_backend=backend,
        **fields,
    )


def start(
    kit: Kit,
    mode: str,
    *,
    backend: str = "fake",
    transport: Iterable[contextlib.AbstractContextManager[Any]] = (),
    memory: Memory | None = None,
    **fields: Any,
) -> Side:
    """Run the build's scheduler entry for one side up to its event loop and return what it built.

    ``mode``: ``prefill``, ``decode`` or ``null``; ``backend``: the transfer back end, chosen
    through ``ServerArgs`` as a launch flag chooses it; ``memory``: the side's pools and tree
    cache where a probe brings its own (:class:`Memory`); ``fields``: more server arguments.
    """
    ensure_runtime()
    from sglang.srt.managers import scheduler as entry
    from sglang.srt.server_args import PortArgs

    from harness.strict import real_object

    one_rank_groups(kit)
    Published.set_aside()
    args = server_args(mode, backend, **fields)
    port_args = PortArgs.init_new(args)
    sent: list[Any] = []
    seen: dict[str, Any] = {"sockets": Sockets(kit)}
    stand_ins = _StandIns(kit, memory.pools if memory is not None else None)
    base = entry.Scheduler  # the class the module defines; a plugin's replacement derives from it
    built: list[Any] = []

    def new(cls: type, *args: Any, **kwargs: Any) -> Any:
        obj = real_object(kit, cls, "scheduler")
        steps = stand_ins.bind(obj)
        for name, step in steps.items():
            object.__setattr__(obj, name, step)

        def run_event_loop() -> None:
            raise Started(obj)

        object.__setattr__(obj, "run_event_loop", run_event_loop)
        built.append((obj, [*steps, "run_event_loop"]))
        return obj

    offered = {**_ENTRY_RANKS, "server_args": args, "port_args": port_args, "pipe_writer": _pipe(kit, sent)}
    accepted = inspect.signature(entry.run_scheduler_process).parameters
    base.__new__ = new
    try:
        with _constructing(kit, seen, memory), contextlib.ExitStack() as engines:
            for context in transport:
                engines.enter_context(context)
            entry.run_scheduler_process(**{k: v for k, v in offered.items() if k in accepted})
    except Started as done:
        scheduler = done.scheduler
    else:
        raise RuntimeError(
            "the build's run_scheduler_process returned without starting its event loop"
            + (f" (it signalled its launcher: {seen['signals']}; see the logged error)" if seen.get("signals") else "")
        )
    finally:
        del base.__new__
    for obj, names in built:
        for name in names:
            obj.__dict__.pop(name, None)
    return Side(mode=mode, backend=backend, scheduler=scheduler, init_info=sent, seen=seen, published=Published())
