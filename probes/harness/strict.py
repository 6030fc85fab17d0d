"""Real SGLang objects built the way SGLang's own CPU tests build them -- but honest about defaults.

SGLang's unit tests create heavy classes with ``Cls.__new__(Cls)`` and set only
the attributes the code under test reads. The real method bodies then run.
Two things can go silently wrong there, and this builder closes both:

- an attribute the probe forgot surfaces as an ``AttributeError``, which the
  transfer worker, ``pop_transferred`` and ``_send_abort_notification`` catch
  and turn into behaviour;
- an attribute the build's constructor *would* have set (a fork's own fix
  state, a fork's own feature flag) reads as missing, so
  ``getattr(self, name, default)`` and ``hasattr`` take a default the harness
  chose.

Every read of an attribute the probe did not give is therefore answered in
one of four ways, each recorded with the kit:

1. the build's constructor sets it (:mod:`harness.construction`): the value
   this build's own code computes -- a fork's flag default, a fork's own
   state container -- is set on the object and listed as a *build default*;
2. the probe declared it ``absent`` (the real object lacks it too): a plain
   ``AttributeError``, listed as a *fallback*;
3. only a non-constructor method of the class assigns it (lazily created
   state): a plain ``AttributeError``, exactly what the real object does
   before that method ran, listed as a fallback;
4. anything else, or a constructor expression the harness cannot evaluate:
   :class:`MissingFakeAttribute`, a ``BaseException`` no ``except Exception``
   can swallow, naming the attribute -- a probe error, never a verdict.

Flags a probe must force (``forced=``) are set, and the build's own default
for them is evaluated and reported beside the verdict. A value an outcome
depends on (:data:`BUILD_VALUES`: the deferred-release switches and timeout,
the transfer timeouts) may not be handed over as a plain attribute: it comes
from the build's constructor, or is forced and reported.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from difflab.probe.kit import Kit, MissingFakeAttribute, is_plain_callable
from difflab.probe.sandbox import build_cache_folder
from harness.construction import ConstructorReader, NoBranchApplies, NotEvaluable, describe, source_line
from harness.runtime import published_server_args

T = TypeVar("T")

_ENV_NAME = re.compile(r"\bSGLANG_[A-Z0-9_]+\b")

BUILD_VALUES = frozenset(
    {
        "enable_deferred_decode_kv_release",  # KV managers: deferred release on this back end
        "enable_deferred_kv_release",  # DecodeTransferQueue: hold pages until the drain ack
        "deferred_kv_release_timeout",  # DecodeTransferQueue: how long a hold may last
        "waiting_timeout",  # KV managers: how long decode waits for a transfer
        "bootstrap_timeout",  # KV managers: how long a room may bootstrap
        "heartbeat_interval",
        "max_failures",
    }
)
"""Attributes whose value decides a scenario's outcome: the build's own, or ``forced=`` (reported), never a literal."""


class LiteralBuildValue(MissingFakeAttribute):
    """A probe handed a real object an outcome-deciding value as a plain attribute (see :data:`BUILD_VALUES`)."""


_RESOLVED: dict[tuple[type, str], dict[str, None]] = {}
"""(class, name) -> attributes an object of that kind took from the build's constructor, in order."""


_READERS: list[ConstructorReader] = []
"""The one constructor reader of this process (a build's source does not change while it runs)."""


def _reader() -> ConstructorReader:
    if not _READERS:  # made on first use: the sandbox has named the build's cache folder by then
        _READERS.append(ConstructorReader(build_cache_folder("difflab-construction")))
    return _READERS[0]


def _known_parameters() -> dict[str, Any]:
    """Constructor arguments the harness can supply for real: the published server config."""
    args = published_server_args()
    return {"server_args": args} if args is not None else {}


def _build_default(obj: Any, cls: type, attribute: str) -> tuple[Any, Any]:
    return _reader().build_default(obj, cls, attribute, _known_parameters())


def _guarded(kit: Kit, name: str, key: str, value: Any) -> Any:
    """Callables a probe hands a real object are fakes too: exceptions inside them are recorded."""
    if is_plain_callable(value):
        return kit.guard(value, f"{name}.{key}")
    return value


_CLASSES: dict[tuple[Any, ...], type] = {}


