"""A real ``Scheduler`` for the admission doors, built without its constructor.

Only the collaborators a door touches are faked: the output streamer (ZMQ to
the tokenizer) and the tree cache (GPU memory). The beam coordinator is the
real ``BeamCoordinator`` (a plain struct; its GPU pools, tree cache and model
config are strict fakes that retiring a group never reads): a request without
a beam group is a no-op for it, and a probe can hand a request a real
``BeamGroup`` and watch the coordinator's live-group count.
"""

from __future__ import annotations

from typing import Any

from difflab.probe.kit import Kit
from harness.requests import fake_output_streamer
from harness.runtime import cache_aborts, fake_tree_cache
from harness.strict import bare


def beam_coordinator(kit: Kit, live_groups: int = 0) -> Any:
    """The real ``BeamCoordinator``, counting ``live_groups`` groups admitted by ``validate_and_init``."""
    from sglang.srt.beam_search.coordinator import BeamCoordinator

    return BeamCoordinator(
        model_config=kit.fake("model_config"),
        spec_algorithm=kit.fake("spec_algorithm"),
        dllm_enabled=False,
        max_req_len=4096,
        req_to_token_pool=kit.fake("req_to_token_pool"),
        token_to_kv_pool_allocator=kit.fake("token_to_kv_pool_allocator"),
        tree_cache=kit.fake("beam_tree_cache"),
        future_map=kit.fake("future_map"),
        _num_live_groups=live_groups,
    )


def bare_scheduler(kit: Kit, *, live_groups: int = 0, **attrs: Any) -> tuple[Any, dict[str, Any]]:
    """The scheduler, and what it lets a probe observe: ``sent`` (statuses streamed per rid), ``cache_abort``."""
    from sglang.srt.managers.scheduler import Scheduler

    output_streamer, sent = fake_output_streamer(kit)
    tree_cache, cache_abort = fake_tree_cache(kit)
    scheduler = bare(
        kit,
        Scheduler,
        output_streamer=output_streamer,
        tree_cache=tree_cache,
        beam_coordinator=beam_coordinator(kit, live_groups),
        **attrs,
    )
    return scheduler, {"sent": sent, "cache_abort": cache_abort}


def retirement_fields(scenario: str, req: Any, seen: dict[str, Any]) -> dict[str, Any]:
    """How the scheduler ended ``req``: ``retired``, ``streamed`` (statuses its client got), ``cache_aborts``."""
    return {
        f"{scenario}.retired": req.finished(),
        f"{scenario}.streamed": seen["sent"].get(req.rid, []),
        f"{scenario}.cache_aborts": cache_aborts(seen["cache_abort"]),
    }
