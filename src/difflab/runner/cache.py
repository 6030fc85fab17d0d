"""Result cache: a probe re-runs only when something it depends on changed.

An observation is a function of the SGLang source, the shared environment,
the probe file, the harness it imports, the lab code that runs inside the
probe process, and which fix/probe/side it answers for. The digest of all of
them keys a stored observation (and its log) under
``$DIFFLAB_CACHE/results/``. Only ``ok`` and ``n/a`` results are stored: an
error may be a flake or the machine's fault, and must be retried, never
replayed. ``--no-cache`` (``RunRequest.use_cache = False``) bypasses this
wrapper entirely.

A probe process runs a build's code as the same user as the lab, so it can write here. Every
entry therefore carries an HMAC-SHA256 over its content, keyed with a secret that lives in the
lab's config folder (``result-cache.key``), which probe processes cannot read
(:mod:`difflab.probe.sandbox`): an entry whose MAC does not check out is removed and run
again, never replayed. The back end is part of the key.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
import os
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from difflab.environment.shared import SharedEnvironment
from difflab.files.atomic import write_atomic
from difflab.observation import SCHEMA_VERSION, Observation
from difflab.paths import cache_root, config_root
from difflab.runner import childlib
from difflab.runner.base import ProbeJob, Progress, Runner

CACHE_SCHEMA = 2
"""Bump when what a stored entry means changes; old entries then simply miss."""

CACHEABLE = ("ok", "n/a")

SECRET_NAME = "result-cache.key"


def cache_secret(folder: Path | None = None) -> bytes:
    """The key that authenticates cache entries: made once, mode 0600, in the config folder (0700)."""
    path = (folder or config_root()) / SECRET_NAME
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        pass
    else:
        with os.fdopen(fd, "w") as handle:
            handle.write(secrets.token_hex(32) + "\n")
    text = path.read_text().strip()
    if len(text) < 64:  # a half-written key from a concurrent first run: read it once more
        text = path.read_text().strip()
    return bytes.fromhex(text)


def _mac(secret: bytes, entry: dict[str, Any]) -> str:
    body = json.dumps({k: v for k, v in entry.items() if k != "mac"}, sort_keys=True).encode()
    return hmac.new(secret, body, hashlib.sha256).hexdigest()


def file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def tree_digest(folder: Path) -> str:
    """Every ``*.py`` under ``folder`` by relative path and content ('' if there is none)."""
    if not folder.is_dir():
        return ""
    h = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*.py") if "__pycache__" not in p.parts):
        h.update(path.relative_to(folder).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


@dataclass
class CachingRunner:
    """Wraps any runner; answers from the cache where it can and runs only the rest."""

    inner: Runner
    environment: SharedEnvironment
    cache_dir: Path | None = None
    secret: bytes | None = None
    """The entries' HMAC key (default: :func:`cache_secret`)."""
    hits: int = field(default=0, init=False)
    misses: int = field(default=0, init=False)
    discarded: int = field(default=0, init=False)
    """Entries found but not authentic (written by something other than the lab): removed, run again."""

    @property
    def _secret(self) -> bytes:
        if self.secret is None:
            self.secret = cache_secret()
        return self.secret

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def folder(self) -> Path:
        return self.cache_dir or cache_root() / "results"

    def describe(self) -> dict[str, Any]:
        return {**self.inner.describe(), "cache": True}

    def key_parts(self, job: ProbeJob, shared: dict[str, str] | None = None) -> dict[str, Any]:
        """Everything the observation depends on (``shared``: digests computed once per run)."""
        shared = shared or self._shared(job)
        return {
            "cache_schema": CACHE_SCHEMA,
            "observation_schema": SCHEMA_VERSION,
            "backend": self.inner.name,
            "source": job.source.digest,
            "environment": self.environment.digest,
            "probe_file": file_digest(job.probe_file),
            "harness": shared["harness"],
            "child": shared["child"],
            "fix": job.fix_id,
            "probe": job.probe,
            "side": job.side,
        }

    @staticmethod
    def key(parts: dict[str, Any]) -> str:
        return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()

    def _shared(self, job: ProbeJob) -> dict[str, str]:
        return {"harness": tree_digest(Path(job.probe_file).parent / "harness"), "child": childlib.child_digest()}

    def _path(self, key: str) -> Path:
        return self.folder / key[:2] / f"{key}.json"

    # -- running -------------------------------------------------------------------
    def run(self, jobs: Sequence[ProbeJob], on_done: Progress | None = None) -> list[Observation]:
        results: list[Observation | None] = [None] * len(jobs)
        todo: list[tuple[int, str, dict[str, Any]]] = []
        shared_by_dir: dict[Path, dict[str, str]] = {}
        for i, job in enumerate(jobs):
            probe_dir = Path(job.probe_file).parent
            shared = shared_by_dir.setdefault(probe_dir, self._shared(job))
            try:
                parts = self.key_parts(job, shared)
            except OSError:  # no probe file: the runner reports that as an error
                results[i] = None
                todo.append((i, "", {}))
                continue
            key = self.key(parts)
            hit = self.load(key, job)
            if hit is None:
                todo.append((i, key, parts))
                continue
            self.hits += 1
            results[i] = hit
            if on_done:
                on_done(hit)
        if todo:
            self.misses += len(todo)
            fresh = self.inner.run([jobs[i] for i, _, _ in todo], on_done)
            for (i, key, parts), obs in zip(todo, fresh, strict=True):
                results[i] = obs
                if key and obs.status in CACHEABLE:
                    self.store(key, parts, obs, jobs[i])
        return [r for r in results if r is not None]

    # -- storage -------------------------------------------------------------------
    def load(self, key: str, job: ProbeJob) -> Observation | None:
        """The stored observation for ``key`` (marked cached, its log restored), or None.

        An entry that is not authentic is removed: the lab did not write it.
        """
        path = self._path(key)
        try:
            entry = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(entry, dict) or not hmac.compare_digest(str(entry.get("mac", "")), _mac(self._secret, entry)):
            self.discarded += 1
            path.unlink(missing_ok=True)
            return None
        try:
            obs = Observation.from_dict(entry["observation"])
        except (ValueError, KeyError, TypeError):
            return None
        if entry.get("key") != key or obs.status not in CACHEABLE:
            return None
        if job.log_path is not None and entry.get("log") is not None:
            job.log_path.parent.mkdir(parents=True, exist_ok=True)
            job.log_path.write_text(entry["log"])
        return dataclasses.replace(
            obs,
            fix=job.fix_id,
            probe=job.probe,
            side=job.side,
            source=dict(job.source.identity),
            cached=True,
        )

    def store(self, key: str, parts: dict[str, Any], obs: Observation, job: ProbeJob) -> None:
        """Written to a temporary file and renamed, so a reader never sees half an entry."""
        log = None
        if job.log_path is not None:
            try:
                log = job.log_path.read_text(errors="replace")
            except OSError:
                log = None
        entry: dict[str, Any] = {"key": key, "parts": parts, "observation": obs.to_dict(), "log": log}
        entry["mac"] = _mac(self._secret, entry)
        write_atomic(self._path(key), json.dumps(entry, sort_keys=True))
