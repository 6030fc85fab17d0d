"""The transfer edge of a side the build's start-up builds: what a real back end reaches for that a CPU lacks.

A side started with ``backend="mooncake"`` (or ``nixl``, ``mori``) runs the build's own
``init_disaggregation``: its prealloc queue constructs the back end's real KV manager, and
each admitted request gets the back end's real receiver. Their constructors and methods
are the build's; only these edges are replaced (:meth:`Transport.contexts`, entered
around the start-up and held for the rest of the side's life):

- the transfer engine: Mooncake's shared ``TransferEngine`` (``get_mooncake_transfer_engine``),
  NIXL's agent (the ``nixl`` package), Mori's IO engine (the ``mori`` package). Decode asks
  them to register its buffers and for its own name; a call a fake does not answer is a
  probe error naming it;
- the KV manager's bound control socket (``get_zmq_socket_on_host``, swapped in every module
  of the build that imported it): it receives nothing unless a scenario hands it messages;
- the receivers' PUSH sockets to the prefill ranks (the receiver class's ``_ctx``, socket
  cache and locks): :class:`harness.wire.Wire` keeps every frame;
- the bootstrap server's HTTP API (``requests`` as the back end modules see it):
  :class:`Bootstrap` answers ``/route`` with a prefill server of ``prefill_ranks`` TP ranks;
- the threads the managers start (receive loop, heartbeat, transfer workers): recorded, not
  started (:class:`Threads`), so a scenario runs their bodies in its own order.

Values the lab chooses here, and reports (:meth:`Transport.chosen`): the prefill topology
the bootstrap server announces (TP ranks and their addresses; no page size or KV dtype,
so the build's sanity checks have nothing to compare).
"""

from __future__ import annotations

import contextlib
import sys
import threading
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlparse

from difflab.probe.kit import Kit, StrictFake
from harness.wire import Wire, tcp_endpoint

DECODE_SESSION = "decode-session-0"
PREFILL_IP = "192.0.2.10"
PREFILL_BASE_PORT = 17100
CONTROL_PORT = 17020

CONN_MODULES = ("common.conn", "mooncake.conn", "nixl.conn", "mori.conn")
"""The back-end modules whose threads, HTTP client and engines are the transport (``sglang.srt.disaggregation.*``)."""


def prefill_endpoint(rank: int) -> str:
    return tcp_endpoint(PREFILL_IP, PREFILL_BASE_PORT + rank)


class EndOfMessages(BaseException):  # noqa: N818 - a signal, not an error
    """Ends a receive loop the scenario runs in its own thread once its messages are handled."""

    ends_scenario = True


@dataclass
class RecordedThread:
    """A thread a manager asked for: its target runs only when a scenario runs it."""

    target: Callable[..., Any] | None
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    name: str | None = None
    daemon: bool | None = None
    started: bool = False

    def start(self) -> None:
        self.started = True

    def join(self, timeout: float | None = None) -> None:
        return None

    def is_alive(self) -> bool:
        return False

    def run(self) -> None:
        if self.target is not None:
            self.target(*self.args, **self.kwargs)

    @property
    def label(self) -> str:
        return getattr(self.target, "__qualname__", repr(self.target))


class Threads:
    """``threading`` as the back-end modules see it: locks and events are real, a ``Thread`` is recorded."""

    def __init__(self) -> None:
        self.recorded: list[RecordedThread] = []

    def module(self) -> types.ModuleType:
        proxy = types.ModuleType("threading")
        proxy.__dict__.update({k: v for k, v in vars(threading).items() if not k.startswith("__")})

        def thread(
            group: Any = None,
            target: Callable[..., Any] | None = None,
            name: str | None = None,
            args: tuple[Any, ...] = (),
            kwargs: dict[str, Any] | None = None,
            *,
            daemon: bool | None = None,
        ) -> RecordedThread:
            made = RecordedThread(target, tuple(args), dict(kwargs or {}), name, daemon)
            self.recorded.append(made)
            return made

        proxy.Thread = thread  # type: ignore[attr-defined]
        return proxy

    def named(self, fragment: str) -> list[RecordedThread]:
        return [t for t in self.recorded if fragment in t.label]


