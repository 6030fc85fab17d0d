"""Building the image without any registry: stream the root filesystem into ``docker import``, then prove it.

Nothing is downloaded: the root filesystem (:mod:`difflab.image.rootfs`) is streamed as a
tar straight into ``docker import``; :func:`~difflab.image.smoke.verify_image` then proves
that every module the host environment can import, the image can import too.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from filelock import FileLock

from difflab.environment.shared import SharedEnvironment
from difflab.errors import EnvironmentSetupError
from difflab.image.catalog import ENV_IN_IMAGE, IMAGE_SCHEMA, LABEL, RECIPE, DifflabImage, find_image, tag_for
from difflab.image.rootfs import PythonInstall, Rootfs, RootfsStats
from difflab.image.smoke import verify_image
from difflab.paths import cache_root

Say = Callable[[str], None]


def _labels(env_digest: str, python: PythonInstall, extra: dict[str, str]) -> dict[str, str]:
    return {
        f"{LABEL}.image-schema": IMAGE_SCHEMA,
        f"{LABEL}.env-digest": env_digest,
        f"{LABEL}.recipe": RECIPE,
        f"{LABEL}.python": f"{ENV_IN_IMAGE}/bin/python",
        f"{LABEL}.python-version": python.version,
        f"{LABEL}.base-python": str(python.base_prefix),
        **extra,
    }


def _changes(labels: dict[str, str]) -> list[str]:
    """``docker import --change`` lines: labels, environment, working directory."""
    lines = [f"LABEL {k}={json.dumps(v)}" for k, v in sorted(labels.items())]
    lines += [
        f"ENV PATH={ENV_IN_IMAGE}/bin:/usr/local/bin:/usr/bin:/bin",
        "ENV LANG=C.UTF-8",
        "WORKDIR /tmp",
        f'CMD ["{ENV_IN_IMAGE}/bin/python"]',
    ]
    return lines


@dataclass
class BuildReport:
    """What a build did, for the ``difflab image build`` output and docs/docker.md."""

    image: DifflabImage
    built: bool
    rootfs: RootfsStats | None = None
    rootfs_sha256: str | None = None
    import_s: float = 0.0
    verify_s: float = 0.0
    total_s: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"built": self.built, **self.image.describe()}
        if self.rootfs is not None:
            out.update(
                rootfs_files=self.rootfs.files,
                rootfs_bytes=self.rootfs.bytes,
                rootfs_sha256=self.rootfs_sha256,
                rootfs_write_s=round(self.rootfs.seconds, 2),
                import_s=round(self.import_s, 2),
                verify_s=round(self.verify_s, 2),
                total_s=round(self.total_s, 2),
                host_libraries=self.rootfs.host_libraries,
                unresolved_by_ldd=self.rootfs.unresolved,
            )
        return out


def build_image(
    client: Any,
    env: SharedEnvironment,
    say: Say | None = None,
    tar_path: Path | None = None,
) -> BuildReport:
    """Assemble the root filesystem, ``docker import`` it, tag and verify it (no registry)."""
    say = say or (lambda _m: None)
    started = time.perf_counter()
    env.ensure(progress=say)
    rootfs = Rootfs.for_environment(env.path)
    stats = RootfsStats()
    labels = _labels(env.digest, rootfs.python, {})
    ref = tag_for(env.digest)
    repo, tag = ref.rsplit(":", 1)
    say(f"building docker image {ref} from {env.path} (+ {rootfs.python.base_prefix}); once per environment")
    if tar_path is not None:
        with tar_path.open("wb") as fh:
            sha = rootfs.write_tar(fh, stats)
        t0 = time.perf_counter()
        result = client.api.import_image(src=str(tar_path), repository=repo, tag=tag, changes=_changes(labels))
        import_s = time.perf_counter() - t0
    else:
        sha, result, import_s = _stream_import(client, rootfs, stats, repo, tag, labels)
    image_id = _imported_id(result)
    say(f"imported {ref} ({stats.files} files, {stats.bytes / 1e9:.2f} GB) in {import_s:.0f} s; verifying it")
    image = DifflabImage.from_docker(client.images.get(image_id))
    t0 = time.perf_counter()
    try:
        verify_image(client, image, env)
    except BaseException:
        client.images.remove(image.id, force=True)
        raise
    verify_s = time.perf_counter() - t0
    return BuildReport(
        image=image,
        built=True,
        rootfs=stats,
        rootfs_sha256=sha,
        import_s=import_s,
        verify_s=verify_s,
        total_s=time.perf_counter() - started,
    )


def _stream_import(
    client: Any,
    rootfs: Rootfs,
    stats: RootfsStats,
    repo: str,
    tag: str,
    labels: dict[str, str],
) -> tuple[str, Any, float]:
    """Write the tar into a pipe on one thread while the engine reads it on another: no 1 GB temp file."""
    read_fd, write_fd = os.pipe()
    outcome: dict[str, Any] = {}

    def writer() -> None:
        try:
            with os.fdopen(write_fd, "wb", buffering=1 << 20) as sink:
                outcome["sha"] = rootfs.write_tar(sink, stats)
        except BaseException as exc:
            outcome["error"] = exc

    source = os.fdopen(read_fd, "rb", buffering=0)

    def chunks(pipe: Any) -> Iterator[bytes]:
        while block := pipe.read(1 << 20):
            yield block

    thread = threading.Thread(target=writer, name="difflab-rootfs", daemon=True)
    t0 = time.perf_counter()
    thread.start()
    try:
        result = client.api.import_image(
            src=chunks(source), repository=repo, tag=tag, changes=_changes(labels), stream_src=True
        )
    finally:
        source.close()  # a failed import stops reading: unblock the writer (it sees a broken pipe)
        thread.join()
    if "error" in outcome:
        with contextlib.suppress(Exception):  # nothing may have been imported
            client.images.remove(f"{repo}:{tag}", force=True)
        raise EnvironmentSetupError(f"docker image: writing the root filesystem failed: {outcome['error']}")
    return outcome["sha"], result, time.perf_counter() - t0


def _imported_id(result: Any) -> str:
    """The engine answers a JSON progress stream ending in ``{"status": "sha256:..."}``."""
    text = result.decode() if isinstance(result, bytes) else str(result)
    image_id = None
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            msg = json.loads(line)
        except json.JSONDecodeError:
            continue
        if msg.get("error"):
            raise EnvironmentSetupError(f"docker import failed: {msg['error']}")
        status = str(msg.get("status", ""))
        if status.startswith("sha256:"):
            image_id = status
    if not image_id:
        raise EnvironmentSetupError(f"docker import gave no image id: {text[-500:]}")
    return image_id


def ensure_image(
    client: Any, env: SharedEnvironment, say: Say | None = None, rebuild: bool = False, tar_path: Path | None = None
) -> BuildReport:
    """The image for ``env``: reused if the engine has one with its digest, built otherwise."""
    if not rebuild:
        found = find_image(client, env.digest)
        if found is not None:
            return BuildReport(image=found, built=False)
    lock = cache_root() / "docker" / f"image-{env.digest[:16]}.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(lock)):
        if not rebuild:
            found = find_image(client, env.digest)
            if found is not None:
                return BuildReport(image=found, built=False)
        report = build_image(client, env, say, tar_path=tar_path)
        _prune_older(client, env.digest, report.image.id)
        return report


def _prune_older(client: Any, env_digest: str, keep: str) -> None:
    """A rebuild leaves the previous image untagged; remove it (1.2 GB each) unless a container holds it."""
    filters = {"label": [f"{LABEL}.env-digest={env_digest}"], "dangling": True}
    for image in client.images.list(filters=filters):
        if image.id != keep:
            with contextlib.suppress(Exception):
                client.images.remove(image.id)
