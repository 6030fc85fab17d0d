"""Steps of a request's life through a :class:`harness.pd_pair.Pair`, each one the build's own queue method.

A scenario is a sequence of these steps; the order is the scenario's (or the
schedule search's) choice and is named in the observation. After each step
the caller may check the ownership invariant (:meth:`Flow.check`).
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
        self.prefill.queue.add(p, NUM_KV_HEADS)
        self.decode.prealloc.add(d)

    # -- decode: reserve pages and publish them --------------------------------
    def preallocate(self) -> list[str]:
        before = self.pair.decode.free_pages()
        ready, *_ = _pair_of(self.decode.prealloc.pop_preallocated())
        for decode_req in ready:
            self.pair.note_decode_allocation(before, decode_req.req.rid)
            before = self.pair.decode.free_pages()
        self.decode.transfer.extend(ready)
        return [d.req.rid for d in ready]

    # -- prefill: bootstrap, forward, result ----------------------------------
    def bootstrap(self) -> list[str]:
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
        batch = kit.fake("batch", reqs=[req], spec_info=None, prefill_stats=None, dp_cooperation_info=None)
        result = GenerationBatchResult(next_token_ids=torch.full((1,), 11))
        self.prefill.scheduler.process_batch_result_disagg_prefill(batch, result)

    # -- decode: transfer poll, attention, finish -----------------------------
    def poll_transfers(self) -> list[str]:
        done = self.decode.transfer.pop_transferred()
        for req in done:
            self.running.append(req.rid)
        return [r.rid for r in done]

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
        decode.release_kv_cache(req, self.pair.decode.cache, **{flag: True})
        self.running.remove(rid)

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
        for owner in canary_owners - set(by_owner):
            self.leaks.append(Leak(read.rid, owner, [], True))

    def status(self, side: str, rid: str) -> list[int | None]:
        sent = (self.prefill if side == "prefill" else self.decode).sent
        return list(sent.get(rid, []))

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