@dataclass
class _Answers:
    """How the objects of one strict class answer a read of an attribute the probe did not give."""

    kit: Kit
    cls: type
    name: str
    absent: frozenset[str]
    evaluating: list[str] = field(default_factory=list)
    """Attributes whose constructor expression is being evaluated (named in what a nested read reports)."""

    def read(self, obj: Any, item: str) -> Any:
        """``__getattr__``: the build's constructor default, a declared or lazy absence, or a probe error."""
        if item.startswith("__") and item.endswith("__"):
            raise AttributeError(item)
        qualified = f"{self.name}.{item}"
        if self.evaluating:
            qualified += " (read while evaluating " + " -> ".join(self.evaluating) + ")"
        if item in self.absent:
            self.kit.fallback(qualified, "declared absent by the probe")
            raise AttributeError(item)
        found = _reader().lookup(self.cls, item)
        if found.constructed:
            return self.from_constructor(obj, item, qualified)
        if found.assigned_elsewhere:
            self.kit.fallback(qualified, "created lazily by " + ", ".join(found.assigned_elsewhere))
            raise AttributeError(item)
        self.kit.missing_attributes.append(qualified)
        raise MissingFakeAttribute(
            f"real {self.cls.__name__} object {qualified} was read, but neither the probe nor the build's "
            "constructor gives it"
        )

    def from_constructor(self, obj: Any, item: str, qualified: str) -> Any:
        self.evaluating.append(item)
        try:
            value, assignment = _build_default(obj, self.cls, item)
        except NotEvaluable as exc:
            self.kit.missing_attributes.append(qualified)
            raise MissingFakeAttribute(
                f"real {self.cls.__name__} object {qualified}: the build's constructor sets it, but {exc}; "
                "the probe must give it"
            ) from None
        finally:
            self.evaluating.pop()
        object.__setattr__(obj, item, value)
        self.kit.build_default(qualified, describe(value), source_line(assignment))
        _RESOLVED.setdefault((self.cls, self.name), {})[item] = None
        return value


def _strict_class(
    kit: Kit, cls: type, name: str, absent_names: frozenset[str], given: frozenset[str], class_attrs: dict[str, Any]
) -> type:
    """The per-object subclass answering every read honestly; shared by objects built alike.

    Objects of one class and name with the same given attribute names and the very same
    ``class_attrs`` objects share it (as real instances share their class): building a
    thousand receivers then costs a thousand instances, not a thousand classes.
    """
    key = (id(kit), cls, name, absent_names, given, tuple((k, id(v)) for k, v in sorted(class_attrs.items())))
    if key in _CLASSES:
        return _CLASSES[key]
    answers = _Answers(kit, cls, name, absent_names)

    def missing(obj: Any, item: str) -> Any:  # a function, so that the object is passed as it is to a method
        return answers.read(obj, item)

    namespace: dict[str, Any] = {"__getattr__": missing, "__module__": cls.__module__}
    for attribute, class_value in _reader().shadowed_class_values(cls).items():
        if attribute not in given:
            namespace[attribute] = _ConstructorDefault(kit, cls, name, attribute, class_value)
    namespace.update(class_attrs)
    strict_cls = type(cls.__name__, (cls,), namespace)
    strict_cls.__qualname__ = cls.__qualname__
    strict_cls._harness_kind = (cls, name)  # type: ignore[attr-defined]
    _CLASSES[key] = strict_cls
    return strict_cls


