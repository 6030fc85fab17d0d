"""A bootstrap room used a second time on one decode rank: the real receiver of a new request on an old room id.

SGLang's tokenizer picks bootstrap rooms at random, so a room id comes round
again while a prefill rank may still answer for its previous use. The new
request here is a real ``Req`` given the old room id, with a real receiver of
the same back end on the same KV manager, transfer queue and wire
(:mod:`harness.decode_kv`), bootstrapped and its destination published with
its real ``send_metadata`` -- exactly what the first request got. Only the
room id is chosen; every ack, arming and release is the build's own code.
"""

from __future__ import annotations

import dataclasses

from harness import decode_kv
from harness.decode_kv import DecodeRank, prefill_endpoint
from harness.requests import new_req


def reuse_room(rank: DecodeRank, rid: str, prefill_ranks: int, backend: str) -> DecodeRank:
    """A new request ``rid`` on ``rank``'s room, queued for transfer after the first use was released.

    The first request must be released already (its receiver cleared the room);
    the new one gets a fresh metadata slot of the real allocator.
    """
    from sglang.srt.disaggregation.decode import DecodeRequest

    if rank.decode_req.kv_receiver is not None:
        raise RuntimeError(f"room {rank.room} is still held by {rank.decode_req.req.rid}: release it first")
    room = rank.room
    req = new_req(rid)
    req.bootstrap_room = room  # the id comes round again (the tokenizer draws rooms at random)
    receiver = decode_kv._receiver(rank.kit, rank.wire, rank.kv_mgr, room, prefill_ranks, True, backend)
    slot = rank.queue.req_to_metadata_buffer_idx_allocator.alloc()
    if slot is None:
        raise RuntimeError(f"no free metadata slot for {rid}")
    rank.queue.metadata_buffers.bootstrap_room[slot, 0] = room
    decode_req = DecodeRequest(req=req, kv_receiver=receiver, metadata_buffer_index=slot)
    rank.queue.queue.append(decode_req)
    reused = dataclasses.replace(
        rank,
        receiver=receiver,
        decode_req=decode_req,
        release_kv_cache=rank.release_kv_cache,
    )
    reused.publish_metadata()
    return reused


def abort_frames_since(rank: DecodeRank, prefill_rank: int, since: int) -> list[list[bytes]]:
    """The ABORTs sent to ``prefill_rank`` after the first ``since`` messages on the wire."""
    endpoint = prefill_endpoint(prefill_rank)
    return [frames for ep, frames in rank.wire.sent[since:] if ep == endpoint and frames and frames[0] == b"ABORT"]


def wire_mark(rank: DecodeRank) -> int:
    """How many messages the wire carried so far (a bookmark for :func:`abort_frames_since`)."""
    return len(rank.wire.sent)
