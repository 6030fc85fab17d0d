"""Steps of a request's life through a :class:`harness.pd_pair.Pair`, each one the build's own queue method.

A scenario is a sequence of these steps; the order is the scenario's (or the
schedule search's) choice and is named in the observation. After each step
the caller may check the ownership invariant (:meth:`Flow.check`). Each step runs
with its own side's runtime context in effect (``active()``: a wired side's published
context, :class:`harness.server.Published`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from harness.pages import Foreign
from harness.pd_pair import Pair, Read
from harness.pd_sides import NUM_KV_HEADS, DecodeSide, PrefillSide
from harness.requests import abort_status

OK = 200


@dataclass
class Leak:
    victim: str
    owner: str
    pages: list[int]
    canary: bool


@dataclass
class Flow:
    pair: Pair
    prefill: PrefillSide
    decode: DecodeSide
    p_reqs: dict[str, Any] = field(default_factory=dict)
    d_reqs: dict[str, Any] = field(default_factory=dict)
    running: list[str] = field(default_factory=list)
    leaks: list[Leak] = field(default_factory=list)

    # -- intake ----------------------------------------------------------------
    def arrive(self, rid: str, prompt_len: int, *, reject_on_prefill: str | None = None) -> None:
        """The router hands the request to both schedulers' doors (prefill rejecting it at intake if told)."""
        from harness.requests import reject_at_intake

        p, d = self.pair.request(rid, prompt_len)
        self.p_reqs[rid], self.d_reqs[rid] = p, d
        if reject_on_prefill is not None:
            reject_at_intake(self.pair.kit, p, reject_on_prefill)
        with self.prefill.active():
            self.prefill.queue.add(p, NUM_KV_HEADS)
        with self.decode.active():
            self.decode.admit(d)

    # -- decode: reserve pages and publish them --------------------------------
    def preallocate(self) -> list[str]:
        before = self.pair.decode.free_pages()
        with self.decode.active():
            ready, *_ = _pair_of(self.decode.prealloc.pop_preallocated())
        for decode_req in ready:
            self.pair.note_decode_allocation(before, decode_req.req.rid)
            before = self.pair.decode.free_pages()
        self.decode.transfer.extend(ready)
        return [d.req.rid for d in ready]

    # -- prefill: bootstrap, forward, result ----------------------------------
    def bootstrap(self) -> list[str]:
        with self.prefill.active():
            popped = self.prefill.queue.pop_bootstrapped()
        self.prefill.scheduler.waiting_queue.extend(popped)
        return [r.rid for r in popped]

    def prefill_run(self, rid: str) -> None:
        """The prefill batch of one request: the fake forward, then the build's result step."""
        import torch
        from sglang.srt.managers.utils import GenerationBatchResult

        req = self.p_reqs[rid]
        if req in self.prefill.scheduler.waiting_queue:
            self.prefill.scheduler.waiting_queue.remove(req)
        self.pair.prefill_forward(req)
        kit = self.pair.kit
        batch = kit.fake(
            "batch",
            reqs=[req],
            spec_info=None,
            prefill_stats=_prefill_stats(self.prefill.scheduler, req) if self.prefill.published else None,
            dp_cooperation_info=None,
            return_logprob=False,
            forward_iter=None,
        )
        result = GenerationBatchResult(next_token_ids=torch.full((1,), 11))
        with self.prefill.active():
            self.prefill.scheduler.process_batch_result_disagg_prefill(batch, result)

    # -- decode: transfer poll, attention, finish -----------------------------
    def poll_transfers(self) -> list[str]:
        with self.decode.active():
            done = self.decode.transfer.pop_transferred()
        for req in done:
            self.running.append(req.rid)
        return [r.rid for r in done]

    def decode_tick(self) -> list[str]:
        """One pass of the decode event loop's queue step: the build's own ``process_decode_queue``.

        Acks the prefill rank sent since the last pass arrive first (the wire is asynchronous).
        Requests whose KV arrived go to the scheduler's waiting queue; here they start decoding.
        """
        scheduler = self.decode.scheduler
        with self.decode.active():
            self.pair.deliver_acks()
            scheduler.process_decode_queue()
        arrived = [req.rid for req in scheduler.waiting_queue]
        scheduler.waiting_queue.clear()
        self.running.extend(arrived)
        self.note_holders()
        return arrived

    def tick(self) -> None:
        """One pass of each event loop, in the order the lab fixes for every pass.

        Decode's queue step (``process_decode_queue``); prefill's bootstrap poll; every
        request prefill has bootstrapped runs one prefill batch (fake forward, real result
        step); prefill's in-flight poll. Writes land as the wire decides.
        """
        self.decode_tick()
        self.bootstrap()
        for req in list(self.prefill.scheduler.waiting_queue):
            if self.pair.prefill_fits(req):
                self.prefill_run(req.rid)
        self.prefill_poll()

    def note_holders(self) -> None:
        """A page whose holder changed since the last look is a new allocation (a new generation)."""
        ledger = self.pair.ledger
        for rid, req in self.d_reqs.items():
            if req.kv.req_pool_idx is None or not req.kv.holds_kv:
                continue
            for page in self.pair.decode.pages_of(req):
                if ledger.holder.get(page) != rid:
                    ledger.allocated([page], rid)

    def attend_all(self) -> list[Read]:
        """Every running request attends once (a decode step of the batch); each read is checked."""
        return [self.decode_step(rid) for rid in list(self.running)]

    def decode_step(self, rid: str) -> Read:
        read = self.pair.attend(self.d_reqs[rid])
        self.check(read)
        return read

    def finish(self, rid: str) -> None:
        """The decode request ends; its pages go back to the real allocator through the real release."""
        import inspect

        from sglang.srt.disaggregation import decode

        req = self.d_reqs[rid]
        # release_kv_cache(req, cache, is_insert=True) (<= 0.5.21) became (req, cache, *, checkpoint) (0.5.22)
        flag = "checkpoint" if "checkpoint" in inspect.signature(decode.release_kv_cache).parameters else "is_insert"
        with self.decode.active():
            decode.release_kv_cache(req, self.pair.decode.cache, **{flag: True})
        self.running.remove(rid)

    def prefill_poll(self) -> None:
        """Prefill's in-flight poll: the build's ``process_disagg_prefill_inflight_queue`` releases what is done."""
        with self.prefill.active():
            self.prefill.scheduler.process_disagg_prefill_inflight_queue()

    def abortable(self) -> list[str]:
        """Decode requests a client abort can reach in the PD queues (not yet decoding, not finished)."""
        queued = [d.req.rid for d in self.decode.prealloc.queue] + [d.req.rid for d in self.decode.transfer.queue]
        return [rid for rid in queued if self.d_reqs[rid].finished_reason is None]

    def client_abort(self, rid: str) -> None:
        """The client aborts: the real ``Scheduler.abort_request`` on the decode scheduler with a real ``AbortReq``."""
        from sglang.srt.managers.io_struct import AbortReq

        with self.decode.active():
            self.decode.scheduler.abort_request(AbortReq(rid=rid))

    def time_passes(self, land: bool) -> None:
        """Held writes settle (land, or fail), then the clock passes every timeout of the build."""
        wire = self.pair.wire
        for write in wire.pending():
            if land:
                wire.land(write, late=True)
            else:
                wire.fail(write)
        wire.hold = False
        self.wait_out(max(self.pair.waiting_timeout_s, self.pair.release_timeout_s) + 1)

    def wait_out(self, seconds: float) -> None:
        """Time passes with nothing landing (the lab's virtual clock)."""
        self.pair.clock += seconds

    # -- the invariant ---------------------------------------------------------
    def check(self, read: Read) -> None:
        by_owner: dict[str, list[Foreign]] = {}
        for f in read.foreign:
            by_owner.setdefault(f.owner, []).append(f)
        canary_owners = {self.pair.owner(n) for n in read.canaries}
        for owner, pages in by_owner.items():
            self.leaks.append(Leak(read.rid, owner, [f.page for f in pages], owner in canary_owners))
        for n, pages in read.canary_pages.items():
            owner = self.pair.owner(n)
            if owner not in by_owner:  # the page is stamped with the victim's own write, its content is not
                self.leaks.append(Leak(read.rid, owner, pages, True))

    def status(self, side: str, rid: str) -> list[int | None]:
        if side == "prefill":
            return self.prefill.statuses(rid)
        return self.decode.statuses(rid)

    def decode_outcome(self, rid: str) -> int | None:
        """What decode answered: 200 when it decoded the request, its abort status, or None (still waiting)."""
        req = self.d_reqs[rid]
        status = abort_status(req)
        if status is not None:
            return status
        return OK if any(r.rid == rid for r in self.pair.reads) else None


def _pair_of(popped: Any) -> tuple[list[Any], list[Any]]:
    if isinstance(popped, tuple):
        return popped[0], popped[1]
    return popped, []


def _prefill_stats(scheduler: Any, req: Any) -> Any:
    """The build's ``PrefillStats`` of a one-request batch, as its prefill adder would count it.

    The request's whole prompt is new (no prefix hit: the cache is disabled), nothing else runs,
    the new-token ratio is the scheduler's tracker's. A wired scheduler's real metrics reporter logs it.
    """
    from sglang.srt.managers.scheduler_components.metrics_reporter import PrefillStats
    from sglang.srt.observability.metrics_collector import QueueCount

    return PrefillStats(
        log_input_tokens=len(req.origin_input_ids),
        log_hit_tokens=0,
        new_token_ratio=scheduler.new_token_ratio_tracker.current,
        num_running_reqs=QueueCount.from_reqs([]),
        num_new_seqs=1,
    )