class ControlSocket:
    """A KV manager's bound PULL socket: hands over the messages a scenario queued, then ends the loop."""

    def __init__(self) -> None:
        self.pending: list[list[bytes]] = []

    def recv_multipart(self, *args: Any, **kwargs: Any) -> list[bytes]:
        if self.pending:
            return self.pending.pop(0)
        raise EndOfMessages()

    def setsockopt(self, *args: Any, **kwargs: Any) -> None:
        return None

    def close(self, *args: Any, **kwargs: Any) -> None:
        return None


@dataclass
class _Response:
    status_code: int
    payload: Any

    @property
    def text(self) -> str:
        return repr(self.payload)

    def json(self) -> Any:
        return self.payload


class Bootstrap:
    """The prefill side's bootstrap server, as decode's HTTP client reaches it.

    ``/route`` with every rank -1 answers the prefill server's parallel info (the fields
    the build's ``PrefillServerInfo`` takes); with a TP rank it answers that rank's
    address; ``/query_dp_ranks`` places every room on data-parallel rank 0. A URL it
    does not know is a probe error, not a guessed answer.
    """

    def __init__(self, kit: Kit, prefill_ranks: int) -> None:
        self.kit = kit
        self.prefill_ranks = prefill_ranks
        self.requests: list[str] = []

    def server_info(self) -> dict[str, Any]:
        import dataclasses

        from sglang.srt.disaggregation.common.conn import PrefillServerInfo

        offered = {
            "attn_tp_size": self.prefill_ranks,
            "attn_cp_size": 1,
            "dp_size": 1,
            "pp_size": 1,
            # unset: the build's page-size and KV-dtype checks have nothing to compare
            "page_size": None,
            "kv_cache_dtype": None,
            "follow_bootstrap_room": True,
        }
        accepted = {f.name for f in dataclasses.fields(PrefillServerInfo)}
        return {k: v for k, v in offered.items() if k in accepted}

    def answer(self, method: str, url: str, payload: Any = None) -> _Response:
        parsed = urlparse(url)
        self.requests.append(f"{method} {parsed.path}")
        query = {k: v[0] for k, v in parse_qs(parsed.query).items()}
        if parsed.path == "/route" and method == "GET":
            rank = int(query.get("target_tp_rank", "-1"))
            if rank == -1:
                return _Response(200, self.server_info())
            if 0 <= rank < self.prefill_ranks:
                return _Response(200, {"rank_ip": PREFILL_IP, "rank_port": PREFILL_BASE_PORT + rank})
            return _Response(404, f"no prefill TP rank {rank}")
        if parsed.path == "/query_dp_ranks":
            return _Response(200, {str(room): 0 for room in (payload or {}).get("bootstrap_rooms", [])})
        if parsed.path == "/route" and method == "PUT":  # a prefill rank registers itself
            return _Response(200, "registered")
        if parsed.path == "/health":
            return _Response(200, "ok")
        raise self.kit.intended_failure("the bootstrap server does not know this URL", ConnectionError)(
            f"{method} {url}"
        )

    def module(self) -> types.ModuleType:
        """A ``requests`` module whose calls reach this server (sessions and adapters included)."""
        import requests as real

        fake = types.ModuleType("requests")
        fake.__dict__.update({k: v for k, v in vars(real).items() if not k.startswith("__")})
        server = self

        class Session:
            def mount(self, *args: Any, **kwargs: Any) -> None:
                return None

            def get(self, url: str, **kwargs: Any) -> _Response:
                return server.answer("GET", url)

            def post(self, url: str, json: Any = None, **kwargs: Any) -> _Response:
                return server.answer("POST", url, json)

            def put(self, url: str, json: Any = None, **kwargs: Any) -> _Response:
                return server.answer("PUT", url, json)

            def close(self) -> None:
                return None

        fake.Session = Session  # type: ignore[attr-defined]
        fake.get = lambda url, **kw: server.answer("GET", url)  # type: ignore[attr-defined]
        fake.post = lambda url, json=None, **kw: server.answer("POST", url, json)  # type: ignore[attr-defined]
        fake.put = lambda url, json=None, **kw: server.answer("PUT", url, json)  # type: ignore[attr-defined]
        return fake


