"""A small probe over the real SGLang modules: imports the PD admission chain and reads its surface.

Used to show that the docker and subprocess runners observe the same fields on the
same source (0.5.20 lacks the #38935 door check, 0.5.21 has it). It drives real code
too: ``FINISH_ABORT.to_json`` and the real ``is_unadmitted_reject`` where it exists.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any


def observe(kit: Any) -> dict[str, Any]:
    from sglang.srt.disaggregation import decode, prefill, utils
    from sglang.srt.managers import schedule_batch, scheduler

    abort = schedule_batch.FINISH_ABORT("too long", status_code=400).to_json()
    fields: dict[str, Any] = {
        "abort.json": sorted(abort.items()),
        "door.has_is_unadmitted_reject": hasattr(utils, "is_unadmitted_reject"),
        "door.has_retire_unadmitted_request": hasattr(scheduler.Scheduler, "retire_unadmitted_request"),
        "prefill.has_bootstrap_queue": hasattr(prefill, "PrefillBootstrapQueue"),
        "decode.has_prealloc_queue": hasattr(decode, "DecodePreallocQueue"),
    }
    if hasattr(utils, "is_unadmitted_reject"):
        req = SimpleNamespace(to_finish=None, finished_reason=None)
        try:
            fields["door.valid_request_rejected"] = bool(utils.is_unadmitted_reject(req))
        except Exception as exc:  # the real function wants more of a request: record what
            fields["door.valid_request_rejected"] = f"raised {type(exc).__name__}"
    return fields
