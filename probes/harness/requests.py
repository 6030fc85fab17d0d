"""Real SGLang ``Req`` objects in the states the PD probes need.

Every helper works on a real ``sglang.srt.managers.schedule_batch.Req`` and
changes it the way SGLang itself does (``set_finish_with_abort`` for an intake
rejection, ``FINISH_ABORT`` in ``to_finish`` for an abort of a running
request), so a probe observes SGLang's own state transitions, not ours.
"""

from __future__ import annotations

import contextlib
import inspect
import itertools
import re
from array import array
from collections.abc import Iterator
from http import HTTPStatus
from typing import Any

from difflab.probe.kit import Kit, StrictFake
from harness.runtime import ensure_runtime

# The message SGLang's tokenizer-side length check produces for an over-long prompt.
INTAKE_REJECTION = "Input length (1500 tokens) exceeds the maximum allowed length (1018 tokens)."
RUNNING_ABORT = "Aborted by AbortReq."
BOOTSTRAP_HOST = "10.0.0.2"
BOOTSTRAP_PORT = 8998

_rooms = itertools.count(4096)


def new_req(rid: str, prompt_len: int = 16, *, max_new_tokens: int = 8) -> Any:
    """A fresh PD request: real ``Req``, ``prompt_len`` prompt tokens, its own bootstrap room."""
    ensure_runtime()
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    return Req(
        rid=rid,
        origin_input_text="",
        origin_input_ids=array("q", range(prompt_len)),
        sampling_params=SamplingParams(max_new_tokens=max_new_tokens),
        bootstrap_host=BOOTSTRAP_HOST,
        bootstrap_port=BOOTSTRAP_PORT,
        bootstrap_room=next(_rooms),
    )


def reject_at_intake(kit: Kit, req: Any, message: str = INTAKE_REJECTION) -> None:
    """Reject ``req`` the way intake validation does: the real ``set_finish_with_abort`` (HTTP 400).

    It logs the message at ERROR on TP rank 0; that log is part of the scenario.
    """
    kit.allow_log(re.escape(message))
    req.set_finish_with_abort(message)


def abort_while_running(req: Any, message: str = RUNNING_ABORT, status: int = HTTPStatus.SERVICE_UNAVAILABLE) -> None:
    """Mark a request the scheduler already holds as aborted ("abort method 3": ``to_finish``)."""
    from sglang.srt.managers.schedule_batch import FINISH_ABORT

    req.to_finish = FINISH_ABORT(message, status)


def hold_kv(req: Any, tokens: int, row: int = 1) -> None:
    """Give ``req`` a KV row with ``tokens`` tokens allocated and committed, as after a prefill."""
    req.kv.req_pool_idx = row
    req.kv.kv_allocated_len = tokens
    req.kv.kv_committed_len = tokens


def drop_kv(req: Any) -> None:
    """What freeing the KV row leaves on the request (the row and its allocation are gone)."""
    req.kv.req_pool_idx = None
    req.kv.mark_kv_released()


def abort_status(req: Any) -> int | None:
    """The HTTP status of the abort ``req`` finished with, or None if it did not finish aborted."""
    from sglang.srt.managers.schedule_batch import FINISH_ABORT

    reason = req.finished_reason
    if not isinstance(reason, FINISH_ABORT):
        return None
    return int(reason.status_code) if reason.status_code is not None else None


def fake_output_streamer(kit: Kit) -> tuple[StrictFake, dict[str, list[int | None]]]:
    """The scheduler's output streamer (ZMQ to the tokenizer), faked; returns (fake, sent).

    ``sent[rid]`` lists what the client of ``rid`` received, one entry per
    response streamed: the HTTP status of its abort at that moment (None if it
    was not finished aborted). An empty list means the client heard nothing.
    """
    sent: dict[str, list[int | None]] = {}

    def stream_output(reqs: list[Any], *args: Any, **kwargs: Any) -> None:
        for req in reqs:
            sent.setdefault(req.rid, []).append(abort_status(req))

    recorder = kit.recorder("output_streamer.stream_output", side_effect=stream_output)
    return kit.fake("output_streamer", stream_output=recorder), sent


# ---------------------------------------------------------------------------
# Version adaptations, detected by feature.
#   scheduled extent: Req.set_extend_range(start, end)      (<= 0.5.21)
#                     Req.prefix_len / Req.extend_end       (0.5.22 dropped set_extend_range)
#   FakeKVSender(...): dest_tp_ranks / pp_rank parameters   (gone in 0.5.22)
# ---------------------------------------------------------------------------
def set_scheduled_extent(req: Any, start: int, end: int) -> None:
    """Record that this round prefills prompt tokens ``[start, end)``."""
    if hasattr(type(req), "set_extend_range"):
        req.set_extend_range(start, end)
    else:
        req.prefix_len = start
        req.extend_end = end


def fake_kv_sender(mgr: Any, req: Any) -> Any:
    """The real ``FakeKVSender`` of the 'fake' transfer backend, built with this release's signature."""
    from sglang.srt.disaggregation.fake.conn import FakeKVSender

    offered = {
        "mgr": mgr,
        "bootstrap_addr": f"{req.bootstrap_host}:{req.bootstrap_port}",
        "bootstrap_room": req.bootstrap_room,
        "dest_tp_ranks": [0],
        "pp_rank": 0,
        "req_has_disagg_prefill_dp_rank": False,
    }
    accepted = inspect.signature(FakeKVSender).parameters
    return FakeKVSender(**{k: v for k, v in offered.items() if k in accepted})


# ---------------------------------------------------------------------------
# The tokenizer side's hand-off: what reaches a scheduler's ``process_input_requests``.
# ---------------------------------------------------------------------------
def tokenized_request(rid: str, prompt_len: int = 16, *, max_new_tokens: int = 8, vocab_size: int = 256) -> Any:
    """A real ``TokenizedGenerateReqInput`` as the tokenizer manager builds it for a PD request.

    Its sampling parameters are normalised and verified as the tokenizer manager does
    (no tokenizer loaded: ``normalize(None)``); ``prompt_len`` token ids, its own
    bootstrap room, the PD bootstrap address of :func:`new_req`.
    """
    ensure_runtime()
    from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
    from sglang.srt.sampling.sampling_params import SamplingParams

    sampling = SamplingParams(max_new_tokens=max_new_tokens)
    sampling.normalize(None)
    sampling.verify(vocab_size)
    return TokenizedGenerateReqInput(
        rid=rid,
        input_text="",
        input_ids=array("q", range(prompt_len)),
        input_embeds=None,
        mm_inputs=None,
        token_type_ids=None,
        sampling_params=sampling,
        return_logprob=False,
        logprob_start_len=-1,
        top_logprobs_num=0,
        token_ids_logprob=None,
        stream=False,
        bootstrap_host=BOOTSTRAP_HOST,
        bootstrap_port=BOOTSTRAP_PORT,
        bootstrap_room=next(_rooms),
    )


@contextlib.contextmanager
def built_reqs() -> Iterator[list[Any]]:
    """Every real ``Req`` constructed while open (whoever builds it: intake, a session, a fork's own path)."""
    from sglang.srt.managers.schedule_batch import Req

    built: list[Any] = []
    real_init = Req.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        real_init(self, *args, **kwargs)
        built.append(self)

    Req.__init__ = init
    try:
        yield built
    finally:
        Req.__init__ = real_init
