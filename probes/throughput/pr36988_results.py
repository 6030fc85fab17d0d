"""#36988 throughput: normal final prefill results through ``process_batch_result_disagg_prefill``.

The fix puts retirement bookkeeping in front of every prefill result: an ``is_aborted``
check per request, the middle-chunk accounting, the retirement itself for an aborted
one. What a live request pays for that is measured on the normal path, the one every
request crosses: a batch of ``n`` live requests whose prefill just finished goes through
the real ``SchedulerDisaggregationPrefillMixin.process_batch_result_disagg_prefill`` on a
bare real ``Scheduler`` (:mod:`harness.prefill_results`, the behaviour probe's set-up:
each request holds a KV row, a metadata slot of the real allocator and a real
``FakeKVSender``; KV release, radix insert, tree cache, ``send_kv_chunk``, the
batch-result processor and the output streamer faked).

Workload ``final_results``: the load ``n`` is the batch (10, 100, 1000 requests finishing
their prefill together, and as many in flight afterwards); results/s = n * batches/s.
Built before the timer: the requests; timed: the one call; checked after it, never timed:
every request was cached, queued in flight and sent once, none released or streamed --
else a probe failure. Then the in-flight queue and the slots are given back.
"""

from __future__ import annotations

import itertools
from typing import Any

from difflab.probe.bench import Workload
from difflab.probe.kit import Kit, ProbeFailure
from harness.prefill_results import PrefillScheduler
from harness.runtime import ensure_runtime

_rids = itertools.count()


class FinalResults:
    """A prefill scheduler whose next batch holds ``size`` live requests at the end of their prefill."""

    def __init__(self, kit: Kit, size: int) -> None:
        self.size = size
        self.p = PrefillScheduler(kit, None, slots=size)
        self.batch: list[Any] = []
        self.patch: Any = None

    def setup(self) -> None:
        self.batch = [self.p.prefilled(f"final-{next(_rids)}") for _ in range(self.size)]
        self.patch = self.p.patched()
        self.patch.__enter__()

    def run(self) -> int:
        self.p.results(self.batch)
        return len(self.batch)

    def teardown(self) -> None:
        self.patch.__exit__(None, None, None)
        p, n = self.p, self.size
        inflight = p.scheduler.disagg_prefill_inflight_queue
        sent_last = sum(1 for c in p.send.calls if c.kwargs.get("last_chunk") is True)
        if [id(r) for r in inflight] != [id(r) for r in self.batch] or p.radix_insert.count != n or sent_last != n:
            raise ProbeFailure(
                f"a batch of {n} live results: {len(inflight)} in flight, {p.radix_insert.count} cached, "
                f"{sent_last} last chunks sent (each should be {n})"
            )
        if p.release.count or any(p.sent.values()) or any(r.finished() for r in self.batch):
            raise ProbeFailure("a live request's final result released or retired it")
        inflight.clear()
        for req in self.batch:
            p.slots.free(req.metadata_buffer_index)
        for recorder in (p.release, p.radix_insert, p.send, p.metadata_free, p.cache_abort):
            recorder.calls.clear()  # the bench keeps no request alive between runs
        p.sender_abort.clear()
        p.sent.clear()
        self.batch = []


def workloads(kit: Kit) -> list[Workload]:
    ensure_runtime()
    return [
        Workload(
            "final_results",
            "results",
            lambda n: FinalResults(kit, n),
            "a batch of n live final prefill results through the real process_batch_result_disagg_prefill",
        )
    ]
