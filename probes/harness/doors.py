"""The two PD admission doors, real and built without their constructors.

- :func:`prefill_door`: a real ``PrefillBootstrapQueue`` (real ``create_sender``, real
  capacity check, the 'fake' transfer backend's real ``FakeKVSender``);
- :func:`decode_door`: a real ``DecodePreallocQueue`` (real capacity check, real
  ``_create_receiver_and_enqueue``, spied on, with the 'fake' backend's ``FakeKVReceiver``,
  real prefill-rank lookup: nothing cached, so a request waits in ``pending_reqs``).

Both are wired to a real, bare ``Scheduler`` (:mod:`harness.scheduler`). Faked are the KV
manager (transport), the KV pool and its allocator, the tree cache and the beam
coordinator's GPU pools, and the output streamer (ZMQ).
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

from difflab.probe.kit import Kit
from harness.scheduler import bare_scheduler
from harness.strict import bare

NUM_KV_HEADS = 8
MAX_TOTAL_TOKENS = 1024  # below the rejected prompt (1500), above its one-token stub


# ---------------------------------------------------------------------------
# Version adaptations: what the prefill door reads off its queue, by feature.
#   capacity bound: max_total_num_tokens (<= 0.5.22); max_input_len from the module's
#       max_bootstrap_input_len (0.5.23)
#   tp_rank / pp_rank: create_sender hands them to senders whose constructor takes
#       dest_tp_ranks (<= 0.5.21)
# ---------------------------------------------------------------------------
def _queue_reads() -> dict[str, Any]:
    from sglang.srt.disaggregation import prefill
    from sglang.srt.disaggregation.base.conn import BaseKVSender

    reads: dict[str, Any] = {}
    if hasattr(prefill, "max_bootstrap_input_len"):
        reads["max_input_len"] = prefill.max_bootstrap_input_len(capacity=MAX_TOTAL_TOKENS, page_size=1, shard_size=1)
    else:
        reads["max_total_num_tokens"] = MAX_TOTAL_TOKENS
    if "dest_tp_ranks" in inspect.signature(BaseKVSender.__init__).parameters:
        reads.update(tp_rank=0, pp_rank=0)
    return reads


# ---------------------------------------------------------------------------
# Version adaptations of the KV allocator the decode door consults, by feature.
#   prealloc_ceiling_fits(full, swa): capacity check asks the allocator first (0.5.21)
#   get_kvcache(): a retracted request asks which pool kind it is (dsv4_needs_rebootstrap, 0.5.22)
# ---------------------------------------------------------------------------
def _allocator(kit: Kit) -> Any:
    from sglang.srt.mem_cache import common
    from sglang.srt.mem_cache.allocator import BaseTokenToKVPoolAllocator

    attrs: dict[str, Any] = {"page_size": 1}
    if hasattr(BaseTokenToKVPoolAllocator, "prealloc_ceiling_fits"):
        # None: no ceiling of its own, the token capacity is the only bound (the base class answer).
        attrs["prealloc_ceiling_fits"] = kit.recorder("prealloc_ceiling_fits", returns=None)
    if hasattr(common, "dsv4_needs_rebootstrap"):
        attrs["get_kvcache"] = kit.recorder("get_kvcache", returns=kit.fake("kv_pool"))
    return kit.fake("token_to_kv_pool_allocator", **attrs)


def prefill_door(kit: Kit, live_groups: int = 0) -> tuple[Any, dict[str, Any]]:
    """A real PrefillBootstrapQueue (no constructor) wired to a real, bare Scheduler.

    Returns the queue and what the scheduler lets a probe observe (``sent``,
    ``cache_abort``, ``beams``: the real beam coordinator).
    """
    from sglang.srt.disaggregation.prefill import PrefillBootstrapQueue
    from sglang.srt.disaggregation.utils import TransferBackend

    scheduler, seen = bare_scheduler(kit, live_groups=live_groups)
    queue = bare(
        kit,
        PrefillBootstrapQueue,
        scheduler=scheduler,
        queue=[],
        transfer_backend=TransferBackend.FAKE,
        kv_manager=kit.fake("kv_manager"),
        bootstrap_port=8998,
        **_queue_reads(),
    )
    return queue, seen | {"beams": scheduler.beam_coordinator}


def decode_door(kit: Kit) -> tuple[Any, dict[str, Any]]:
    """A real DecodePreallocQueue (no constructor) wired to a real, bare Scheduler.

    Returns the queue and what a probe observes (``sent``, ``cache_abort``, and
    ``create``: the spy on ``_create_receiver_and_enqueue``).
    """
    from sglang.srt.disaggregation.decode import DecodePreallocQueue
    from sglang.srt.disaggregation.utils import TransferBackend

    scheduler, seen = bare_scheduler(kit, enable_hisparse=False)
    queue = bare(
        kit,
        DecodePreallocQueue,
        scheduler=scheduler,
        queue=[],
        pending_reqs=[],
        retracted_queue=[],
        max_total_num_tokens=MAX_TOTAL_TOKENS,
        num_reserved_decode_tokens=0,
        token_to_kv_pool=kit.fake("token_to_kv_pool"),
        token_to_kv_pool_allocator=_allocator(kit),
        transfer_backend=TransferBackend.FAKE,
        # No prefill peer resolved yet: the request waits in pending_reqs.
        kv_manager=kit.fake("kv_manager", prefill_info_table={}),
    )
    create_receiver = kit.recorder(
        "_create_receiver_and_enqueue",
        side_effect=functools.partial(DecodePreallocQueue._create_receiver_and_enqueue, queue),
    )
    queue._create_receiver_and_enqueue = create_receiver
    return queue, {**seen, "create": create_receiver}


# ---------------------------------------------------------------------------
# The doors as the build's server reaches them: its own scheduler (harness.server), its
# own dispatch. Requests enter through ``Scheduler._add_request_to_queue`` (the intake's
# hand-off), a held re-bootstrap through the decode queue's own ``enqueue_held_rebootstrap``.
# ---------------------------------------------------------------------------
class Door:
    """One side the build's start-up built, and what one request's admission did there."""

    def __init__(self, kit: Kit, mode: str) -> None:
        from harness.server import start

        self.kit = kit
        self.mode = mode
        self.side = start(kit, mode)
        self.scheduler = self.side.scheduler
        if mode == "decode":
            manager = self.scheduler.disagg_decode_prealloc_queue.kv_manager
            if not hasattr(manager, "prefill_info_table"):
                # The 'fake' back end serves warm-up requests only; a request with a real
                # bootstrap host looks its prefill peer up in the table every real back
                # end's manager keeps. No peer has registered yet: it waits in pending_reqs.
                manager.prefill_info_table = {}

    def admit(self, req: Any, *, retracted: bool = False) -> dict[str, Any]:
        """Hand ``req`` to the scheduler's dispatch; report what the side did with it."""
        before = self._cache_aborts()
        self.scheduler._add_request_to_queue(req, **({"is_retracted": True} if retracted else {}))
        return self._effects(req, before)

    def rebootstrap(self, req: Any) -> dict[str, Any]:
        """Stage ``req`` for re-bootstrap and resume it, as the decode side's own retract/resume path does."""
        before = self._cache_aborts()
        queue = self.scheduler.disagg_decode_prealloc_queue
        queue.hold_rebootstrap(req)
        queue.enqueue_held_rebootstrap()
        return self._effects(req, before)

    def _cache_aborts(self) -> int:
        from harness.runtime import cache_aborts

        return cache_aborts(self.side.seen["cache_abort"])

    def _effects(self, req: Any, cache_before: int) -> dict[str, Any]:
        effects: dict[str, Any] = {
            "retired": req.finished(),
            "streamed": self.side.seen["sockets"].streamed(req.rid),
            "cache_aborts": self._cache_aborts() - cache_before,
        }
        if self.mode == "prefill":
            queue = self.scheduler.disagg_prefill_bootstrap_queue
            effects["enqueued"] = req in queue.queue
            effects["sender_created"] = getattr(req, "disagg_kv_sender", None) is not None
        elif self.mode == "decode":
            queue = self.scheduler.disagg_decode_prealloc_queue
            effects["receiver_created"] = any(d.req is req for d in queue.queue)
            effects["pending"] = any(d.req is req for d in queue.pending_reqs)
            effects["retracted_queue"] = req in queue.retracted_queue
        else:
            effects["waiting"] = req in self.scheduler.waiting_queue
        return effects
