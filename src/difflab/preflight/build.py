"""``difflab preflight --build``: a build's configuration-only defences, before anything is deployed."""

from __future__ import annotations

import json
from pathlib import Path

from difflab.errors import ConfigError
from difflab.matrix import load_matrix
from difflab.paths import default_matrix
from difflab.preflight.defaults import BuildDefault, read_defaults, sglang_root
from difflab.progress import Reporter
from difflab.source import releases


def build_tree(build: str) -> tuple[str, Path]:
    """A folder as given, else a release the default matrix pins (materialised from the cache)."""
    path = Path(build)
    if path.is_dir():
        return str(path), path
    if "/" in build or path.exists():
        raise ConfigError(f"--build {build!r}: not a folder holding sglang/, nor a release version")
    release = releases(load_matrix(default_matrix()).releases).release(build)
    return f"sglang {build}", release.root


def build_report(build: str, json_file: Path | None, out: Reporter) -> int:
    """Print (or write) each defence's default; 1 when a default leaves a defence off or missing."""
    label, root = build_tree(build)
    found: list[BuildDefault] = read_defaults(sglang_root(root))
    doc = {"build": label, "root": str(root), "defaults": [d.to_dict() for d in found]}
    text = json.dumps(doc, indent=2, sort_keys=True, default=str)
    lines = "\n".join(("ok   " if d.protects else "OFF  ") + d.describe() for d in found)
    if json_file:
        json_file.write_text(text + "\n")
        out.print(lines)
    else:
        out.warn(lines)
        out.print(text)
    return 0 if all(d.protects for d in found) else 1
