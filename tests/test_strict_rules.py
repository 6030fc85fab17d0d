"""How a harness-built real object answers each read the probe did not give, one rule per test.

The class below is written like a fork's KV manager (an env-gated switch with a class-level default, a
switch read from the published ``server_args``, lazily created state, a value computed from another
attribute); each test builds it the way the probes do (:func:`harness.strict.real_object`, no
constructor) and reads what the kit recorded: the build default and where it came from, the fallback,
the forced switch with the build's own default, or the probe error naming the attribute.
"""

from __future__ import annotations

import importlib.util
import sys
import textwrap
from collections.abc import Iterator
from itertools import count
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest

from difflab.paths import shipped_probes
from difflab.probe import sandbox
from difflab.probe.kit import Kit, MissingFakeAttribute

PROBES = shipped_probes()  # under mutation, the mutated copy beside the copied package

MODULE = """
import os


class EnvFlag:
    def __init__(self, default):
        self.default = default

    def get(self):
        return self.default


class envs:
    SGLANG_FORK_HOLD = EnvFlag(False)
    SGLANG_FORK_WAIT = EnvFlag(30)


class ForkManager:
    hold_pages = False
    unreadable_switch = False
    timed_switch = False

    def __init__(self, server_args, mode):
        self.mode = mode
        if envs.SGLANG_FORK_HOLD.get():
            self.hold_pages = True
        self.unreadable_switch = os.getcwd() == "/"
        self.timed_switch = envs.SGLANG_FORK_WAIT.get() > 10
        self.from_args = server_args.fork_policy
        self.is_decode = self.mode == "decode"
        self.doubled = self.base_value * 2
        self.quadrupled = self.doubled * 2
        self.peer_count = 2
        self.unreadable = os.getcwd()

    def reset(self):
        self.lazy_cache = {}

    def clear(self):
        self.lazy_cache = None
"""

_names = count()


@pytest.fixture
def strict() -> Iterator[ModuleType]:
    sys.path.insert(0, str(PROBES))
    try:
        import harness.strict as strict

        yield strict
    finally:
        sys.path.remove(str(PROBES))


@pytest.fixture
def fork(tmp_path: Path) -> Iterator[ModuleType]:
    """The fork module, under a fresh name: the harness keys what it learned by class."""
    name = f"strict_fork_{next(_names)}"
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(MODULE))
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    yield module
    del sys.modules[name]


def manager(strict: ModuleType, fork: ModuleType, kit: Kit, name: str = "mgr", **attrs: object) -> object:
    return strict.real_object(kit, fork.ForkManager, name, **({"mode": "prefill"} | attrs))


# --- reads the probe did not give ---------------------------------------------------------------------
def test_a_dunder_is_the_plain_attribute_error_python_expects(strict: ModuleType, fork: ModuleType) -> None:
    kit = Kit()
    mgr = manager(strict, fork, kit)
    with pytest.raises(AttributeError) as caught:
        mgr.__length_hint__  # noqa: B018 - copy and operator protocols probe for these
    assert caught.value.args == ("__length_hint__",) and not kit.missing_attributes
    with pytest.raises(MissingFakeAttribute, match=r"mgr.__private_table was read"):
        mgr.__private_table  # noqa: B018 - a name-mangled attribute is an attribute, not a protocol
    with pytest.raises(MissingFakeAttribute, match=r"mgr.table__ was read"):
        mgr.table__  # noqa: B018


def test_an_attribute_nobody_sets_is_a_probe_error_naming_it(strict: ModuleType, fork: ModuleType) -> None:
    kit = Kit()
    mgr = manager(strict, fork, kit)
    with pytest.raises(MissingFakeAttribute) as caught:
        mgr.peer_table  # noqa: B018
    assert str(caught.value) == (
        "real ForkManager object mgr.peer_table was read, but neither the probe nor the build's constructor gives it"
    )
    assert kit.missing_attributes == ["mgr.peer_table"]


def test_a_declared_absence_and_lazy_state_read_as_the_real_object_reads_them(
    strict: ModuleType, fork: ModuleType
) -> None:
    kit = Kit()
    mgr = manager(strict, fork, kit, absent=["peer_table"])
    with pytest.raises(AttributeError) as absent:
        mgr.peer_table  # noqa: B018
    with pytest.raises(AttributeError) as lazy:
        mgr.lazy_cache  # noqa: B018
    assert absent.value.args == ("peer_table",) and lazy.value.args == ("lazy_cache",)
    assert kit.fallbacks == [
        {"attribute": "mgr.peer_table", "why": "declared absent by the probe"},
        {"attribute": "mgr.lazy_cache", "why": "created lazily by ForkManager.reset, ForkManager.clear"},
    ]
    assert not kit.missing_attributes


