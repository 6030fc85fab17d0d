"""pack: byte-identical archives; unpacking refuses members that would leave the folder, naming them."""

from __future__ import annotations

import gzip
import io
import tarfile
from pathlib import Path

import pytest

from difflab.bundle import layout, trust
from difflab.bundle.pack import archive_epoch, default_output, pack, safe_extract
from difflab.bundle.verify import verify_path
from difflab.cli import main
from difflab.errors import ConfigError, VerificationFailed
from test_bundle_support import (  # noqa: F401 - isolated_config is an autouse fixture
    SEALED_FILES,
    isolated_config,
    make_key,
    make_run_folder,
    sealed,
)

RUN_EPOCH = 1772359500  # 2026-03-01T10:05:00Z, the synthetic run's finished_at


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    private, _ = make_key(tmp_path / "keys")
    return sealed(tmp_path, private)[0]


def test_packing_twice_gives_identical_bytes(run_dir: Path, tmp_path: Path) -> None:
    first = pack(run_dir, tmp_path / "a.tar.gz", environ={})
    (run_dir / "summary.md").touch()  # a newer mtime on disk must not matter
    second = pack(run_dir, tmp_path / "b.tar.gz", environ={})
    assert first.read_bytes() == second.read_bytes()


def test_archive_is_normalised(run_dir: Path) -> None:
    out = pack(run_dir, environ={})
    assert out == default_output(run_dir) == run_dir.parent / "run.tar.gz"
    raw = out.read_bytes()
    assert raw[4:8] == b"\0\0\0\0" and not raw[3] & 0x08  # gzip: no mtime, no file name
    with tarfile.open(out) as tar:
        members = tar.getmembers()
    names = [m.name for m in members]
    assert names == sorted(names, key=lambda n: n.encode())
    assert names == [f"run/{rel}" for rel in SEALED_FILES]
    assert {(m.mtime, m.uid, m.gid, m.uname, m.gname, m.mode) for m in members} == {(RUN_EPOCH, 0, 0, "", "", 0o644)}


def test_source_date_epoch_wins_over_the_run_time(run_dir: Path) -> None:
    assert archive_epoch(run_dir, {}) == RUN_EPOCH
    assert archive_epoch(run_dir, {"SOURCE_DATE_EPOCH": "1000"}) == 1000
    with tarfile.open(pack(run_dir, environ={"SOURCE_DATE_EPOCH": "1000"})) as tar:
        assert {m.mtime for m in tar.getmembers()} == {1000}


def test_pack_refuses_unsealed_or_changed_folders(tmp_path: Path, run_dir: Path) -> None:
    with pytest.raises(ConfigError, match="not sealed"):
        pack(make_run_folder(tmp_path, "raw"), environ={})
    (run_dir / "junit.xml").write_text("<x/>")
    with pytest.raises(VerificationFailed, match="junit.xml"):
        pack(run_dir, environ={})
    with pytest.raises(ConfigError, match="inside"):
        pack(run_dir, run_dir / "self.tar.gz", environ={})


def _evil_tar(path: Path, member: tarfile.TarInfo, data: bytes = b"x") -> Path:
    with tarfile.open(path, "w:gz") as tar:
        ok = tarfile.TarInfo("run/run.json")
        ok.size = 2
        tar.addfile(ok, io.BytesIO(b"{}"))
        member.size = len(data) if member.isreg() else 0
        tar.addfile(member, io.BytesIO(data) if member.isreg() else None)
    return path


def _link(name: str, target: str, kind: bytes) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info


@pytest.mark.parametrize(
    ("member", "why"),
    [
        (tarfile.TarInfo("run/../../outside.txt"), "'..'"),
        (tarfile.TarInfo("/etc/cron.d/evil"), "absolute"),
        (_link("run/escape", "../../../etc/passwd", tarfile.SYMTYPE), "symlink"),
        (_link("run/hard", "/etc/shadow", tarfile.LNKTYPE), "hard link"),
    ],
)
def test_unsafe_members_are_named_and_nothing_is_extracted(tmp_path: Path, member: tarfile.TarInfo, why: str) -> None:
    archive = _evil_tar(tmp_path / "evil.tar.gz", member)
    dest = tmp_path / "dest"
    dest.mkdir()
    with pytest.raises(VerificationFailed) as caught:
        safe_extract(archive, dest)
    assert f"{member.name}: " in str(caught.value) and why in str(caught.value)
    assert list(dest.iterdir()) == []
    assert not (tmp_path / "outside.txt").exists()


def test_verify_names_the_bad_member_of_a_tarball(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    archive = _evil_tar(tmp_path / "evil.tar.gz", _link("run/escape", "/etc", tarfile.SYMTYPE))
    assert main(["verify", str(archive), "--fingerprint", "sha256:" + "1" * 64]) == 1
    assert "run/escape: symlink" in capsys.readouterr().err


def test_non_archive_file_fails_cleanly(tmp_path: Path) -> None:
    junk = tmp_path / "junk.tar.gz"
    junk.write_bytes(gzip.compress(b"not a tar"))
    with pytest.raises(VerificationFailed, match="junk.tar.gz"):
        verify_path(junk, trust.build())


def test_cli_pack_then_verify(run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out.tar.gz"
    assert main(["pack", str(run_dir), "-o", str(out)]) == 0
    assert str(out) in capsys.readouterr().out
    fingerprint = (run_dir / layout.FINGERPRINT).read_text().strip()
    assert main(["verify", str(out), "--fingerprint", fingerprint]) == 0
