"""More decode peers for one Mooncake prefill rank's room, and decode's ABORT as each peer sends it.

With prefill TP smaller than decode TP several decode ranks read one room:
each registered its own Mooncake session and endpoint, each gets the room's
KV, and each aborting rank sends its own ABORT and waits for its own drain ack.
:func:`add_decode_peer` gives the rank of :func:`harness.mooncake.build_prefill_rank`
one more such peer: its registration, its ``TransferInfo`` in the room, and a
recording socket on the wire to its endpoint (SGLang's own code picks which
endpoint every message goes to).
"""

from __future__ import annotations

import itertools
import threading

from harness.mooncake import DECODE_IP, DECODE_PORT, DECODE_SESSION, PrefillRank, decode_registration
from harness.wire import tcp_endpoint

_generations = itertools.count(1)


def peer_endpoint(port: int) -> str:
    return tcp_endpoint(DECODE_IP, port)


def add_decode_peer(rank: PrefillRank, session: str, port: int) -> None:
    """Another decode rank reads ``rank``'s room: its session registered, its destination in the room, a socket."""
    import numpy as np
    from sglang.srt.disaggregation.mooncake.conn import TransferInfo

    endpoint = peer_endpoint(port)
    rank.mgr._socket_cache[endpoint] = rank.wire.socket(endpoint)
    rank.mgr._socket_send_locks[endpoint] = threading.Lock()
    rank.mgr.decode_kv_args_table[session] = decode_registration(session)
    infos = rank.mgr.transfer_infos[rank.room]
    for info in infos.values():
        info.required_dst_info_num = len(infos) + 1
    infos[session] = TransferInfo(
        room=rank.room,
        endpoint=DECODE_IP,
        dst_port=port,
        mooncake_session_id=session,
        dst_kv_indices=np.array([20, 21, 22, 23], dtype=np.int32),
        dst_aux_index=1,
        dst_state_indices=[],
        required_dst_info_num=len(infos) + 1,
        is_dummy=False,
    )


# --- version adaptation: decode's ABORT on the wire -------------------------------
def abort_from(room: int, port: int = DECODE_PORT) -> list[bytes]:
    """The ABORT the decode rank at ``port`` sends for ``room``, in this release's wire form.

    0.5.22: ``AbortNotification`` with the decode rank's abort generation, which
    its drain ack must echo. <= 0.5.21: four frames (room, decode ip, decode port).
    """
    from sglang.srt.disaggregation.common import conn

    if hasattr(conn, "AbortNotification"):  # 0.5.22
        return conn.AbortNotification(
            room=room, decode_ip=DECODE_IP, decode_port=port, generation=next(_generations)
        ).to_zmq()
    return [b"ABORT", str(room).encode("ascii"), DECODE_IP.encode("ascii"), str(port).encode("ascii")]


def acks_to(rank: PrefillRank, port: int, since: int = 0) -> int:
    """Drain acks (ABORT_ACK) the rank sent the decode peer at ``port``; a byte-identical repeat counts once."""
    return rank.wire.count_distinct(b"ABORT_ACK", peer_endpoint(port), since)


def first_peer() -> tuple[str, int]:
    """The decode peer every prefill rank of the harness starts with: (session, port)."""
    return DECODE_SESSION, DECODE_PORT
