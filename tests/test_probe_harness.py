"""The harness never lets a default it chose decide a verdict.

Real SGLang objects are built without their constructors; every attribute the
probe did not give must come from the build's own constructor code, be
declared absent, or fail loudly. The classes here are written the way SGLang
writes its PD classes (an environment-flag switch read in ``__init__``, state
containers, mode branches, a ``getattr`` default in a method), in a module
file of their own, so the harness reads real source as it does for SGLang.
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from difflab.paths import shipped_probes
from difflab.probe.kit import Kit, MissingFakeAttribute

PROBES = shipped_probes()  # the checkout's probes/ (under mutation, the mutated copy beside the copied package)

MODULE = '''
import os
import threading


class EnvBool:
    def __init__(self, default):
        self.default = default
        self.name = None

    def get(self):
        raw = os.environ.get(self.name)
        return self.default if raw is None else raw.lower() in ("1", "true")


class _Envs:
    def __init__(self):
        for name, value in type(self).__dict__.items():
            if isinstance(value, EnvBool):
                value.name = name

    FORK_FAILED_ROOM_GUARD = EnvBool({guard_default})
    FORK_DEFERRED = EnvBool(True)


envs = _Envs()


class BaseManager:
    enable_deferral: bool = False  # a class-level default, as BaseKVManager has
    lifecycle = None

    def __init__(self, args, mode):
        self.enable_deferral = envs.FORK_DEFERRED.get()
        if mode == "decode":
            self.lifecycle = threading.RLock()
        self.mode = mode
        self.request_status = {{}}
        if mode == "prefill":
            self.transfer_infos = {{}}
            if self.pp_size > 1:
                self.request_status = Consensus(self.pp_size)
        else:
            self.connection_pool = {{}}
        self.engine = TransferEngine(args.host)
        self.shared_engine = get_shared_transfer_engine()


_SHARED_ENGINE = None


def get_shared_transfer_engine():
    """The process-wide engine, None until a launcher made one (SGLang 0.5.23's Mooncake accessor)."""
    return _SHARED_ENGINE


class Consensus(dict):
    def __init__(self, size):
        super().__init__()


class TransferEngine:
    def __init__(self, host):
        raise RuntimeError("would open an RDMA device")


class ForkManager(BaseManager):
    """A fork's hand-port: its own state, its own switch."""

    def __init__(self, args, mode, server_args=None):
        super().__init__(args, mode)
        self.failed_room_guard = envs.FORK_FAILED_ROOM_GUARD.get()
        self._rooms_never_acked = set()
        self._lock = threading.Lock()
        timeout = 30.0
        self.release_timeout = timeout * 2
        self.deferred = envs.FORK_DEFERRED.get() and self.supports_deferral
        self._init_extra()

    supports_deferral = True

    def _init_extra(self):
        self.extra_flag = False

    def conclude_failure(self, room):
        if getattr(self, "failed_room_guard", False):
            self._rooms_never_acked.add(room)
        self._lazy_cache = room

    def acks(self, room):
        if not hasattr(self, "_lazy_cache"):
            return 0
        return 0 if room in self._rooms_never_acked else 1

    def opened(self):
        return getattr(self, "peer_table", None)
'''


def _load(tmp_path: Path, name: str, guard_default: bool) -> ModuleType:
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(MODULE.format(guard_default=guard_default)))
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def harness() -> Iterator[ModuleType]:
    sys.path.insert(0, str(PROBES))
    try:
        import harness.strict as strict

        yield strict
    finally:
        sys.path.remove(str(PROBES))


@pytest.mark.parametrize("shipped_on", [True, False])
def test_a_forks_own_flag_and_state_come_from_its_constructor(
    tmp_path: Path, harness: ModuleType, shipped_on: bool
) -> None:
    """The fork's switch decides, in both directions, and its own state container is used."""
    module = _load(tmp_path, f"fork_flag_{shipped_on}", shipped_on)
    kit = Kit()
    mgr = harness.real_object(kit, module.ForkManager, "mgr", mode="prefill", pp_size=1)
    mgr.conclude_failure(7)
    assert mgr.acks(7) == (0 if shipped_on else 1)
    taken = {d["attribute"]: d for d in kit.defaults}
    assert taken["mgr.failed_room_guard"]["value"] == repr(shipped_on)
    assert "envs.FORK_FAILED_ROOM_GUARD.get()" in taken["mgr.failed_room_guard"]["from"]
    if shipped_on:
        assert taken["mgr._rooms_never_acked"]["value"] == "set()"
    assert kit.problems() == []


def test_an_environment_override_is_the_builds_default_too(
    tmp_path: Path, harness: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FORK_FAILED_ROOM_GUARD", "1")
    module = _load(tmp_path, "fork_env", False)
    kit = Kit()
    mgr = harness.real_object(kit, module.ForkManager, "mgr", mode="prefill", pp_size=1)
    assert mgr.failed_room_guard is True


def test_branches_locals_and_called_init_helpers_are_followed(tmp_path: Path, harness: ModuleType) -> None:
    module = _load(tmp_path, "fork_branches", False)
    kit = Kit()
    prefill = harness.real_object(kit, module.ForkManager, "prefill", mode="prefill", pp_size=1)
    assert prefill.request_status == {}  # the pp_size > 1 branch does not run here
    assert type(prefill.request_status) is dict
    assert prefill.transfer_infos == {}
    assert prefill.release_timeout == 60.0  # from the local ``timeout`` before it
    assert prefill.extra_flag is False  # set by _init_extra(), which __init__ calls
    assert prefill.deferred is True  # env default and a class attribute
    big = harness.real_object(kit, module.ForkManager, "big", mode="prefill", pp_size=4)
    assert isinstance(big.request_status, module.Consensus)
    decode = harness.real_object(kit, module.ForkManager, "decode", mode="decode")
    assert decode.connection_pool == {}
    with pytest.raises(MissingFakeAttribute, match="no branch of the constructor"):
        decode.transfer_infos  # noqa: B018 - only the prefill branch sets it
    assert kit.problems() == ["missing fake attribute: decode.transfer_infos"]


def test_a_collaborator_the_constructor_builds_is_never_built(tmp_path: Path, harness: ModuleType) -> None:
    module = _load(tmp_path, "fork_engine", False)
    kit = Kit()
    mgr = harness.real_object(kit, module.ForkManager, "mgr", mode="prefill", pp_size=1)
    with pytest.raises(MissingFakeAttribute, match=r"mgr\.engine.*TransferEngine\(\)"):
        mgr.engine  # noqa: B018
    assert "missing fake attribute: mgr.engine" in kit.problems()


def test_an_accessor_for_the_transport_engine_is_never_evaluated(tmp_path: Path, harness: ModuleType) -> None:
    """A getter for a process-wide engine would answer None here, silently: the probe must give the engine."""
    module = _load(tmp_path, "fork_shared_engine", False)
    kit = Kit()
    mgr = harness.real_object(kit, module.ForkManager, "mgr", mode="prefill", pp_size=1)
    with pytest.raises(MissingFakeAttribute, match=r"mgr\.shared_engine.*get_shared_transfer_engine"):
        mgr.shared_engine  # noqa: B018
    given = harness.real_object(kit, module.ForkManager, "given", mode="prefill", pp_size=1, shared_engine="fake")
    assert given.shared_engine == "fake"


def test_lazily_created_state_reads_as_missing_like_on_the_real_object(tmp_path: Path, harness: ModuleType) -> None:
    module = _load(tmp_path, "fork_lazy", False)
    kit = Kit()
    mgr = harness.real_object(kit, module.ForkManager, "mgr", mode="prefill", pp_size=1)
    assert mgr.acks(3) == 0  # hasattr(self, "_lazy_cache") is False before conclude_failure runs
    assert kit.fallbacks == [{"attribute": "mgr._lazy_cache", "why": "created lazily by ForkManager.conclude_failure"}]
    assert kit.problems() == []


def test_a_getattr_default_on_an_attribute_nobody_sets_is_an_error_unless_declared(
    tmp_path: Path, harness: ModuleType
) -> None:
    module = _load(tmp_path, "fork_absent", False)
    strict_kit = Kit()
    mgr = harness.real_object(strict_kit, module.ForkManager, "mgr", mode="prefill", pp_size=1)
    with pytest.raises(MissingFakeAttribute, match="mgr.peer_table"):
        mgr.opened()
    assert strict_kit.problems() == ["missing fake attribute: mgr.peer_table"]
    declared = Kit()
    mgr = harness.real_object(declared, module.ForkManager, "mgr", mode="prefill", pp_size=1, absent=["peer_table"])
    assert mgr.opened() is None
    assert declared.fallbacks == [{"attribute": "mgr.peer_table", "why": "declared absent by the probe"}]
    assert declared.problems() == []


@pytest.mark.parametrize("shipped_on", [True, False])
def test_a_forced_switch_is_reported_with_the_builds_default(
    tmp_path: Path, harness: ModuleType, shipped_on: bool
) -> None:
    module = _load(tmp_path, f"fork_forced_{shipped_on}", shipped_on)
    kit = Kit()
    mgr = harness.real_object(
        kit, module.ForkManager, "mgr", mode="prefill", pp_size=1, forced={"failed_room_guard": True}
    )
    assert mgr.failed_room_guard is True
    (entry,) = kit.forced
    assert entry["attribute"] == "mgr.failed_room_guard" and entry["value"] is True
    assert entry["build_default"] is shipped_on
    assert entry["env"] == []  # only SGLANG_* environment names are listed; this module uses its own
    renamed = Kit()
    harness.real_object(renamed, module.ForkManager, "mgr", mode="prefill", pp_size=1, forced={"old_switch": True})
    assert renamed.forced[0]["build_default"] is None
    assert "does not set it" in renamed.forced[0]["from"]


def test_callables_given_to_fakes_and_real_objects_are_guarded(tmp_path: Path, harness: ModuleType) -> None:
    module = _load(tmp_path, "fork_guard", False)
    kit = Kit()
    socket = kit.fake("socket", send=lambda frames: frames.decode())  # fails on a list: a stale fake
    mgr = harness.real_object(kit, module.ForkManager, "mgr", mode="prefill", pp_size=1, notify=lambda: 1 / 0)
    for call in (lambda: socket.send([b"ABORT"]), mgr.notify):
        with contextlib.suppress(Exception):  # what SGLang's ``except Exception: logger.debug(...)`` does
            call()
    assert [p.split(":")[1].strip() for p in kit.problems()] == ["socket.send", "mgr.notify"]


def test_a_pd_debug_record_carrying_an_exception_is_a_problem() -> None:
    import logging

    kit = Kit()
    with kit.capture_logs():
        try:
            raise ConnectionError("peer gone")
        except ConnectionError:
            logging.getLogger("sglang.srt.disaggregation.common.conn").debug("send failed", exc_info=True)
        logging.getLogger("sglang.srt.disaggregation.common.conn").debug("plain debug message")
        logging.getLogger("sglang.srt.managers.scheduler").debug("elsewhere", exc_info=(ValueError, ValueError(), None))
    problems = kit.problems()
    assert len(problems) == 1 and "send failed" in problems[0] and "ConnectionError: peer gone" in problems[0]


def test_a_quarantine_sink_is_callable_but_never_a_flag(harness: ModuleType) -> None:
    import harness.radix as radix

    kit = Kit()
    uses: list[str] = []
    sink = radix.Sink(kit, "quarantine_room", uses)
    sink(7)
    assert uses == ["quarantine_room"]
    with pytest.raises(MissingFakeAttribute):
        bool(sink.enabled)
    assert kit.problems() == ["missing fake attribute: tree_cache.quarantine_room.enabled (read as a value)"]


def test_a_class_level_default_never_hides_the_constructors_value(tmp_path: Path, harness: ModuleType) -> None:
    """``enable_x: bool = False`` on a base class would be read by normal lookup; the constructor decides."""
    module = _load(tmp_path, "fork_class_attr", False)
    kit = Kit()
    prefill = harness.real_object(kit, module.ForkManager, "prefill", mode="prefill", pp_size=1)
    assert module.ForkManager.enable_deferral is False
    assert prefill.enable_deferral is True  # what __init__ computes from the environment default
    assert prefill.lifecycle is None  # only the decode branch assigns it: the class value stands
    decode = harness.real_object(kit, module.ForkManager, "decode", mode="decode")
    assert decode.lifecycle is not None
    given = harness.real_object(kit, module.ForkManager, "given", mode="prefill", enable_deferral=False)
    assert given.enable_deferral is False
    assert {d["attribute"] for d in kit.defaults} >= {"prefill.enable_deferral", "prefill.lifecycle"}


def test_an_outcome_deciding_value_given_as_a_literal_is_a_probe_error(tmp_path: Path, harness: ModuleType) -> None:
    module = _load(tmp_path, "fork_literal", False)
    for given in ({"deferred_kv_release_timeout": 0.1}, {"enable_deferred_kv_release": True}):
        kit = Kit()
        with pytest.raises(harness.LiteralBuildValue, match="forced="):
            harness.real_object(kit, module.ForkManager, "mgr", mode="prefill", pp_size=1, **given)
        assert kit.missing_attributes  # the observation is an error, whatever SGLang does with the exception
    kit = Kit()  # forced: set, and reported with the build's own value
    harness.real_object(
        kit, module.ForkManager, "mgr", mode="prefill", pp_size=1, forced={"deferred_kv_release_timeout": 0.1}
    )
    assert [e["attribute"] for e in kit.forced] == ["mgr.deferred_kv_release_timeout"]


def _literal_build_values(path: Path, names: frozenset[str]) -> list[str]:
    """``name=<literal>`` keyword arguments in a probe file's calls (forced={...} is a dict, not a keyword)."""
    import ast

    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            for kw in node.keywords:
                if kw.arg in names:
                    found.append(f"{path.name}:{node.lineno}: {kw.arg}=")
    return found


def test_no_probe_passes_an_outcome_deciding_value_as_a_keyword(harness: ModuleType) -> None:
    files = [*PROBES.glob("pr*.py"), *(PROBES / "harness").glob("*.py"), *(PROBES / "throughput").glob("*.py")]
    assert files
    found = [hit for f in files for hit in _literal_build_values(f, harness.BUILD_VALUES)]
    assert not found, found


def _swapper_and_owner() -> tuple[Any, ModuleType]:
    """The harness's import-site swap, and a module owning a ``release`` function that returns "real"."""
    sys.path.insert(0, str(PROBES))
    try:
        from harness.runtime import swapped_at_import_sites
    finally:
        sys.path.remove(str(PROBES))
    owner = ModuleType("sglang_fake_owner")
    owner.release = lambda: "real"  # type: ignore[attr-defined]
    return swapped_at_import_sites, owner


def test_a_patched_function_is_swapped_wherever_the_build_imported_it(tmp_path: Path) -> None:
    swapped_at_import_sites, owner = _swapper_and_owner()
    moved = ModuleType("sglang.fake_moved_helper")  # a helper module that imported it itself, under an alias
    moved.free_pages = owner.release  # type: ignore[attr-defined]
    sys.modules[moved.__name__] = moved
    try:
        with swapped_at_import_sites(owner, "release", lambda: "stand-in") as sites:
            assert moved.free_pages() == "stand-in" and owner.release() == "stand-in"
            assert "sglang.fake_moved_helper.free_pages" in sites
            late = ModuleType("sglang.fake_late")  # imported while the swap was on
            late.release = owner.release  # type: ignore[attr-defined]
            sys.modules[late.__name__] = late
        assert moved.free_pages() == "real" and owner.release() == "real" and late.release() == "real"
    finally:
        sys.modules.pop(moved.__name__, None)
        sys.modules.pop("sglang.fake_late", None)


def test_a_module_imported_again_under_a_name_already_seen_is_searched_anew() -> None:
    """A build module removed from ``sys.modules`` and imported again is a new object with new globals:
    its import of the function is a site like any other, though its name was indexed before."""
    swapped_at_import_sites, owner = _swapper_and_owner()
    name = "sglang.fake_imported_twice"
    try:
        sys.modules[name] = ModuleType(name)  # indexed once, without the import
        with swapped_at_import_sites(owner, "release", lambda: "stand-in") as sites:
            assert sites == ["sglang_fake_owner.release"]
        again = ModuleType(name)  # the same name, now importing the function
        again.release = owner.release  # type: ignore[attr-defined]
        sys.modules.pop(name)
        sys.modules[name] = again  # the newest name again, and the same number of modules
        with swapped_at_import_sites(owner, "release", lambda: "stand-in") as sites:
            assert again.release() == "stand-in" and f"{name}.release" in sites
        assert again.release() == "real"
    finally:
        sys.modules.pop(name, None)


def test_the_prefill_results_release_is_swapped_where_defined_and_everywhere_bound() -> None:
    """#36988's KV release: a helper module of the build that imported it itself calls the stand-in too;
    a build that rebound the name in the prefill module alone gets that binding swapped."""
    sys.path.insert(0, str(PROBES))
    try:
        from harness.prefill_results import _swap_everywhere
    finally:
        sys.path.remove(str(PROBES))
    common = ModuleType("sglang.fake_common")
    exec("def release_kv_cache(req):\n    return 'real'\n", common.__dict__)  # noqa: S102 - a module's own function
    prefill = ModuleType("sglang.fake_prefill")
    prefill.release_kv_cache = common.release_kv_cache  # type: ignore[attr-defined]
    helper = ModuleType("sglang.fake_prefill_release")  # the moved helper's own import
    helper.release_kv_cache = common.release_kv_cache  # type: ignore[attr-defined]
    for module in (common, prefill, helper):
        sys.modules[module.__name__] = module
    try:
        with contextlib.ExitStack() as stack:
            _swap_everywhere(stack, prefill, "release_kv_cache", lambda req: "stand-in")
            assert [m.release_kv_cache(None) for m in (common, prefill, helper)] == ["stand-in"] * 3
        assert [m.release_kv_cache(None) for m in (common, prefill, helper)] == ["real"] * 3
        prefill.release_kv_cache = lambda req: "wrapped"  # type: ignore[attr-defined]  # rebound here alone
        with contextlib.ExitStack() as stack:
            _swap_everywhere(stack, prefill, "release_kv_cache", lambda req: "stand-in")
            assert (prefill.release_kv_cache(None), helper.release_kv_cache(None)) == ("stand-in", "real")
        assert prefill.release_kv_cache(None) == "wrapped"
    finally:
        for module in (common, prefill, helper):
            sys.modules.pop(module.__name__, None)


def test_an_import_site_is_found_in_a_module_loaded_since_and_a_rebound_name_is_not(tmp_path: Path) -> None:
    """The index of the build's globals scans each module once: one loaded after the first lookup (even
    as another went, leaving the count of modules unchanged) is still found; a global the build rebound
    after it was indexed is not taken for an import site."""
    sys.path.insert(0, str(PROBES))
    try:
        from harness.runtime import swapped_at_import_sites
    finally:
        sys.path.remove(str(PROBES))
    owner = ModuleType("sglang.fake_index_owner")
    exec("def release(req=None):\n    return 'real'\n", owner.__dict__)  # noqa: S102 - a module's own function
    first, later = ModuleType("sglang.fake_index_first"), ModuleType("sglang.fake_index_later")
    first.release = owner.release  # type: ignore[attr-defined]
    later.free = owner.release  # type: ignore[attr-defined]
    sys.modules[owner.__name__], sys.modules[first.__name__] = owner, first
    try:
        with swapped_at_import_sites(owner, "release", lambda req=None: "stand-in") as sites:
            assert sites == ["sglang.fake_index_owner.release", "sglang.fake_index_first.release"]
        first.release = lambda req=None: "the build's own wrapper"  # type: ignore[attr-defined]
        del sys.modules[first.__name__]
        sys.modules[later.__name__] = later  # same number of modules as before
        with swapped_at_import_sites(owner, "release", lambda req=None: "stand-in") as sites:
            assert later.free() == "stand-in" and first.release() == "the build's own wrapper"
            assert sites == ["sglang.fake_index_owner.release", "sglang.fake_index_later.free"]
        assert later.free() == "real"
    finally:
        for name in (owner.__name__, first.__name__, later.__name__):
            sys.modules.pop(name, None)


def test_a_swap_inside_a_swap_replaces_the_outer_stand_in_wherever_it_was_placed() -> None:
    """Both sides of the CPU pair swap the socket factory: the inner swap's original is the outer one's
    stand-in (a bound method, which the index of functions never holds). The inner stand-in reaches every
    site the outer one was placed at and a module imported in between that bound it; on the way out each
    site gets back what it had, so the build's own function is back everywhere."""
    sys.path.insert(0, str(PROBES))
    try:
        from harness.runtime import swapped_at_import_sites
    finally:
        sys.path.remove(str(PROBES))

    class Edge:
        def __init__(self, name: str) -> None:
            self.name = name

        def bind(self) -> str:
            return self.name

    owner = ModuleType("sglang.fake_nested_owner")
    exec("def bind():\n    return 'real'\n", owner.__dict__)  # noqa: S102 - a module's own function
    user = ModuleType("sglang.fake_nested_user")
    user.bind = owner.bind  # type: ignore[attr-defined]
    between = ModuleType("sglang.fake_nested_between")
    sys.modules[owner.__name__], sys.modules[user.__name__] = owner, user
    decode, prefill = Edge("decode"), Edge("prefill")
    try:
        with swapped_at_import_sites(owner, "bind", decode.bind):
            between.bind = owner.bind  # type: ignore[attr-defined]  # imported while the outer swap is on
            sys.modules[between.__name__] = between
            with swapped_at_import_sites(owner, "bind", prefill.bind) as sites:
                assert [m.bind() for m in (owner, user, between)] == ["prefill"] * 3
                assert set(sites) == {f"{m.__name__}.bind" for m in (owner, user, between)}
            assert [m.bind() for m in (owner, user, between)] == ["decode"] * 3
        assert [m.bind() for m in (owner, user, between)] == ["real"] * 3
    finally:
        for name in (owner.__name__, user.__name__, between.__name__):
            sys.modules.pop(name, None)


def test_the_lab_clock_moves_every_reader_and_gives_the_clocks_back() -> None:
    """A release timeout passes on the lab's clock: ``time.monotonic`` and a name an SGLang module bound
    to it (``from time import monotonic``) both move by what the probe advanced, the advance is recorded,
    and the real clocks are back afterwards."""
    import time

    sys.path.insert(0, str(PROBES))
    try:
        from harness.clock import LabClock
    finally:
        sys.path.remove(str(PROBES))
    bound = ModuleType("sglang.fake_deadline_reader")
    bound.monotonic = time.monotonic  # type: ignore[attr-defined]
    sys.modules[bound.__name__] = bound
    real = time.monotonic
    kit = Kit()
    clock = LabClock(kit)
    try:
        with clock.running():
            before, counter, wall_ns = bound.monotonic(), time.perf_counter(), time.time_ns()
            clock.advance(300.0, "nobody acks")
            assert bound.monotonic() - before >= 300.0 and time.monotonic() - before >= 300.0
            assert time.perf_counter() - counter >= 300.0 and time.time_ns() - wall_ns >= 300 * 10**9
            with pytest.raises(ValueError, match="only moves forward"):
                clock.advance(-1.0, "back in time")
        assert time.monotonic is real and bound.monotonic is real
        assert real() - before < 300.0
        assert [e for e in kit.events if e["event"] == "clock_advanced"] == [
            {"event": "clock_advanced", "seconds": 300.0, "why": "nobody acks"}
        ]
    finally:
        sys.modules.pop(bound.__name__, None)
