"""#43719(a) throughput: successful and failed sends through the Mooncake transfer worker's ack/poison bookkeeping.

The fix adds bookkeeping to the real ``MooncakeKVManager.transfer_worker``: a failed
KV, state or aux write poisons the room before anything else, and every drain-ack
check consults the poison. Each send already counts its outstanding writes and asks
whether an abort's drain ack is due. What that costs per send, and whether it grows
with the rooms the prefill rank holds, is measured on the rank the behaviour probe
builds (:mod:`harness.mooncake`: real manager in prefill mode, deferred release forced
on, its bookkeeping from this build's constructor; the RDMA writes and the zmq socket
to decode faked).

Workloads; the load ``n`` is the rooms held -- ``n`` rooms WaitingForInput, each with
its last chunk queued for the worker (built before the timer):

- ``sends.succeeded``: every KV and aux write succeeds; each room concludes Success and
  decode is told so (sends/s);
- ``sends.failed``: every KV write fails (returns non-zero, as Mooncake's timeout does);
  each room concludes Failed and decode is told so. Each room goes to a decode rank of
  its own (a session registered for it), so the session a failure marks dead is never
  the next room's: every send takes the failed-write path, not the dead-session one.

Timed: the real worker draining the ``n`` chunks. Checked after it, never timed: one KV
write attempted per room and decode told Success (Failed) for each -- else a probe
failure. Then the scheduler's side of the lifecycle, untimed: the real sender's
``clear()`` for every room, so the rank holds ``n`` rooms again at the next run.
"""

from __future__ import annotations

import itertools
import re
from typing import Any

from difflab.probe.bench import Workload
from difflab.probe.kit import Kit, ProbeFailure
from harness.mooncake import DECODE_SESSION, PrefillRank, build_prefill_rank

_rooms = itertools.count(700_000)
_sessions = itertools.count()


class Sends:
    """A prefill rank holding ``size`` rooms whose last chunk waits for the transfer worker."""

    def __init__(self, kit: Kit, size: int, *, failing: bool) -> None:
        self.size, self.failing = size, failing
        self.rank: PrefillRank = build_prefill_rank(kit, room=next(_rooms))
        self.rank.send_result = (lambda: -1) if failing else (lambda: 0)
        self.sender = self.rank.sender()
        self.rooms: list[int] = []
        self.chunks: list[Any] = []

    def setup(self) -> None:
        rank = self.rank
        self.rooms = [next(_rooms) for _ in range(self.size)]
        for room in self.rooms:
            session = DECODE_SESSION
            if self.failing:
                session = f"decode-rank-{next(_sessions)}"
                rank.register_decode_session(session)
            rank.open_room(room, session)
        self.chunks = [rank.chunk(last=True, room=room) for room in self.rooms]
        rank.wire.sent.clear()
        self.before = rank.send_kvcache.count

    def run(self) -> int:
        self.rank.run_worker(*self.chunks)
        return len(self.chunks)

    def teardown(self) -> None:
        from sglang.srt.disaggregation.base.conn import KVPoll

        rank = self.rank
        want = str(int(KVPoll.Failed if self.failing else KVPoll.Success)).encode("ascii")
        told = {
            frames[0]: frames[1]
            for endpoint, frames in rank.wire.sent
            if endpoint == rank.decode_endpoint and len(frames) >= 2
        }
        attempts = rank.send_kvcache.count - self.before
        wrong = [r for r in self.rooms if told.get(str(r).encode("ascii")) != want]
        if attempts != self.size or wrong:
            raise ProbeFailure(
                f"{self.size} {'failed' if self.failing else 'successful'} sends: {attempts} KV writes attempted, "
                f"{len(wrong)} room(s) not reported {'Failed' if self.failing else 'Success'} to decode"
            )
        for room in self.rooms:  # the scheduler is done with each request: the real sender's clear()
            self.sender.bootstrap_room = room
            self.sender._owns_bootstrap_room = True
            self.sender.clear()
        for recorder in (rank.send_kvcache, rank.send_state, rank.send_aux):
            recorder.calls.clear()  # the bench keeps no chunk alive between runs
        rank.wire.sent.clear()
        self.before = 0
        self.chunks = []


def workloads(kit: Kit) -> list[Workload]:
    # The worker marks a decode rank's Mooncake session dead after a failed write, at ERROR.
    kit.allow_log(rf"^Session ({re.escape(DECODE_SESSION)}|decode-rank-\d+) failed\.$")
    return [
        Workload(
            f"sends.{kind}",
            "sends",
            lambda n, failing=failing: Sends(kit, n, failing=failing),
            f"n rooms' last chunk through the real transfer_worker, every write {kind}",
        )
        for kind, failing in (("succeeded", False), ("failed", True))
    ]