def test_a_read_inside_a_constructor_expression_names_the_chain(strict: ModuleType, fork: ModuleType) -> None:
    kit = Kit()
    mgr = manager(strict, fork, kit)
    with pytest.raises(MissingFakeAttribute):
        mgr.quadrupled  # noqa: B018
    assert kit.missing_attributes == ["mgr.base_value (read while evaluating quadrupled -> doubled)"]
    given = manager(strict, fork, Kit(), "given", base_value=3)
    assert given.quadrupled == 12


def test_a_constructor_value_is_set_and_recorded_with_its_line(strict: ModuleType, fork: ModuleType) -> None:
    kit = Kit()
    mgr = manager(strict, fork, kit, mode="decode")
    assert mgr.is_decode is True and vars(mgr)["is_decode"] is True
    assert kit.defaults == [
        {
            "attribute": "mgr.is_decode",
            "value": "True",
            "from": "ForkManager.__init__: self.is_decode = self.mode == 'decode'",
        }
    ]
    with pytest.raises(MissingFakeAttribute) as caught:
        mgr.unreadable  # noqa: B018
    assert str(caught.value).startswith("real ForkManager object mgr.unreadable: the build's constructor sets it, but ")
    assert str(caught.value).endswith("; the probe must give it")


def test_the_published_server_args_reach_the_constructor(
    strict: ModuleType, fork: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    import harness.runtime as runtime

    kit = Kit()
    with pytest.raises(MissingFakeAttribute, match=r"parameter `server_args` of ForkManager.__init__ has no value"):
        manager(strict, fork, kit).from_args  # noqa: B018
    monkeypatch.setattr(runtime, "_SERVER_ARGS", [SimpleNamespace(fork_policy="prefill_complete")])
    assert manager(strict, fork, Kit(), "published").from_args == "prefill_complete"


# --- class-level defaults the constructor overrides -------------------------------------------------------
def test_a_class_default_stands_only_where_no_constructor_branch_sets_it(strict: ModuleType, fork: ModuleType) -> None:
    kit = Kit()
    mgr = manager(strict, fork, kit)
    assert type(mgr).hold_pages is False  # the class itself still says what the class says
    assert mgr.hold_pages is False and vars(mgr)["hold_pages"] is False
    assert mgr.timed_switch is True and vars(mgr)["timed_switch"] is True  # the constructor's, not the class's
    assert kit.defaults == [
        {
            "attribute": "mgr.hold_pages",
            "value": "False",
            "from": "class attribute (no constructor branch here sets it)",
        },
        {
            "attribute": "mgr.timed_switch",
            "value": "True",
            "from": "ForkManager.__init__: self.timed_switch = envs.SGLANG_FORK_WAIT.get() > 10",
        },
    ]
    with pytest.raises(MissingFakeAttribute) as caught:
        mgr.unreadable_switch  # noqa: B018
    assert str(caught.value).startswith(
        "real ForkManager object mgr.unreadable_switch: the class says False, but the build's constructor sets it "
        "and ForkManager.__init__: `os.getcwd()` is neither the build's own code nor a call the harness knows"
    )
    assert str(caught.value).endswith("; the probe must give it")
    assert kit.missing_attributes == ["mgr.unreadable_switch"]


def test_prime_takes_now_what_an_earlier_object_of_the_kind_read_later(strict: ModuleType, fork: ModuleType) -> None:
    first = manager(strict, fork, Kit(), "primed", mode="decode")
    assert first.is_decode is True and first.hold_pages is False  # a constructor value and a class default
    later = manager(strict, fork, Kit(), "primed", mode="decode")
    assert "is_decode" not in vars(later)
    strict.prime(later)
    assert vars(later)["is_decode"] is True and vars(later)["hold_pages"] is False
    other = manager(strict, fork, Kit(), "never-read")
    strict.prime(other)  # nothing was read on this kind yet
    assert "is_decode" not in vars(other) and "hold_pages" not in vars(other)
    plain = SimpleNamespace(value=1)
    strict.prime(plain)  # not built by the harness: left alone
    assert vars(plain) == {"value": 1}


# --- forced switches and literal build values ---------------------------------------------------------------
def test_a_forced_switch_is_recorded_with_the_build_s_own_default(strict: ModuleType, fork: ModuleType) -> None:
    kit = Kit()
    manager(
        strict,
        fork,
        kit,
        mode="decode",
        forced={"is_decode": False, "timed_switch": False, "unreadable": "x", "renamed_switch": True},
    )
    by_attribute = {entry["attribute"]: entry for entry in kit.forced}
    assert by_attribute["mgr.is_decode"] == {
        "attribute": "mgr.is_decode",
        "value": False,
        "build_default": True,  # evaluated on the object the probe built (its mode)
        "from": "ForkManager.__init__: self.is_decode = self.mode == 'decode'",
        "env": [],
    }
    assert by_attribute["mgr.timed_switch"]["env"] == ["SGLANG_FORK_WAIT"]
    unreadable = by_attribute["mgr.unreadable"]
    assert unreadable["value"] == "x" and unreadable["build_default"] is None and unreadable["env"] == []
    assert unreadable["from"].startswith("cannot evaluate: ForkManager.__init__: `os.getcwd()`")
    assert by_attribute["mgr.renamed_switch"] == {
        "attribute": "mgr.renamed_switch",
        "value": True,
        "build_default": None,
        "from": "this build's constructor does not set it",
        "env": [],
    }


def test_an_outcome_deciding_value_given_as_a_literal_is_refused(strict: ModuleType, fork: ModuleType) -> None:
    kit = Kit()
    with pytest.raises(strict.LiteralBuildValue) as caught:
        manager(strict, fork, kit, waiting_timeout=5, class_attrs={"bootstrap_timeout": 1})
    assert str(caught.value) == (
        "real ForkManager object mgr: bootstrap_timeout, waiting_timeout decide(s) the outcome; leave it to the "
        "build's constructor or pass it in forced= (reported beside the verdict with the build's default)"
    )
    assert kit.missing_attributes == ["mgr.bootstrap_timeout (given as a literal)"]


# --- the per-object classes ---------------------------------------------------------------------------------
def test_objects_built_alike_share_a_class_and_nothing_else_does(strict: ModuleType, fork: ModuleType) -> None:
    kit, other_kit = Kit(), Kit()
    a, b = manager(strict, fork, kit), manager(strict, fork, kit)
    assert type(a) is type(b) and type(a).__mro__[1] is fork.ForkManager
    assert type(a).__module__ == fork.__name__ and type(a).__qualname__ == "ForkManager"
    c = manager(strict, fork, other_kit)  # another kit: its reads are recorded there
    assert type(c) is not type(a)
    assert c.is_decode is False and [d["attribute"] for d in other_kit.defaults] == ["mgr.is_decode"]
    assert kit.defaults == []
    cache_a = strict.real_object(kit, fork.ForkManager, "cls", mode="prefill", class_attrs={"cache": {"a": 1}})
    cache_b = strict.real_object(kit, fork.ForkManager, "cls", mode="prefill", class_attrs={"cache": {"b": 2}})
    assert type(cache_a).cache == {"a": 1} and type(cache_b).cache == {"b": 2}


def test_callables_a_probe_gives_run_and_their_failures_are_recorded(strict: ModuleType, fork: ModuleType) -> None:
    kit = Kit()
    mgr = manager(strict, fork, kit, notify=lambda room: room * 2, fail=lambda: 1 / 0)
    assert mgr.notify(4) == 8
    with pytest.raises(ZeroDivisionError):
        mgr.fail()
    assert kit.raised == ["mgr.fail: ZeroDivisionError: division by zero"]


def test_bare_and_strict_instance_build_the_same_honest_objects(strict: ModuleType, fork: ModuleType) -> None:
    kit = Kit()
    bare = strict.bare(kit, fork.ForkManager, mode="decode")
    with pytest.raises(MissingFakeAttribute, match=r"^real ForkManager object ForkManager.peer_table was read"):
        bare.peer_table  # noqa: B018
    named = strict.bare(kit, fork.ForkManager, "named", mode="decode")
    assert named.is_decode is True
    instance = strict.strict_instance(kit, fork.ForkManager, "inst", mode="decode", forced={"peer_count": 9})
    assert instance.peer_count == 9 and instance.is_decode is True
    assert [f["attribute"] for f in kit.forced] == ["inst.peer_count"]
    assert kit.forced[0]["build_default"] == 2


def test_the_constructor_reader_is_made_once_with_the_build_s_cache_folder(
    strict: ModuleType, fork: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(strict, "_READERS", [])
    monkeypatch.setattr(sandbox, "_build_folder", [tmp_path / "build"])
    reader = strict._reader()
    assert strict._reader() is reader and reader.cache_folder == tmp_path / "build" / "difflab-construction"
    assert manager(strict, fork, Kit(), "cached", mode="decode").is_decode is True
    assert [p.suffix for p in (tmp_path / "build" / "difflab-construction").iterdir()] == [".json"]
