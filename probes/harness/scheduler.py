"""A real ``Scheduler`` for the admission doors, built without its constructor.

Only the collaborators a door touches are faked: the output streamer (ZMQ to
the tokenizer), the tree cache and the beam coordinator (beam rows in GPU
memory; a request without a beam group is a no-op for it).
"""

from __future__ import annotations

from typing import Any

from difflab.probe.kit import Kit
from harness.requests import fake_output_streamer
from harness.runtime import bare, cache_aborts, fake_tree_cache


def bare_scheduler(kit: Kit, **attrs: Any) -> tuple[Any, dict[str, Any]]:
    """The scheduler, and what it lets a probe observe: ``sent`` (statuses streamed per rid), ``cache_abort``."""
    from sglang.srt.managers.scheduler import Scheduler

    output_streamer, sent = fake_output_streamer(kit)
    tree_cache, cache_abort = fake_tree_cache(kit)
    scheduler = bare(
        kit,
        Scheduler,
        output_streamer=output_streamer,
        tree_cache=tree_cache,
        beam_coordinator=kit.fake("beam_coordinator", retire_group=kit.recorder("retire_group")),
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
