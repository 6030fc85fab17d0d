"""#36988 throughput: normal final prefill results through the prefill side's own result step.

The fix puts retirement bookkeeping in front of every prefill result: an ``is_aborted``
check per request, the middle-chunk accounting, the retirement itself for an aborted
one. What a live request pays for that is measured on the normal path, the one every
request crosses: a batch of ``n`` live requests whose prefill just finished goes through
the scheduler's own ``process_batch_result`` on the prefill side the build's start-up
built (:mod:`harness.server`, one side per size with ``--max-running-requests n`` so its
metadata allocator holds the batch; :mod:`harness.prefill_results`, the behaviour probe's
set-up: each request holds a KV row, a slot of that allocator and a real ``FakeKVSender``;
KV release and radix insert faked where ``disaggregation/prefill.py`` imported them).

Workload ``final_results``: the load ``n`` is the batch (10, 100, 1000 requests finishing
their prefill together, and as many in flight afterwards); results/s = n * batches/s.
Built before the timer: the requests and the scenario's recorders; timed: the one call;
checked after it, never timed: every request was cached, queued in flight and sent once,
none released or streamed -- else a probe failure. Then the in-flight queue and the slots
are given back.
"""

from __future__ import annotations

import itertools
from contextlib import ExitStack
from typing import Any

from difflab.probe.bench import Workload
from difflab.probe.kit import Kit, ProbeFailure
from harness.prefill_results import WiredPrefill
from harness.runtime import ensure_runtime

_rids = itertools.count()


class FinalResults:
    """A wired prefill side whose next batch holds ``size`` live requests at the end of their prefill."""

    def __init__(self, kit: Kit, size: int) -> None:
        from harness.server import start

        self.kit, self.size = kit, size
        # Two metadata slots per running request (the build's own sizing): the batch fits.
        self.side = start(kit, "prefill", max_running_requests=size)
        self.stack = ExitStack()
        self.p: WiredPrefill | None = None
        self.batch: list[Any] = []

    def setup(self) -> None:
        self.stack = ExitStack()
        self.p = WiredPrefill(self.kit, self.stack, side=self.side)
        self.batch = [self.p.prefilled(f"final-{next(_rids)}") for _ in range(self.size)]

    def run(self) -> int:
        assert self.p is not None
        self.p.results(self.batch)
        return len(self.batch)

    def teardown(self) -> None:
        p, n = self.p, self.size
        assert p is not None
        try:
            self._check(p, n)
        finally:
            p.scheduler.disagg_prefill_inflight_queue.clear()
            for req in self.batch:
                p.slots.free(req.metadata_buffer_index)
            self.stack.close()
            self.batch = []

    def _check(self, p: WiredPrefill, n: int) -> None:
        inflight = p.scheduler.disagg_prefill_inflight_queue
        sent_last = sum(1 for c in p.send.calls if c.kwargs.get("last_chunk") is True)
        if [id(r) for r in inflight] != [id(r) for r in self.batch] or p.radix_insert.count != n or sent_last != n:
            raise ProbeFailure(
                f"a batch of {n} live results: {len(inflight)} in flight, {p.radix_insert.count} cached, "
                f"{sent_last} last chunks sent (each should be {n})"
            )
        if p.release.count or any(p.side.seen["sockets"].streamed(r.rid) for r in self.batch):
            raise ProbeFailure("a live request's final result released it or streamed to its client")
        if any(r.finished() for r in self.batch):
            raise ProbeFailure("a live request's final result retired it")


def workloads(kit: Kit) -> list[Workload]:
    ensure_runtime()
    return [
        Workload(
            "final_results",
            "results",
            lambda n: FinalResults(kit, n),
            "a batch of n live final prefill results through the wired prefill side's process_batch_result",
        )
    ]
