"""A hostile archive is refused before it can fill the disk: SHA256SUMS is read first, members it does not list
are refused, each member is hashed as it streams and the total is capped (``--max-unpacked-mib`` lifts it).

The archives are small on disk and would expand to tens of MiB: zeros compress about a thousand to one.
"""

from __future__ import annotations

import hashlib
import io
import tarfile
from pathlib import Path

import pytest

from difflab.bundle import checksums, layout, trust
from difflab.bundle.pack import pack, safe_extract
from difflab.bundle.verify import verify_path
from difflab.cli import main
from difflab.errors import VerificationFailed
from test_bundle_support import (  # noqa: F401 - isolated_config is an autouse fixture
    isolated_config,
    make_key,
    sealed,
)

ZEROS = 64 * 1024 * 1024


class Zeros(io.RawIOBase):
    """``size`` zero bytes, produced as read: the archive is built without holding them."""

    def __init__(self, size: int) -> None:
        self.left = size

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray) -> int:  # type: ignore[override]
        n = min(len(buffer), self.left)
        buffer[:n] = bytes(n)
        self.left -= n
        return n


def add(tar: tarfile.TarFile, name: str, data: bytes | int) -> None:
    info = tarfile.TarInfo(name)
    info.size = data if isinstance(data, int) else len(data)
    tar.addfile(info, Zeros(data) if isinstance(data, int) else io.BytesIO(data))


def archive(path: Path, members: list[tuple[str, bytes | int]]) -> Path:
    with tarfile.open(path, "w:gz", compresslevel=1) as tar:
        for name, data in members:
            add(tar, name, data)
    return path


def sums(entries: dict[str, bytes]) -> bytes:
    return checksums.render({rel: hashlib.sha256(data).hexdigest() for rel, data in entries.items()}).encode()


def extracted_bytes(dest: Path) -> int:
    return sum(p.stat().st_size for p in dest.rglob("*") if p.is_file())


@pytest.fixture
def dest(tmp_path: Path) -> Path:
    folder = tmp_path / "dest"
    folder.mkdir()
    return folder


def test_a_small_archive_that_expands_huge_is_refused_before_it_is_written(tmp_path: Path, dest: Path) -> None:
    listed = {"run.json": b"{}\n"}
    bomb = archive(
        tmp_path / "bomb.tar.gz",
        [("run/SHA256SUMS", sums(listed)), ("run/run.json", listed["run.json"]), ("run/zeros.bin", ZEROS)],
    )
    assert bomb.stat().st_size < 1024 * 1024  # < 1 MiB on disk, 64 MiB unpacked
    with pytest.raises(VerificationFailed) as caught:
        safe_extract(bomb, dest)
    assert "run/zeros.bin: not listed in SHA256SUMS" in str(caught.value)
    assert extracted_bytes(dest) == 0


def test_a_listed_member_bigger_than_the_limit_is_refused_before_it_is_read(tmp_path: Path, dest: Path) -> None:
    big = archive(tmp_path / "big.tar.gz", [("run/SHA256SUMS", sums({"zeros.bin": b""})), ("run/zeros.bin", ZEROS)])
    with pytest.raises(VerificationFailed, match=r"unpacks to more than 16 MiB .*--max-unpacked-mib"):
        safe_extract(big, dest, max_bytes=16 * 1024 * 1024)
    assert extracted_bytes(dest) == 0


def test_a_member_that_does_not_match_its_listed_digest_stops_extraction(tmp_path: Path, dest: Path) -> None:
    """The digest is checked as the member streams: it never lands under its name."""
    swapped = archive(
        tmp_path / "swapped.tar.gz",
        [("run/SHA256SUMS", sums({"a.json": b"{}", "b.json": b"{}"})), ("run/a.json", b"[]"), ("run/b.json", b"{}")],
    )
    with pytest.raises(VerificationFailed, match=r"run/a.json: sha256 .* does not match SHA256SUMS"):
        safe_extract(swapped, dest)
    assert not (dest / "run" / "a.json").exists() and not (dest / "run" / "b.json").exists()


def test_an_archive_without_sha256sums_is_refused(tmp_path: Path, dest: Path) -> None:
    bare = archive(tmp_path / "bare.tar.gz", [("run/run.json", b"{}")])
    with pytest.raises(VerificationFailed, match="no SHA256SUMS"):
        safe_extract(bare, dest)
    assert list(dest.iterdir()) == []


def test_a_sparse_member_is_refused(tmp_path: Path, dest: Path) -> None:
    path = tmp_path / "sparse.tar"
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tar:
        add(tar, "run/SHA256SUMS", sums({"s.bin": b""}))
        info = tarfile.TarInfo("run/s.bin")
        info.type = tarfile.GNUTYPE_SPARSE
        tar.addfile(info)
    with pytest.raises(VerificationFailed, match="run/s.bin: sparse file"):
        safe_extract(path, dest)


def test_a_genuine_bundle_unpacks_and_verifies_and_the_limit_can_be_lifted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    private, public = make_key(tmp_path / "keys")
    run_dir, _ = sealed(tmp_path, private)
    packed = pack(run_dir, environ={})
    assert verify_path(packed, trust.build(key_files=[public])).ok
    assert main(["verify", str(packed), "--key", str(public), "--max-unpacked-mib", "0"]) == 1
    assert "--max-unpacked-mib" in capsys.readouterr().err
    assert main(["verify", str(packed), "--key", str(public), "--max-unpacked-mib", "1"]) == 0
    with tarfile.open(packed) as tar:
        assert layout.CHECKSUMS_ENVELOPE in {m.name.split("/", 1)[1] for m in tar.getmembers()}
