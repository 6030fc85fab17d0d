"""A decode rank whose KV manager decides deferred release itself, as this build's constructor does.

:func:`harness.decode_kv.build_decode_rank` forces the manager's
``enable_deferred_decode_kv_release`` on or off, because most probes judge
what a deferral *does*. Whether a back end defers at all is the build's
decision: its constructor combines the switch
(``SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE``, the build's default) with
the back end's declared capability (``supports_deferred_decode_kv_release``,
0.5.21+). :func:`build_decode_rank_as_built` builds the same rank with that
one attribute left to the build (``harness.strict`` evaluates the build's own
constructor expression and reports the value it found).
"""

from __future__ import annotations

from typing import Any

from difflab.probe.kit import Kit
from harness import decode_kv
from harness.decode_kv import DecodeRank, build_decode_rank, transport_classes
from harness.runtime import swapped
from harness.strict import strict_instance


def _manager_as_built(kit: Kit, backend: str, manager_defers: bool) -> Any:
    """The decode KV manager of ``backend`` with every attribute :mod:`harness.decode_kv` gives but the switch."""
    from sglang.srt.disaggregation.utils import DisaggregationMode

    del manager_defers  # left to the build's constructor
    manager_cls, _ = transport_classes(backend)
    return strict_instance(
        kit,
        manager_cls,
        "decode_kv_mgr",
        disaggregation_mode=DisaggregationMode.DECODE,
        local_ip=decode_kv.DECODE_IP,
        rank_port=decode_kv.DECODE_PORT,
        **decode_kv._engine_attrs(kit, backend),
    )


def build_decode_rank_as_built(kit: Kit, **options: Any) -> DecodeRank:
    """:func:`harness.decode_kv.build_decode_rank`, the manager's deferral left to the build."""
    with swapped(decode_kv, "_decode_manager", _manager_as_built):
        return build_decode_rank(kit, manager_defers=True, **options)
