"""File names from somewhere else (a bundle, an archive), shown safely and judged by what they contain.

A name can hold control characters: an ANSI escape sequence printed raw rewrites the user's
terminal (hides a line, fakes an "OK"), and a bidirectional override reorders what they read.
Such names are shown escaped everywhere and refused inside bundles.
"""

from __future__ import annotations

import os
import unicodedata
from pathlib import Path

_HIDDEN = ("Cc", "Cf", "Cs", "Zl", "Zp")
"""Control, format (bidi overrides, zero-width), surrogate (undecodable bytes), line and paragraph separators."""


def has_controls(text: str) -> bool:
    """Whether ``text`` holds a character that does not print as itself."""
    return any(unicodedata.category(ch) in _HIDDEN for ch in text)


def printable(text: str) -> str:
    """``text`` with every such character written as an escape (``\\x1b``, ``\\u202e``): safe on a terminal."""
    if not has_controls(text):
        return text
    out = []
    for ch in text:
        if unicodedata.category(ch) not in _HIDDEN:
            out.append(ch)
        elif ord(ch) < 0x100:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(f"\\u{ord(ch):04x}")
    return "".join(out)


def argument_path(text: str) -> Path:
    """A path from the command line, made absolute where it is parsed (``.`` and ``./run`` included).

    ``Path(".")`` has an empty name, and every later step (a sibling's name, a bundle's name, a
    Sigstore bundle beside an archive) needs one; resolving once here spares each of them a fix.
    """
    return Path(os.path.abspath(os.path.expanduser(text)))
