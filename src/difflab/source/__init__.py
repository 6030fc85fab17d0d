"""Sources: turn a pin (release wheel, git commit) into a folder holding ``sglang/``.

Back ends sit side by side behind :class:`~difflab.source.base.SourceBackend`;
:func:`backend_for` picks one by name.
"""

from __future__ import annotations

from typing import Any

from difflab.source.base import MaterialisedSource, SourceBackend


def backend_for(kind: str, **options: Any) -> SourceBackend:
    """The back end for ``--source KIND``."""
    from difflab.errors import ConfigError

    if kind == "release":
        from difflab.source.release import ReleaseSource

        return ReleaseSource(**options)
    if kind == "git":
        from difflab.source.git import GitSource

        return GitSource(**options)
    raise ConfigError(f"unknown source kind {kind!r} (expected 'release' or 'git')")


__all__ = ["MaterialisedSource", "SourceBackend", "backend_for"]