def real_object(
    kit: Kit,
    cls: type[T],
    name: str,
    *,
    class_attrs: dict[str, Any] | None = None,
    forced: dict[str, Any] | None = None,
    absent: Iterable[str] = (),
    **attrs: Any,
) -> T:
    """A real ``cls`` object (no ``__init__``) holding ``attrs``; every other read is answered honestly.

    ``class_attrs`` go on a fresh per-object subclass: they shadow class-level
    state such as the decode receiver's shared socket cache. ``forced`` are
    switches the scenario needs on whatever this build defaults to (recorded
    with that default). ``absent`` are attributes the real object lacks as
    well, so SGLang's own ``getattr``/``hasattr`` defaults are the right answer.
    """
    literal = sorted(BUILD_VALUES & (set(attrs) | set(class_attrs or {})))
    if literal:
        kit.missing_attributes.append(f"{name}.{literal[0]} (given as a literal)")
        raise LiteralBuildValue(
            f"real {cls.__name__} object {name}: {', '.join(literal)} decide(s) the outcome; leave it to the "
            "build's constructor or pass it in forced= (reported beside the verdict with the build's default)"
        )
    given = frozenset(attrs) | frozenset(forced or {}) | frozenset(class_attrs or {})
    strict_cls = _strict_class(kit, cls, name, frozenset(absent), given, class_attrs or {})
    obj = object.__new__(strict_cls)
    for key, value in attrs.items():
        object.__setattr__(obj, key, _guarded(kit, name, key, value))
    for key, value in (forced or {}).items():
        object.__setattr__(obj, key, value)
        _record_forced(kit, obj, cls, name, key, value)
    return obj


class _ConstructorDefault:
    """A class-level default the constructor overrides: answered with the constructor's value.

    ``BaseKVManager.enable_deferred_decode_kv_release = False`` is what a
    ``__new__``-built manager would read, while this build's constructor may
    compute True. The class value stands only where no constructor branch that
    runs here assigns the attribute.
    """

    def __init__(self, kit: Kit, cls: type, name: str, attribute: str, class_value: Any) -> None:
        self.kit, self.cls, self.name, self.attribute, self.class_value = kit, cls, name, attribute, class_value

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return self.class_value
        qualified = f"{self.name}.{self.attribute}"
        try:
            value, assignment = _build_default(obj, self.cls, self.attribute)
        except NoBranchApplies:
            value = self.class_value
            self.kit.build_default(qualified, describe(value), "class attribute (no constructor branch here sets it)")
        except NotEvaluable as exc:
            self.kit.missing_attributes.append(qualified)
            raise MissingFakeAttribute(
                f"real {self.cls.__name__} object {qualified}: the class says {self.class_value!r}, but the "
                f"build's constructor sets it and {exc}; the probe must give it"
            ) from None
        else:
            self.kit.build_default(qualified, describe(value), source_line(assignment))
        object.__setattr__(obj, self.attribute, value)
        _RESOLVED.setdefault((self.cls, self.name), {})[self.attribute] = None
        return value


def prime(obj: Any) -> None:
    """Take now, from the build's constructor, what earlier objects of the same kind had to take later.

    A throughput bench builds fresh objects before its timer starts; without this, the
    first read of each constructor default (an AST evaluation of the build's source)
    would run inside the timed hot path. Which attributes: those an earlier object built
    by :func:`real_object` under the same class and name read while the path ran -- the
    harness records them, no probe names them.
    """
    kind = getattr(type(obj), "_harness_kind", None)
    for item in list(_RESOLVED.get(kind, ())) if kind else ():
        if item not in vars(obj):
            getattr(obj, item)


def _record_forced(kit: Kit, obj: Any, cls: type, name: str, key: str, value: Any) -> None:
    found = _reader().lookup(cls, key)
    if not found.constructed:
        kit.forced_flag(f"{name}.{key}", value, None, "this build's constructor does not set it", [])
        return
    try:
        default, assignment = _build_default(obj, cls, key)
    except NotEvaluable as exc:
        kit.forced_flag(f"{name}.{key}", value, None, f"cannot evaluate: {exc}", [])
        return
    origin = source_line(assignment)
    kit.forced_flag(f"{name}.{key}", value, default, origin, sorted(set(_ENV_NAME.findall(assignment.text))))


def strict_instance(kit: Kit, cls: type[T], name: str, **kwargs: Any) -> T:
    """Kept for the probes' vocabulary: :func:`real_object`."""
    return real_object(kit, cls, name, **kwargs)


def bare(kit: Kit, cls: type[T], name: str | None = None, **attrs: Any) -> T:
    """An instance of a real SGLang class, built without its constructor, holding ``attrs``.

    The constructors want GPUs, process groups and a model; SGLang's own CPU
    tests build objects the same way. Methods stay the real ones; any other
    attribute is answered by :func:`real_object` (the build's own constructor
    default, or a probe error naming it).
    """
    return real_object(kit, cls, name or cls.__name__, **attrs)