class PushContext:
    """The receivers' ``zmq.Context``: every PUSH socket it opens is the wire's socket to the endpoint it connects."""

    def __init__(self, kit: Kit, wire: Wire) -> None:
        self.kit, self.wire = kit, wire

    def socket(self, *args: Any, **kwargs: Any) -> Any:
        context = self

        class Push:
            endpoint: str | None = None

            def setsockopt(self, *a: Any, **k: Any) -> None:
                return None

            def connect(self, endpoint: str) -> None:
                self.endpoint = endpoint

            def send_multipart(self, frames: list[bytes], *a: Any, **k: Any) -> None:
                if self.endpoint is None:
                    raise RuntimeError("a PUSH socket sent before it connected")
                context.wire.socket(self.endpoint).send_multipart(frames, *a, **k)

            def close(self, *a: Any, **k: Any) -> None:
                return None

        return Push()

    def set(self, *args: Any, **kwargs: Any) -> None:
        return None


# --- back-end adaptations (one place): the engine each back end's manager holds ---------------
def _mooncake_engine(kit: Kit) -> StrictFake:
    return kit.fake(
        "mooncake TransferEngine",
        get_session_id=lambda: DECODE_SESSION,
        batch_register=kit.recorder("engine.batch_register", returns=0),
        batch_deregister=kit.recorder("engine.batch_deregister", returns=0),
        register=kit.recorder("engine.register", returns=0),
        deregister=kit.recorder("engine.deregister", returns=0),
    )


def _nixl_package(kit: Kit) -> dict[str, types.ModuleType]:
    """``nixl._api`` with an agent that registers memory and names itself; it moves nothing."""

    def agent(name: str, config: Any = None) -> StrictFake:
        made = kit.fake(
            "nixl agent",
            create_backend=kit.recorder("nixl.create_backend"),
            get_plugin_list=lambda: ["UCX", "OBJ", "GDS_MT", "UCCL", "LIBFABRIC", "MOONCAKE"],
            get_reg_descs=lambda *a, **k: ("reg_descs", a),
            get_xfer_descs=lambda *a, **k: ("xfer_descs", a),
            register_memory=kit.recorder("nixl.register_memory", returns=("registered descriptors",)),
            deregister_memory=kit.recorder("nixl.deregister_memory"),
            get_agent_metadata=lambda: b"decode-agent-metadata",
            get_new_notifs=lambda: {},
            prep_xfer_dlist=kit.recorder("nixl.prep_xfer_dlist", returns=0),
        )
        made.name = name  # a fake's own label is its first argument
        return made

    api = types.ModuleType("nixl._api")
    api.nixl_agent = agent  # type: ignore[attr-defined]
    api.nixl_agent_config = lambda *a, **k: ("nixl_agent_config", k)  # type: ignore[attr-defined]
    api.nixl_thread_sync_t = types.SimpleNamespace(NIXL_THREAD_SYNC_STRICT="strict")  # type: ignore[attr-defined]
    package = types.ModuleType("nixl")
    package._api = api  # type: ignore[attr-defined]
    package.__path__ = []  # type: ignore[attr-defined]
    return {"nixl": package, "nixl._api": api}


def _mori_engine(kit: Kit) -> Callable[..., StrictFake]:
    """Mori's ``IOEngine``: it binds a port, registers memory and describes itself; it moves nothing.

    The rest of the ``mori`` package (enums, configs) is the import stub the back end's
    module was loaded with (:data:`harness.decode_kv.TRANSPORT_PACKAGES`).
    """
    desc = kit.fake("mori engine descriptor", port=CONTROL_PORT + 10, key=DECODE_SESSION)
    desc.pack = lambda: b"decode-engine-descriptor"

    def memory(*args: Any, **kwargs: Any) -> StrictFake:
        return kit.fake("mori memory descriptor", pack=lambda: b"memory-descriptor")

    def engine(key: str, config: Any = None) -> StrictFake:
        return kit.fake(
            "mori IOEngine",
            create_backend=kit.recorder("mori.create_backend"),
            get_engine_desc=lambda: desc,
            register_memory=kit.recorder("mori.register_memory", side_effect=memory),
            deregister_memory=kit.recorder("mori.deregister_memory"),
        )

    return engine


