"""Container images pinned by digest, and which image each side of each fix runs.

A tag moves; a digest does not. The tier refuses a tag without a digest rather
than guess one: the digest is what makes a GPU verdict reproducible.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from difflab.errors import ConfigError
from difflab.matrix.model import Fix

_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
_TAG_VERSION = re.compile(r"^v?(\d+\.\d+\.\d+(?:\.post\d+)?)(?:-.*)?$")


@dataclass(frozen=True)
class ImageRef:
    """``repository[:tag]@sha256:<64 hex>``; containers are started from ``pinned`` (by digest)."""

    repository: str
    tag: str | None
    digest: str

    @property
    def pinned(self) -> str:
        return f"{self.repository}@{self.digest}"

    def __str__(self) -> str:
        return f"{self.repository}{f':{self.tag}' if self.tag else ''}@{self.digest}"

    @property
    def version(self) -> str | None:
        """The SGLang release a tag like ``v0.5.20-cu129`` names, if any."""
        m = _TAG_VERSION.match(self.tag or "")
        return m.group(1) if m else None


def _hint(ref: str) -> str:
    return (
        f"find the digest with `docker buildx imagetools inspect {ref}` (or, once pulled, "
        f"`docker inspect --format '{{{{index .RepoDigests 0}}}}' {ref}`)"
    )


def parse_image(text: str) -> ImageRef:
    """Parse and check a pinned reference; a bare tag is refused with the command that finds its digest."""
    text = text.strip()
    name, at, digest = text.partition("@")
    if not at:
        raise ConfigError(
            f"image {text!r} is not pinned by digest: tags move. Pass it as "
            f"{text}@sha256:<64 hex digits>; {_hint(text)}"
        )
    if not _DIGEST.match(digest):
        raise ConfigError(f"image {text!r}: digest must be sha256: followed by 64 lowercase hex digits")
    last = name.rsplit("/", 1)[-1]
    repo, tag = name.rsplit(":", 1) if ":" in last else (name, None)
    if not repo:
        raise ConfigError(f"image {text!r}: missing repository name")
    return ImageRef(repository=repo, tag=tag, digest=digest)


@dataclass
class ImageMap:
    """Images keyed by side (``base``/``head``) or by SGLang release version (``0.5.20``)."""

    by_key: dict[str, ImageRef]

    @classmethod
    def from_args(cls, images: list[str] | None, images_file: Path | None = None) -> ImageMap:
        """``--image [KEY=]REF@DIGEST`` (repeatable) and/or a TOML file with an ``[images]`` table."""
        by_key: dict[str, ImageRef] = {}
        if images_file is not None:
            try:
                table = tomllib.loads(images_file.read_text()).get("images", {})
            except (OSError, tomllib.TOMLDecodeError) as exc:
                raise ConfigError(f"{images_file}: cannot read the image table: {exc}") from None
            if not isinstance(table, dict):
                raise ConfigError(f'{images_file}: [images] must be a table of KEY = "REF@sha256:..."')
            for key, value in table.items():
                by_key[str(key)] = parse_image(str(value))
        for item in images or []:
            key, eq, ref = item.partition("=")
            if eq and "/" not in key and "@" not in key:
                by_key[key.strip()] = parse_image(ref)
                continue
            image = parse_image(item)
            if image.version is None:
                raise ConfigError(
                    f"--image {item}: its tag names no release; say which side or release it is "
                    "for, e.g. --image base=REF@sha256:... or --image 0.5.20=REF@sha256:..."
                )
            by_key[image.version] = image
        return cls(by_key)

    def resolve(self, fix: Fix, side: str, single_fix: bool) -> ImageRef | None:
        """The image for one side of a fix; ``None`` when the matrix says the side has no source."""
        pin = getattr(fix, side)
        if pin.unavailable:
            return None
        if single_fix and side in self.by_key:
            return self.by_key[side]
        if pin.release and pin.release in self.by_key:
            return self.by_key[pin.release]
        wanted = (
            f"--image {pin.release}=lmsysorg/sglang:v{pin.release}@sha256:<digest>"
            if pin.release
            else f"--image {side}=REF@sha256:<digest> (this side is commit {pin.commit})"
        )
        if side in self.by_key and not single_fix:
            wanted += f" (an image keyed '{side}' applies only when one fix is selected)"
        raise ConfigError(f"fix {fix.id} {side} needs an image: pass {wanted}")
