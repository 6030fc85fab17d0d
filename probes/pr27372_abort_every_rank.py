"""#27372 -- a decode-side abort reaches every prefill rank, not only one.

Scenario: the build's own decode server (:func:`harness.decode_kv.decode_side`),
with a request admitted through the scheduler that has published its
destination to three prefill ranks (prefill TP above decode TP). ``client_abort.*``
-- the client aborts it (the real ``Scheduler.abort_request``), and one pass of
the decode queue runs. The ABORT frames the receiver sends are read off the
faked wire, per prefill rank. (An abort decode itself starts on a failed
transfer is #41404's, from 0.5.21.)

With the fix each prefill rank receives the ABORT and drops the chunks it has
not posted yet; a rank that never hears of the abort keeps writing into pages
decode is about to free. Every pinned release (0.5.19 on) carries it, so no
pinned release shows the bug; the reverting mutation (ABORT to the first rank
only) shows what the probe reads without it.

Controls (equal with and without the fix): the first prefill rank is told,
so a wire the fake failed to capture cannot read as "fixed"; a receiver that
never learnt its prefill ranks notifies nobody. Fields read
``<backend>:<field>`` on Mooncake and NIXL.
"""

from __future__ import annotations

from typing import Any

from difflab.probe.kit import Kit
from harness.decode_kv import DecodeRank, DecodeSide, decode_side, prefill_endpoint
from harness.features import Machinery

BACKENDS = ("mooncake", "nixl")
PREFILL_RANKS = 3

# --- version adaptations (one place, detected by feature) -----------------------
# The decode receiver's abort path (every pinned release has it).
MACHINERY = Machinery(
    "decode-side abort notification", "sglang.srt.disaggregation.common.conn", "CommonKVReceiver.abort"
)


def _told(rank: DecodeRank) -> dict[str, Any]:
    """Which prefill ranks the ABORT about this room reached."""
    told = [bool(rank.aborts(prefill_endpoint(r))) for r in range(PREFILL_RANKS)]
    return {"first_rank_aborted": told[0], "every_rank_aborted": all(told)}


# --- scenarios -------------------------------------------------------------------
def client_abort(side: DecodeSide) -> dict[str, Any]:
    """The client aborts: which prefill ranks hear of it?"""
    rank = side.admit("pr27372-001")
    rank.client_abort()
    side.step()
    return _told(rank)


def unnotifiable(side: DecodeSide) -> dict[str, Any]:
    """Control: a receiver that never learnt its prefill ranks notifies nobody."""
    rank = side.admit("pr27372-003")
    rank.receiver.bootstrap_infos = None  # the state this control models: the destinations were never learnt
    rank.client_abort()
    side.step()
    return {"ranks_aborted": rank.abort_messages()}


SCENARIOS = (client_abort, unnotifiable)


def observe(kit: Kit) -> dict[str, Any]:
    MACHINERY.require(kit)
    kit.allow_log(
        r"Decode transfer failed for request .* with exception KVTransferError\(bootstrap_room=\d+\): "
        r"Aborted by AbortReq\.$"
    )
    fields: dict[str, Any] = {}
    for backend in BACKENDS:
        with decode_side(kit, backend, prefill_ranks=PREFILL_RANKS) as side:
            found = {f"{s.__name__}.{k}": v for s in SCENARIOS for k, v in s(side).items()}
        fields |= kit.on_backend(backend, found)
    return fields
