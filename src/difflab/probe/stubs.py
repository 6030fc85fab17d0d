"""Stand-ins for GPU-only packages that SGLang imports at module level.

PyPI's torchvision is CUDA-linked and crashes beside CPU torch, and real
triton costs ~900 MB for code the CPU probes never run. An empty
``sys.modules`` entry is not enough: torch's ``_dynamo`` reads
``triton.language.dtype`` and SGLang decorates functions with
``triton.jit``. So each stubbed package is served by a meta-path finder that
is also its loader and invents any attribute or submodule on demand.

Standard library only: it is installed inside the probe process before
anything imports torch.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any

STUBBED = ("triton", "torchvision", "datasets")
"""Top-level packages replaced by stubs in the shared CPU environment."""

_VERSIONS = {"triton": "3.5.0", "torchvision": "0.29.0", "datasets": "4.0.0"}


NO_DRIVER = ("triton.runtime.driver",)
"""Attribute paths that must fail: code probing for a GPU driver falls back to CPU."""


class _Anything:
    """A value that tolerates being called, subscripted, decorated or compared."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # Used as a decorator (``@triton.jit`` or ``@triton.autotune(...)``):
        # hand back the decorated function untouched.
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]
        return _Anything(f"{self._name}()")

    def __getattr__(self, item: str) -> Any:
        if item.startswith("__") and item.endswith("__"):
            raise AttributeError(item)
        path = f"{self._name}.{item}"
        if path in NO_DRIVER:
            raise RuntimeError(f"{path}: no GPU driver in the CPU lab")
        return _Anything(path)

    def __getitem__(self, item: Any) -> Any:
        return _Anything(f"{self._name}[]")

    def __mro_entries__(self, bases: tuple[Any, ...]) -> tuple[type, ...]:
        return (object,)

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return f"<stub {self._name}>"


class _StubClassMeta(type):
    """Class-level attribute invention (``InterpolationMode.NEAREST_EXACT``)."""

    def __getattr__(cls, item: str) -> Any:
        if item.startswith("__") and item.endswith("__"):
            raise AttributeError(item)
        return _Anything(f"{cls.__name__}.{item}")


def _stub_init(self: Any, *args: Any, **kwargs: Any) -> None:
    self.args, self.kwargs = args, kwargs


class _StubModule(types.ModuleType):
    def __getattr__(self, item: str) -> Any:
        if item.startswith("__") and item.endswith("__"):
            raise AttributeError(item)
        path = f"{self.__name__}.{item}"
        if path in NO_DRIVER:
            raise RuntimeError(f"{path}: no GPU driver in the CPU lab")
        if item[:1].isupper():
            cls = _StubClassMeta(item, (), {"__module__": self.__name__, "__init__": _stub_init})
            setattr(self, item, cls)
            return cls
        return _Anything(path)


class StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds and loads every module under the stubbed top-level packages."""

    def __init__(self, roots: tuple[str, ...] = STUBBED) -> None:
        self.roots = roots

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname.split(".", 1)[0] not in self.roots:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _StubModule(spec.name)
        module.__path__ = []  # a package, so submodules resolve through us
        root = spec.name.split(".", 1)[0]
        module.__version__ = _VERSIONS.get(root, "0.0.0")
        module.__difflab_stub__ = True
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


def install() -> None:
    """Put the stub finder first on ``sys.meta_path`` (idempotent)."""
    if not any(isinstance(f, StubFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, StubFinder())
