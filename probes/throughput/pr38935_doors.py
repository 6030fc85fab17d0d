"""#38935 throughput: requests through both PD admission doors while ``n`` requests wait there.

The fix adds a check to every request's way in: ``is_unadmitted_reject`` at the
prefill and decode doors, and, for an intake-rejected request, the retirement through
``Scheduler.retire_unadmitted_request`` instead of a KV sender or receiver. Each door is
the side the build's own start-up built (:class:`harness.doors.Door`: its
``run_scheduler_process``, scheduler class and ``init_disaggregation``; the 'fake'
transfer back end's real senders and receivers), reached through the scheduler's own
dispatch ``_add_request_to_queue`` -> whatever queue its set-up built.

Workloads; the load ``n`` is the number of valid requests already waiting at the door
(the bootstrap queue, or decode's ``pending_reqs``); each timed run lets ``n // 10`` (at
least one) new requests arrive, built before the timer starts:

- ``prefill_door.valid`` / ``decode_door.valid``: valid requests (requests/s admitted);
- ``prefill_door.mixed`` / ``decode_door.mixed``: every fourth arrival was rejected at
  intake by the real ``Req.set_finish_with_abort`` (its verdict parked in ``to_finish``).
  The base admits it like any other, the head retires it with its 400.

Checked after every run, never timed: every valid arrival is waiting with a sender (a
receiver); every rejected one is either waiting (the base's way) or retired (the
head's way) -- anything else is a probe failure, not a number. Then the door is put
back to ``n`` waiting.
"""

from __future__ import annotations

import itertools
import re
from typing import Any

from difflab.probe.bench import Workload
from difflab.probe.kit import Kit, ProbeFailure
from harness.doors import Door
from harness.requests import INTAKE_REJECTION, new_req
from harness.runtime import ensure_runtime

REJECT_EVERY = 4
_rids = itertools.count()


def _arrivals(n: int) -> int:
    return max(1, n // 10)


class DoorLoad:
    """One door holding ``size`` waiting requests; ``run()`` pushes a batch of new arrivals through it."""

    def __init__(self, kit: Kit, side: str, size: int, reject_every: int | None) -> None:
        self.kit, self.side, self.size, self.reject_every = kit, side, size, reject_every
        self.door = Door(kit, side)
        scheduler = self.door.scheduler
        if side == "prefill":
            self.waiting: list[Any] = scheduler.disagg_prefill_bootstrap_queue.queue
        else:
            self.waiting = scheduler.disagg_decode_prealloc_queue.pending_reqs
        self.add = scheduler._add_request_to_queue  # the dispatch, resolved on the built instance
        self.batch: list[Any] = []
        self.rejected: list[Any] = []
        for _ in range(size):
            self.add(new_req(f"waiting-{next(_rids)}"))
        self.check(self.waiting, list(self._held_reqs(self.waiting)), [])
        if len(self.waiting) != size:
            raise ProbeFailure(f"{side} door: {len(self.waiting)} of {size} valid requests are waiting")

    def setup(self) -> None:
        self.batch, self.rejected = [], []
        for i in range(_arrivals(self.size)):
            req = new_req(f"arrival-{next(_rids)}")
            if self.reject_every and i % self.reject_every == self.reject_every - 1:
                req.set_finish_with_abort(INTAKE_REJECTION)  # what intake validation does (HTTP 400)
                self.rejected.append(req)
            self.batch.append(req)

    def run(self) -> int:
        add = self.add
        for req in self.batch:
            add(req)
        return len(self.batch)

    def teardown(self) -> None:
        arrived = self.waiting[self.size :]
        rejected = {id(r) for r in self.rejected}
        self.check(arrived, [r for r in self.batch if id(r) not in rejected], self.rejected)
        del self.waiting[self.size :]
        self.door.side.seen["cache_abort"].calls.clear()  # the bench keeps no request alive between runs
        for sent in self.door.side.seen["sockets"].sent.values():
            sent.clear()

    def _held_reqs(self, held: list[Any]) -> list[Any]:
        return held if self.side == "prefill" else [d.req for d in held]

    def check(self, arrived: list[Any], valid: list[Any], rejected: list[Any]) -> None:
        """Every valid request waits with its sender/receiver; a rejected one waits or is retired."""
        from sglang.srt.disaggregation.fake.conn import FakeKVReceiver, FakeKVSender

        held = {id(r) for r in self._held_reqs(arrived)}
        if self.side == "prefill":
            ok = [isinstance(getattr(r, "disagg_kv_sender", None), FakeKVSender) for r in valid]
        else:
            receivers = {id(d.req): d.kv_receiver for d in arrived}
            ok = [isinstance(receivers.get(id(r)), FakeKVReceiver) for r in valid]
        if not all(ok) or not all(id(r) in held for r in valid):
            raise ProbeFailure(f"{self.side} door: a valid request was not admitted with its transfer endpoint")
        stray = [r.rid for r in rejected if (id(r) in held) == r.finished()]
        if stray:
            raise ProbeFailure(f"{self.side} door: rejected request(s) neither waiting nor retired: {stray[:3]}")


def workloads(kit: Kit) -> list[Workload]:
    ensure_runtime()
    # set_finish_with_abort logs the rejection at ERROR on TP rank 0: part of the scenario.
    kit.allow_log(re.escape(INTAKE_REJECTION))
    return [
        Workload(
            f"{side}_door.{kind}",
            "requests",
            lambda n, side=side, every=every: DoorLoad(kit, side, n, every),
            f"{'valid' if every is None else 'valid + 1 in 4 intake-rejected'} requests through the wired "
            f"{side} side's _add_request_to_queue, n waiting",
        )
        for side in ("prefill", "decode")
        for kind, every in (("valid", None), ("mixed", REJECT_EVERY))
    ]
