"""Real SGLang objects built the way SGLang's own CPU tests build them, but strict.

SGLang's unit tests create heavy classes with ``Cls.__new__(Cls)`` and set only
the attributes the code under test reads. The real method bodies then run, but
an attribute the test forgot surfaces as an ``AttributeError`` -- which the
transfer worker, ``pop_transferred`` and ``_send_abort_notification`` catch and
turn into behaviour. Here the object's class is a thin subclass whose
``__getattr__`` (consulted only when normal lookup fails) records the missing
attribute with the kit and raises :class:`MissingFakeAttribute`, a
``BaseException`` that no ``except Exception`` can swallow. The real methods are
untouched.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from difflab.probe.kit import Kit, MissingFakeAttribute

T = TypeVar("T")


def strict_instance(
    kit: Kit,
    cls: type[T],
    name: str,
    class_attrs: dict[str, Any] | None = None,
    lenient: Callable[[str], Any] | None = None,
    **attrs: Any,
) -> T:
    """A real ``cls`` object (no ``__init__``) holding exactly ``attrs``.

    ``class_attrs`` go on a fresh per-object subclass: they shadow class-level
    state such as the decode receiver's shared socket cache, so a scenario never
    sees a socket another scenario created. ``lenient(name)`` may supply a
    value for a missing name instead (return ``None`` to stay strict): for an
    API a future fix may add under a name the probe can only pattern-match.
    """

    def missing(self: Any, item: str) -> Any:
        if item.startswith("__") and item.endswith("__"):
            raise AttributeError(item)
        supplied = lenient(item) if lenient is not None else None
        if supplied is not None:
            setattr(self, item, supplied)
            return supplied
        qualified = f"{name}.{item}"
        kit.missing_attributes.append(qualified)
        raise MissingFakeAttribute(f"real {cls.__name__} object {qualified} was not given by the probe")

    namespace: dict[str, Any] = {"__getattr__": missing, "__module__": cls.__module__}
    namespace.update(class_attrs or {})
    strict_cls = type(cls.__name__, (cls,), namespace)
    obj = object.__new__(strict_cls)
    for key, value in attrs.items():
        setattr(obj, key, value)
    return obj
