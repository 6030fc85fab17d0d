"""#43719 (a) on NIXL, 0.5.23 -- a post NIXL rejects never acks the drain: the room is poisoned.

Scenario: a prefill rank's real ``NixlKVManager.transfer_worker`` writes a room's last
chunk to decode (deferred decode KV release on). The KV write is posted (faked, it
succeeds); the aux write goes through the build's own ``send_aux``, whose post NIXL
refuses (``agent.transfer`` answers ``ERR``). NIXL may already have part of that request
on the wire and does not wait for it, and the rejected request has no handle the worker
could wait on, so nothing proves its write is over.

Observations (acks are ABORT_ACKs sent to decode):

- ``rejected.acks``: decode aborted while the KV write was posted; is the drain acked
  when the worker concludes the failed batch? ``rejected.late_acks``: one more ABORT.
- ``quiet_rejected.acks``: nobody aborted during the write; decode's ABORT comes after
  the worker concluded the room Failed: is it acked?

In 0.5.21 and 0.5.22 the rejected post raises a plain ``Exception``; every handle the worker
holds settled, so the room is concluded Failed, its chunk uncounted and the drain acked
(at once, or at the next ABORT) while the rejected write may still land. From 0.5.23
``_post_xfer`` raises ``_NixlPostError`` and the worker poisons the room before it
concludes it: no ack until the room's next lifecycle, decode falls back to its release
timeout.

Controls (equal on both sides): the aux post is asked for once in every scenario
(``*.aux_posts``); a batch whose aux handle, posted, reports ``ERR`` and settles is
acked (``err_state.acks``, ``err_state.late_acks``) -- not a refused post, so 0.5.23 still
acks it; the same batch with every write succeeding is acked too (``posted.acks``,
``posted.late_acks``).

Not applicable where no settled failure is acked at all (0.5.19, 0.5.20): 0.5.19's
worker raises at the first ``ERR`` and only marks the room Failed, 0.5.20 concludes it
but never uncounts the failed chunk, so no drain ack follows any failed batch there and
the poison has nothing to withhold. The probe measures that (``err_state``) before it
judges: where the settled ``ERR`` batch is not acked, the back end reads not applicable.

Honesty: the worker catches every exception -- the behaviour under test. The agent and
the fakes are strict and guarded; every exception the worker caught must be SGLang's own
raise about the staged answers (:mod:`harness.nixl`), and the one ERROR log 0.5.21 -
0.5.22 write for the refused post (``Unexpected transfer worker error``) is allowed only
for that raise. The rank's bookkeeping is the build's own; the probe reads only what was
sent to decode and which posts were asked for.
"""

from __future__ import annotations

from typing import Any

from difflab.probe.kit import Kit
from harness.doors import backend_gap
from harness.nixl import BACKEND, DRAIN_ACK, REJECTED, NixlPrefillRank, Write, build_prefill_rank

REFUSED_POST_LOG = r"KVSender failed to post transfer"
"""The refused post's raise, in 0.5.21 - 0.5.22's ERROR log of it (a plain ``Exception``)."""

# ---------------------------------------------------------------------------
# Version adaptations, by feature:
#   decode's ABORT on the wire: harness.nixl.abort_from_decode
#   the refused post: a plain Exception logged at ERROR (<= 0.5.22), _NixlPostError logged as a
#     transport error (0.5.23): REFUSED_POST_LOG allows the former, harness.nixl accepts the latter
#   send_aux's notification argument (dropped in 0.5.23): the build's worker calls its own send_aux
#   no drain ack after a settled failure (0.5.19, 0.5.20): measured by err_state, not applicable
# ---------------------------------------------------------------------------
MACHINERY = DRAIN_ACK


def _late_acks(rank: NixlPrefillRank) -> int:
    """ABORT_ACKs for one more ABORT of the room."""
    start = rank.sent_so_far()
    rank.abort()
    return rank.acks(since=start)


def _last_chunk(kit: Kit, room: int, aux_state: str, *, abort_during: bool) -> NixlPrefillRank:
    """The room's last chunk: the KV write succeeds, the build's own send_aux posts the aux write."""
    rank = build_prefill_rank(kit, room=room, real_send_aux=True)
    rank.kv_write = Write("DONE", during=rank.abort if abort_during else None)
    rank.aux_write = Write(aux_state)
    rank.run_worker(rank.chunk(last=True))
    return rank


def _aborted_during(kit: Kit, room: int, aux_state: str) -> dict[str, Any]:
    rank = _last_chunk(kit, room, aux_state, abort_during=True)
    acks, posts = rank.acks(), rank.send_aux.count
    return {"acks": acks, "late_acks": _late_acks(rank), "aux_posts": posts}


# --- scenarios -------------------------------------------------------------------
def err_state(kit: Kit) -> dict[str, Any]:
    """Control: the aux write posted, its handle reports ERR and settles; decode aborted meanwhile."""
    return _aborted_during(kit, 43201, "ERR")


def posted(kit: Kit) -> dict[str, Any]:
    """Control: every write succeeds; decode aborted while the KV write was posted."""
    return _aborted_during(kit, 43202, "DONE")


def rejected(kit: Kit) -> dict[str, Any]:
    """NIXL refuses the aux post; decode aborted while the KV write was posted."""
    kit.allow_log(REFUSED_POST_LOG)
    return _aborted_during(kit, 43203, REJECTED)


def quiet_rejected(kit: Kit) -> dict[str, Any]:
    """NIXL refuses the aux post, nobody aborted; then decode's ABORT for the failed room."""
    kit.allow_log(REFUSED_POST_LOG)
    rank = _last_chunk(kit, 43204, REJECTED, abort_during=False)
    posts = rank.send_aux.count
    return {"acks": _late_acks(rank), "aux_posts": posts}


SCENARIOS = (posted, rejected, quiet_rejected)


def observe(kit: Kit) -> dict[str, Any]:
    MACHINERY.require(kit)
    gap = backend_gap(BACKEND)
    if gap is not None:
        return kit.backend_not_applicable(BACKEND, gap)
    settled_failure = err_state(kit)
    if settled_failure["acks"] == 0 and settled_failure["late_acks"] == 0:
        return kit.backend_not_applicable(
            BACKEND,
            "no drain ack follows a failed batch whose handles settled (err_state acked nothing): "
            "the poison of a refused post has no ack to withhold",
        )
    fields = {f"err_state.{k}": v for k, v in settled_failure.items()}
    for scenario in SCENARIOS:
        fields.update({f"{scenario.__name__}.{k}": v for k, v in scenario(kit).items()})
    return kit.on_backend(BACKEND, fields)
