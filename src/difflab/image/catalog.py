"""Which Docker images the lab can run probes in: found by the environment digest label, or named.

Images are labelled with the environment digest and reused: a second build for the same
environment is a label lookup. ``ci/Dockerfile`` builds an equivalent image on engines that
can pull ``python:3.11-slim`` (same labels).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from difflab.errors import EnvironmentSetupError

REPOSITORY = "difflab/cpu-env"
IMAGE_SCHEMA = "1"
"""Bumped when the image layout the runner relies on changes (paths, labels)."""
RECIPE = "host-rootfs-2"
"""Bumped when what goes into the root filesystem changes; part of the reuse key."""
ENV_IN_IMAGE = "/opt/difflab/env"
LABEL = "org.difflab"


@dataclass(frozen=True)
class DifflabImage:
    """One image the runner can use, as found in the engine."""

    ref: str
    id: str
    env_digest: str
    python: str
    recipe: str
    labels: dict[str, str] = field(default_factory=dict)
    size: int = 0
    layers: tuple[str, ...] = ()

    @property
    def pinned(self) -> str:
        """``repository:tag@sha256:<image id>``: what run.json records."""
        return f"{self.ref}@{self.id}"

    @classmethod
    def from_docker(cls, image: Any) -> DifflabImage:
        labels = dict(image.labels or {})
        tags = list(image.tags or [])
        ref = tags[0] if tags else image.id
        return cls(
            ref=ref,
            id=image.id,
            env_digest=labels.get(f"{LABEL}.env-digest", ""),
            python=labels.get(f"{LABEL}.python", f"{ENV_IN_IMAGE}/bin/python"),
            recipe=labels.get(f"{LABEL}.recipe", ""),
            labels=labels,
            size=int(image.attrs.get("Size") or 0),
            layers=tuple(image.attrs.get("RootFS", {}).get("Layers") or ()),
        )

    def describe(self) -> dict[str, Any]:
        return {
            "image": self.pinned,
            "image_id": self.id,
            "ref": self.ref,
            "env_digest": self.env_digest,
            "recipe": self.recipe,
            "python": self.python,
            "size_bytes": self.size,
            "layers": list(self.layers),
        }


def tag_for(env_digest: str) -> str:
    return f"{REPOSITORY}:{env_digest[:16]}"


def find_image(client: Any, env_digest: str) -> DifflabImage | None:
    """The newest image labelled for this environment digest, if the engine has one."""
    filters = {"label": [f"{LABEL}.env-digest={env_digest}", f"{LABEL}.image-schema={IMAGE_SCHEMA}"]}
    images = client.images.list(filters=filters)
    if not images:
        return None
    newest = max(images, key=lambda im: str(im.attrs.get("Created", "")))
    return DifflabImage.from_docker(newest)


def resolve_image(client: Any, ref: str) -> DifflabImage:
    """An image named by the user (``--image``/``image=``), e.g. one built from ci/Dockerfile."""
    import docker.errors

    try:
        return DifflabImage.from_docker(client.images.get(ref))
    except docker.errors.ImageNotFound:
        raise EnvironmentSetupError(f"docker image {ref!r} is not in the engine") from None
