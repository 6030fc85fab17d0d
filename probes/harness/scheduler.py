"""The real ``BeamCoordinator`` for a scheduler built without its constructor.

A plain struct; its GPU pools, tree cache and model config are strict fakes that
retiring a group never reads: a request without a beam group is a no-op for it,
and a probe can hand a request a real ``BeamGroup`` and watch the coordinator's
live-group count.
"""

from __future__ import annotations

from typing import Any

from difflab.probe.kit import Kit


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
