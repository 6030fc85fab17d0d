"""Images are pinned by digest; each side of each fix resolves to exactly one."""

from __future__ import annotations

from pathlib import Path

import pytest

from difflab.errors import ConfigError
from difflab.gpu.images import ImageMap, parse_image

D1, D2 = "sha256:" + "a" * 64, "sha256:" + "b" * 64


def test_parse_pinned_reference():
    ref = parse_image(f"lmsysorg/sglang:v0.5.20-cu129@{D1}")
    assert (ref.repository, ref.tag, ref.digest, ref.version) == (
        "lmsysorg/sglang",
        "v0.5.20-cu129",
        D1,
        "0.5.20",
    )
    assert ref.pinned == f"lmsysorg/sglang@{D1}"  # started by digest, the tag is only a label
    assert parse_image(f"registry.local:5000/sglang@{D1}").repository == "registry.local:5000/sglang"


@pytest.mark.parametrize(
    "text, message",
    [
        ("lmsysorg/sglang:v0.5.20", "not pinned by digest: tags move"),
        ("lmsysorg/sglang:v0.5.20@sha256:abc", "64 lowercase hex"),
        (f"@{D1}", "missing repository"),
    ],
)
def test_bad_references_are_refused(text, message):
    with pytest.raises(ConfigError, match=message):
        parse_image(text)


def test_tag_without_digest_message_says_how_to_find_it():
    with pytest.raises(ConfigError, match="docker buildx imagetools inspect lmsysorg/sglang:v0.5.21"):
        parse_image("lmsysorg/sglang:v0.5.21")


def test_resolution_by_release_side_and_file(matrix, tmp_path: Path):
    fix = matrix.fix("38935")  # base 0.5.20, head 0.5.21
    images = ImageMap.from_args([f"lmsysorg/sglang:v0.5.20@{D1}", f"0.5.21=lmsysorg/sglang:v0.5.21@{D2}"])
    assert images.resolve(fix, "base", single_fix=False).digest == D1
    assert images.resolve(fix, "head", single_fix=False).digest == D2
    by_side = ImageMap.from_args([f"base=me/sglang:dev@{D2}", f"head=me/sglang:fix@{D1}"])
    assert by_side.resolve(fix, "base", single_fix=True).digest == D2
    with pytest.raises(ConfigError, match="applies only when one fix is selected"):
        by_side.resolve(fix, "base", single_fix=False)
    table = tmp_path / "images.toml"
    table.write_text(f'[images]\n"0.5.20" = "lmsysorg/sglang:v0.5.20@{D1}"\n')
    with pytest.raises(ConfigError, match="fix 38935 head needs an image: pass --image 0.5.21="):
        ImageMap.from_args(None, table).resolve(fix, "head", single_fix=True)
    unavailable = matrix.fix("43719b")
    assert ImageMap({}).resolve(unavailable, "head", single_fix=True) is None


def test_untagged_image_needs_a_key():
    with pytest.raises(ConfigError, match="its tag names no release"):
        ImageMap.from_args([f"me/sglang:latest@{D1}"])
