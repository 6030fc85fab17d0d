"""``REPRODUCE.md``: the exact commands to check and re-run a bundle, written into the bundle itself.

Rendered from the run folder and the signing key only (no clock, no paths of this machine), so it
is part of what is signed and stays identical when a folder is sealed again.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any

from difflab.bundle import layout

LOCAL_ONLY = ("--key",)
"""Options whose value is a path on the publisher's machine (a private key): of no use to anyone else."""


def _invocation(argv: Any) -> str:
    """The recorded command as anyone would type it: ``difflab ...``, without the publisher's local paths."""
    if not isinstance(argv, list) or not argv:
        return "(not recorded)"
    words = [str(a) for a in argv]
    if words[0].endswith("difflab"):
        words = words[1:]
    kept: list[str] = []
    skip = False
    for word in words:
        if skip:
            skip = False
        elif word in LOCAL_ONLY:
            skip = True
        elif not word.startswith(tuple(f"{o}=" for o in LOCAL_ONLY)):
            kept.append(word)
    return shlex.join(["difflab", *kept])


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
    probes = run.get("probes") if isinstance(run.get("probes"), dict) else {}
    lines = [
        "# Reproducing this run",
        "",
        f"Run {run.get('started_at')} → {run.get('finished_at')}, exit code {run.get('exit_code')}.",
        f"This bundle says it was signed with the Ed25519 key `{fingerprint}` (public key: `{layout.PUBLIC_KEY}`).",
        "`BUNDLE` below is this folder or its packed `.tar.gz`; `PUBLISHED` is the fingerprint the",
        "publisher published through another channel (release notes, their website). Compare the two:",
        "the one written here proves nothing by itself, since whoever can change the bundle can change it.",
        "",
        "## 1. Verify (offline; nothing in the bundle is executed)",
        "",
        "```sh",
        "difflab verify BUNDLE --fingerprint PUBLISHED",
        "# without difflab, checksums only:",
        f"(cd BUNDLE && LC_ALL=C sha256sum -c {layout.CHECKSUMS})",
        "```",
        "",
        "## 2. Re-run the same pins and compare",
        "",
        "```sh",
        "difflab reproduce BUNDLE --fingerprint PUBLISHED",
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
        f"- lab: sglang-difflab {run.get('tool_version')} (`pipx install 'sglang-difflab=={run.get('tool_version')}'`)",
        *(
            [f"- probes: {probes.get('origin')} (sha256 `{probes.get('sha256')}`); reproduce names other probes"]
            if probes
            else []
        ),
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
