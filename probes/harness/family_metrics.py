"""A decode rank whose scheduler runs with ``--enable-metrics``: its metrics reporter on, its collector present.

The harness builds a side's metrics reporter from the real ``ServerArgs`` it
published (:func:`harness.runtime.scheduler_metrics`: this build's default,
metrics off, so no collector exists). That config is read-only once resolved,
so the switch an operator sets with ``--enable-metrics`` is applied where the
scheduler keeps it: the reporter's ``enable_metrics`` and the collector of
recorded calls (:mod:`harness.decode_kv`) in its place. It is reported beside the
verdict with the build's default. SGLang's own ``enable_metrics`` gates then
decide what is counted.
"""

from __future__ import annotations

from difflab.probe.kit import Kit
from harness.decode_kv import DecodeRank
from harness.runtime import published_server_args


def enable_metrics(kit: Kit, rank: DecodeRank) -> None:
    """Turn ``rank``'s scheduler metrics on, as ``--enable-metrics`` would have at start-up."""
    args = published_server_args()
    default = getattr(args, "enable_metrics", None)
    kit.forced_flag("server_args.enable_metrics", True, default, "ServerArgs.enable_metrics (--enable-metrics)", [])
    scheduler = rank.queue.scheduler
    scheduler.metrics_reporter.enable_metrics = True
    scheduler.metrics_reporter.current_scheduler_metrics_enabled = True
    scheduler.metrics_collector = rank.metrics