@dataclass
class Transport:
    """Every transfer edge of one side on one back end (see the module docstring)."""

    kit: Kit
    backend: str
    prefill_ranks: int
    wire: Wire = field(init=False)
    threads: Threads = field(default_factory=Threads)
    control: ControlSocket = field(default_factory=ControlSocket)
    bootstrap: Bootstrap = field(init=False)

    def __post_init__(self) -> None:
        self.wire = Wire(self.kit)
        self.bootstrap = Bootstrap(self.kit, self.prefill_ranks)

    def chosen(self) -> dict[str, Any]:
        """The values the lab picks for the peer it fakes, reported beside the verdict."""
        return {"prefill_tp_ranks": self.prefill_ranks, "prefill_rank_ports": PREFILL_BASE_PORT}

    def _bind(self, context: Any, socket_type: Any, host: str | None = None, **kwargs: Any) -> tuple[int, Any]:
        return CONTROL_PORT, self.control

    @contextlib.contextmanager
    def contexts(self) -> Iterator[None]:
        from sglang.srt.utils import network

        from harness.runtime import swapped, swapped_at_import_sites

        with contextlib.ExitStack() as stack:
            stack.enter_context(swapped_at_import_sites(network, "get_zmq_socket_on_host", self._bind))
            threads, http = self.threads.module(), self.bootstrap.module()
            for module in self._conn_modules():
                stack.enter_context(swapped(module, "threading", threads))
                if hasattr(module, "requests"):
                    stack.enter_context(swapped(module, "requests", http))
            stack.enter_context(self._engine())
            yield

    def _conn_modules(self) -> list[types.ModuleType]:
        import importlib

        modules = []
        for name in CONN_MODULES:
            if self.backend not in name and not name.startswith("common"):
                continue
            modules.append(importlib.import_module(f"sglang.srt.disaggregation.{name}"))
        return modules

    @contextlib.contextmanager
    def _engine(self) -> Iterator[None]:
        from harness.runtime import swapped

        if self.backend == "mooncake":
            from sglang.srt.disaggregation.mooncake import conn

            engine = _mooncake_engine(self.kit)
            with swapped(conn, "get_mooncake_transfer_engine", lambda: engine):
                yield
            return
        if self.backend == "nixl":
            saved = {k: sys.modules.get(k) for k in ("nixl", "nixl._api")}
            sys.modules.update(_nixl_package(self.kit))
            try:
                yield
            finally:
                for key, module in saved.items():
                    if module is None:
                        sys.modules.pop(key, None)
                    else:
                        sys.modules[key] = module
            return
        if self.backend == "mori":
            from sglang.srt.disaggregation.mori import conn as mori_conn

            with swapped(mori_conn, "IOEngine", _mori_engine(self.kit)):
                yield
            return
        yield

    @contextlib.contextmanager
    def receiver_sockets(self) -> Iterator[None]:
        """The receivers' shared PUSH sockets (class state): the wire's, fresh for this side.

        Set on ``CommonKVReceiver`` and on every loaded subclass that keeps sockets of its own,
        so a receiver class the build resolves at call time (a fork's subclass) sends on the wire too.
        """
        from sglang.srt.disaggregation.common.conn import CommonKVReceiver

        context = PushContext(self.kit, self.wire)
        owners = [CommonKVReceiver, *(c for c in _subclasses(CommonKVReceiver) if "_ctx" in c.__dict__)]
        with contextlib.ExitStack() as stack:
            for owner in owners:
                stack.enter_context(
                    _class_swapped(
                        owner, _ctx=context, _socket_cache={}, _socket_locks={}, _global_lock=threading.Lock()
                    )
                )
            yield

    def deliver(self, *messages: list[bytes], loop: str = "decode") -> None:
        """Hand ``messages`` to the manager's receive loop (its recorded thread), run in this thread.

        ``loop`` names the thread by a fragment of its target's name: decode's receive loop by
        default, a prefill manager's bootstrap thread (``bootstrap_worker``) for a prefill side.
        """
        loops = [t for t in self.threads.recorded if t.started and loop in t.label.lower()]
        if not loops:
            raise RuntimeError(f"no {loop} receive loop was started: {[t.label for t in self.threads.recorded]}")
        self.control.pending.extend(messages)
        with contextlib.suppress(EndOfMessages):
            loops[0].run()


def _subclasses(cls: type) -> list[type]:
    found: list[type] = []
    for sub in cls.__subclasses__():
        found += [sub, *_subclasses(sub)]
    return found


@contextlib.contextmanager
def _class_swapped(cls: type, **values: Any) -> Iterator[None]:
    """Class attributes set on ``cls`` itself for a while; what ``cls`` inherited shows again afterwards."""
    own = {k: cls.__dict__[k] for k in values if k in cls.__dict__}
    for key, value in values.items():
        setattr(cls, key, value)
    try:
        yield
    finally:
        for key in values:
            if key in own:
                setattr(cls, key, own[key])
            else:
                delattr(cls, key)
