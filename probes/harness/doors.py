"""The two PD admission doors as the build's server reaches them.

:class:`Door` is one side (prefill, decode or null) the build's own start-up built
(:mod:`harness.server`): its ``run_scheduler_process``, scheduler class and
``init_disaggregation``, with only the model, GPU, process groups and ZMQ faked, and on
an RDMA back end its transfer edges (:mod:`harness.transport`), so the back end's KV
manager, senders and receivers are built by their own constructors.
A request enters where the server hands it on -- the tokenizer's message through the
scheduler's ``process_input_requests`` (:meth:`Door.submit`), or a request intake does not
build through ``_add_request_to_queue`` (:meth:`Door.admit`) -- and the door is whatever
queue the build's set-up instantiated.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from difflab.probe.kit import Kit, ProbeFailure

# ---------------------------------------------------------------------------
# The doors as the build's server reaches them: its own scheduler (harness.server), its
# own dispatch. Requests enter through ``Scheduler._add_request_to_queue`` (the intake's
# hand-off), a held re-bootstrap through the decode queue's own ``enqueue_held_rebootstrap``.
# ---------------------------------------------------------------------------
TRANSFER_BACKENDS = ("mooncake", "nixl", "mori")
"""The RDMA back ends a door is run on (each builds its own senders and receivers)."""


def default_backend() -> str:
    """The transfer back end this build's ``ServerArgs`` selects when the launch names none."""
    from sglang.srt.server_args import ServerArgs

    return str(ServerArgs(model_path="dummy").disaggregation_transfer_backend)


def backend_gap(backend: str) -> str | None:
    """Why this build cannot run ``backend`` (it does not ship it); None where it can."""
    from sglang.srt.server_args import DISAGG_TRANSFER_BACKEND_CHOICES

    if backend not in DISAGG_TRANSFER_BACKEND_CHOICES:
        return f"this build ships no {backend} transfer back end"
    return None


def on_every_backend(kit: Kit, scenarios: Callable[[str], dict[str, Any]]) -> dict[str, Any]:
    """``scenarios(backend)`` on every RDMA back end, fields named ``<backend>:<field>``.

    A back end this build lacks reports the one field saying so (``not-applicable`` there).
    """
    kit.event("transfer-backends", default=default_backend(), run=list(TRANSFER_BACKENDS))
    fields: dict[str, Any] = {}
    for backend in TRANSFER_BACKENDS:
        gap = backend_gap(backend)
        if gap is not None:
            fields.update(kit.backend_not_applicable(backend, gap))
            continue
        fields.update(kit.on_backend(backend, scenarios(backend)))
    return fields


@contextlib.contextmanager
def _transport(kit: Kit, backend: str) -> Iterator[None]:
    """The transfer edges of ``backend`` faked (:mod:`harness.transport`), held for the door's life.

    The build's ``init_disaggregation`` then runs the back end's real KV manager
    constructor (engine registration, control socket, bootstrap registration, its
    threads recorded, not started), and every sender and receiver a request gets is
    built by its real constructor against the same fakes.
    """
    from harness.decode_kv import _import_transport
    from harness.transport import Transport

    _import_transport(backend)
    transport = Transport(kit, backend, prefill_ranks=1)
    with transport.contexts(), transport.receiver_sockets():
        yield


class Door:
    """One side the build's start-up built, and what one request's admission did there."""

    def __init__(self, kit: Kit, mode: str, backend: str = "fake") -> None:
        from harness.server import start

        self.kit = kit
        self.mode = mode
        self.backend = backend
        self._held = contextlib.ExitStack()
        if backend != "fake":
            self._held.enter_context(_transport(kit, backend))
        try:
            # --page-size 1: what a launch of this dense model resolves; the checkpoint-less
            # "dummy" path returns before the resolution step that would set it.
            self.side = start(kit, mode, backend=backend, page_size=1)
        except BaseException:
            self._held.close()
            raise
        self.scheduler = self.side.scheduler
        if mode == "decode":
            manager = self.scheduler.disagg_decode_prealloc_queue.kv_manager
            if not hasattr(manager, "prefill_info_table"):
                # The 'fake' back end serves warm-up requests only; a request with a real
                # bootstrap host looks its prefill peer up in the table every real back
                # end's manager keeps. No peer has registered yet: it waits in pending_reqs.
                manager.prefill_info_table = {}

    def __enter__(self) -> Door:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Put the back end's transfer edges back (they stay faked while the door is open)."""
        self._held.close()

    def submit(self, rid: str, prompt_len: int = 16) -> tuple[Any, dict[str, Any]]:
        """Send a tokenized request to the scheduler as the tokenizer does; return its ``Req`` and the side's effects.

        The request enters through the scheduler's own ``process_input_requests`` (its
        dispatcher, ``handle_generate_request``, the intake validation of the build), so a
        build that validates or routes differently is judged by what its intake does. The
        ``Req`` is the one the intake built (every ``Req`` constructed meanwhile is noted).
        """
        from harness.requests import built_reqs, tokenized_request

        before = self._cache_aborts()
        with built_reqs() as built:
            self.scheduler.process_input_requests([tokenized_request(rid, prompt_len)])
        reqs = [r for r in built if r.rid == rid]
        if len(reqs) != 1:
            raise ProbeFailure(f"the build's intake built {len(reqs)} Req(s) for {rid!r}, expected 1")
        return reqs[0], self._effects(reqs[0], before)

    def admit(self, req: Any, *, retracted: bool = False) -> dict[str, Any]:
        """Hand ``req`` to the scheduler's dispatch; report what the side did with it."""
        before = self._cache_aborts()
        self.scheduler._add_request_to_queue(req, **({"is_retracted": True} if retracted else {}))
        return self._effects(req, before)

    def rebootstrap(self, req: Any) -> dict[str, Any]:
        """Stage ``req`` for re-bootstrap and resume it, as the decode side's own retract/resume path does."""
        before = self._cache_aborts()
        queue = self.scheduler.disagg_decode_prealloc_queue
        queue.hold_rebootstrap(req)
        queue.enqueue_held_rebootstrap()
        return self._effects(req, before)

    def _cache_aborts(self) -> int:
        from harness.runtime import cache_aborts

        return cache_aborts(self.side.seen["cache_abort"])

    def _effects(self, req: Any, cache_before: int) -> dict[str, Any]:
        effects: dict[str, Any] = {
            "retired": req.finished(),
            "streamed": self.side.seen["sockets"].streamed(req.rid),
            "cache_aborts": self._cache_aborts() - cache_before,
        }
        if self.mode == "prefill":
            queue = self.scheduler.disagg_prefill_bootstrap_queue
            effects["enqueued"] = req in queue.queue
            effects["sender_created"] = getattr(req, "disagg_kv_sender", None) is not None
        elif self.mode == "decode":
            queue = self.scheduler.disagg_decode_prealloc_queue
            effects["receiver_created"] = any(d.req is req for d in queue.queue)
            effects["pending"] = any(d.req is req for d in queue.pending_reqs)
            effects["retracted_queue"] = req in queue.retracted_queue
        else:
            effects["waiting"] = req in self.scheduler.waiting_queue
        return effects
