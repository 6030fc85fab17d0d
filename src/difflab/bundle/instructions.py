"""``REPRODUCE.md``: the exact commands to check and re-run a bundle, written into the bundle itself.

Rendered from the run folder and the signing key only (no clock, no paths of this machine), so it
is part of what is signed and stays identical when a folder is sealed again.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any

from difflab.bundle import layout


def _invocation(argv: Any) -> str:
    if not isinstance(argv, list) or not argv:
        return "(not recorded)"
    words = [str(a) for a in argv]
    if not words[0].endswith("difflab"):
        words.insert(0, "difflab")
    return shlex.join(words)


def _source_line(label: str, identity: Mapping[str, Any]) -> str:
    if identity.get("kind") == "release":
        return (
            f"- `{label}`: release {identity.get('version')} — `{identity.get('file')}` "
            f"sha256 `{identity.get('sha256')}`"
        )
    if identity.get("kind") == "git":
        return (
            f"- `{label}`: git {identity.get('repo')} commit `{identity.get('commit')}` tree `{identity.get('tree')}`"
        )
    return f"- `{label}`: {dict(identity)}"


def render(run: Mapping[str, Any], environment: Mapping[str, Any] | None, fingerprint: str) -> str:
    runner = run.get("runner") or {}
    env = environment or {}
    lines = [
        "# Reproducing this run",
        "",
        f"Run {run.get('started_at')} → {run.get('finished_at')}, exit code {run.get('exit_code')}.",
        f"Signed with the Ed25519 key `{fingerprint}` (public key: `{layout.PUBLIC_KEY}`).",
        "`BUNDLE` below is this folder or its packed `.tar.gz`.",
        "",
        "## 1. Verify (offline; nothing in the bundle is executed)",
        "",
        "Only pin the fingerprint if you obtained it from the publisher through another channel",
        "(release notes, their website); the copy in this bundle proves nothing by itself.",
        "",
        "```sh",
        f"difflab verify BUNDLE --fingerprint {fingerprint}",
        "# without difflab, checksums only:",
        f"(cd BUNDLE && LC_ALL=C sha256sum -c {layout.CHECKSUMS})",
        "```",
        "",
        "## 2. Re-run the same pins and compare",
        "",
        "```sh",
        f"difflab reproduce BUNDLE --fingerprint {fingerprint}",
        "```",
        "",
        "This verifies the bundle, re-runs the bundle's `matrix.toml` with the settings below into a fresh",
        "folder, and exits 0 only if every verdict and every observed field matches.",
        "The original invocation, as recorded:",
        "",
        "```sh",
        _invocation(run.get("argv")),
        "```",
        "",
        f"- fixes: {', '.join(str(f) for f in run.get('fixes') or []) or '(all in the matrix)'}",
        f"- source kind: {run.get('source_kind')}" + (f" ({run.get('repo')})" if run.get("repo") else ""),
        f"- runner: {runner.get('name')}" + (f", image `{runner.get('image')}`" if runner.get("image") else ""),
        f"- matrix: `{layout.MATRIX}` (sha256 `{(run.get('matrix') or {}).get('sha256')}`)",
        "",
        "Sources exercised (pins):",
        "",
    ]
    lines += [_source_line(label, ident) for label, ident in sorted((run.get("sources") or {}).items())]
    lines += [
        "",
        "## Recorded environment",
        "",
        f"Python {env.get('python_version')}, environment digest `{env.get('digest', run.get('environment_digest'))}`.",
        "`difflab reproduce` reports any difference from this package list:",
        "",
        "```text",
        *[str(p) for p in env.get("packages") or []],
        "```",
        "",
    ]
    return "\n".join(lines)
