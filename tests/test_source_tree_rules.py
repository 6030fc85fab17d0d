"""A release tree's integrity rules one by one, fast: the mutation run's tests of source/tree.py and release.py.

The wheels are built like real ones (``sglang/`` plus a ``.dist-info`` RECORD of urlsafe-base64
sha256s) and placed in the cache's wheel folder; the one thing faked is the registry: ``pip
download`` is replaced by a function that checks its command line and delivers the wheel (or fails
as an unreachable registry does).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from difflab.errors import ConfigError, SourceError
from difflab.matrix import load_matrix
from difflab.matrix.model import Fix, ReleasePin, SidePin
from difflab.source import release as release_mod
from difflab.source import tree
from difflab.source.release import ReleaseSource, sha256_file, unpack_sglang
from matrix_samples import FIX, RELEASES

VERSION = "0.5.21"
WHEEL = f"sglang-{VERSION}-cp311-cp311-manylinux_2_34_x86_64.whl"
DIST = f"sglang-{VERSION}.dist-info"
DECODE = "sglang/srt/disaggregation/decode.py"
FILES = {
    "sglang/__init__.py": "from sglang.version import __version__\n",
    "sglang/version.py": f'__version__ = "{VERSION}"\n',
    DECODE: "def retire(req):\n    req.finished = True  # the fix\n",
}
REVERTED = FILES[DECODE].replace("req.finished = True", "req.finished = 0   ")
"""The fix reverted in as many bytes."""


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def hexof(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def build_wheel(path: Path, files: dict[str, str], record: str | None = None) -> str:
    """A wheel holding ``files``; its RECORD is ``record`` or lists every file. Returns the wheel's sha256."""
    lines = (
        record if record is not None else "".join(f"{n},sha256={b64(t.encode())},{len(t)}\n" for n, t in files.items())
    )
    with zipfile.ZipFile(path, "w") as zf:
        for name, text in files.items():
            zf.writestr(name, text)
        zf.writestr(f"{DIST}/METADATA", f"Metadata-Version: 2.1\nName: sglang\nVersion: {VERSION}\n")
        zf.writestr(f"{DIST}/RECORD", lines + f"{DIST}/METADATA,,\n{DIST}/RECORD,,\n")
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    (tmp_path / "cache" / "wheels").mkdir(parents=True)
    return tmp_path / "cache"


class Registry:
    """``pip download`` as the release back end runs it: the command is recorded, the wheel delivered."""

    def __init__(self, wheel: bytes | None, returncode: int = 0, stderr: str = "") -> None:
        self.wheel, self.returncode, self.stderr = wheel, returncode, stderr
        self.commands: list[list[str]] = []

    def __call__(self, cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        assert kwargs == {"capture_output": True, "text": True}
        self.commands.append(cmd)
        dest = Path(cmd[cmd.index("--dest") + 1])
        if self.wheel is not None:
            (dest / WHEEL).write_bytes(self.wheel)
        return subprocess.CompletedProcess(cmd, self.returncode, "", self.stderr)


def source(cache: Path, said: list[str] | None = None, files: dict[str, str] = FILES) -> ReleaseSource:
    path = cache / "wheels" / WHEEL
    sha = build_wheel(path, files) if not path.exists() else hashlib.sha256(path.read_bytes()).hexdigest()
    sink = said if said is not None else []
    return ReleaseSource({VERSION: ReleasePin(VERSION, WHEEL, sha)}, cache=cache, say=sink.append)


def same_size_edit(path: Path, text: str) -> None:
    """An edit that keeps the size, mode and inode and puts the mtime back: only the kernel's ctime moves."""
    before = path.stat()
    assert len(text.encode()) == before.st_size
    path.parent.chmod(0o755)
    path.chmod(0o644)
    with path.open("r+b") as fh:  # in place: same inode
        fh.write(text.encode())
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    path.chmod(before.st_mode & 0o7777)
    path.parent.chmod(0o555)
    after = path.stat()
    kept = ("st_size", "st_mtime_ns", "st_ino", "st_mode")
    assert [getattr(after, k) for k in kept] == [getattr(before, k) for k in kept]


def settled(src: ReleaseSource) -> Path:
    """Unpacked, then checked once more (a fresh unpack is racy as a whole): no file racy any more."""
    root = src.release(VERSION).root
    ReleaseSource(src.releases, cache=src.cache).release(VERSION)
    manifest = tree.read_manifest(root, src.releases[VERSION].sha256)
    assert manifest is not None and tree.scan(root, manifest.verified_ns)[1] == []
    return root


def expected_signature(root: Path) -> str:
    """The documented signature: every entry's path, type, inode, size, mtime and ctime, sorted."""
    lines = []
    for folder, _dirs, names in os.walk(root / "sglang"):
        for name in names:
            st = os.lstat(os.path.join(folder, name))
            rel = os.path.relpath(os.path.join(folder, name), root)
            lines.append(f"{rel}\0{st.st_mode}\0{st.st_ino}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ctime_ns}\n")
    return hashlib.sha256("".join(sorted(lines)).encode()).hexdigest()


# -- listing, digest, RECORD ---------------------------------------------------------------------------


def test_the_listing_is_sha256sum_lines_sorted_bytewise_and_the_digest_is_its_sha256() -> None:
    hashes = {"sglang/a_b.py": "1" * 64, "sglang/aB.py": "2" * 64, "sglang/Z.py": "3" * 64}
    data = tree.listing(hashes)
    assert data == (f"{'3' * 64}  sglang/Z.py\n{'2' * 64}  sglang/aB.py\n{'1' * 64}  sglang/a_b.py\n").encode()
    assert tree.tree_digest(hashes) == hashlib.sha256(data).hexdigest()
    assert tree.manifest_path(Path("/c/0.5.21-abc")) == Path("/c/0.5.21-abc.tree.json")
    assert tree.listing_path(Path("/c/0.5.21-abc")) == Path("/c/0.5.21-abc.SHA256SUMS")


def test_record_hashes_are_the_package_files_of_the_one_top_level_record(tmp_path: Path) -> None:
    wheel = tmp_path / WHEEL
    record = (
        f"\n{DECODE},sha256={b64(b'x')},1\n"
        f"sglang/version.py,sha256={b64(b'version')}=,7\n"  # padded as some tools write it
        f"{DIST}/METADATA,sha256={b64(b'm')},1\n"
        "sglang-router/x.py,,\n"
    )
    build_wheel(wheel, {DECODE: "x", "sglang/vendored.dist-info/RECORD": "sglang/evil.py,sha256=AAAA,1\n"}, record)
    with zipfile.ZipFile(wheel) as zf:
        assert tree.record_hashes(zf, WHEEL) == {
            DECODE: hashlib.sha256(b"x").hexdigest(),
            "sglang/version.py": hashlib.sha256(b"version").hexdigest(),
        }


@pytest.mark.parametrize(
    ("line", "named"),
    [
        (f"{DECODE}\n", DECODE),
        (f"{DECODE},,\n", DECODE),
        (f"{DECODE},sha256=,1\n", DECODE),
        (f"{DECODE},md5={b64(b'x')},1\n", DECODE),
    ],
    ids=["no-fields", "empty-hash", "empty-value", "other-algorithm"],
)
def test_a_record_row_without_a_sha256_is_refused_by_name(tmp_path: Path, line: str, named: str) -> None:
    wheel = tmp_path / WHEEL
    build_wheel(wheel, {DECODE: "x"}, line)
    with zipfile.ZipFile(wheel) as zf, pytest.raises(SourceError) as caught:
        tree.record_hashes(zf, WHEEL)
    assert str(caught.value) == f"{WHEEL}: RECORD gives no sha256 for {named}"


def test_a_wheel_with_no_record_or_two_is_refused(tmp_path: Path) -> None:
    for extra in ({}, {"other-1.0.dist-info/RECORD": ""}):
        wheel = tmp_path / WHEEL
        with zipfile.ZipFile(wheel, "w") as zf:
            zf.writestr(DECODE, "x")
            for name, text in extra.items():
                zf.writestr(name, text)
            if extra:
                zf.writestr(f"{DIST}/RECORD", "")
        with zipfile.ZipFile(wheel) as zf, pytest.raises(SourceError) as caught:
            tree.record_hashes(zf, WHEEL)
        assert str(caught.value) == f"{WHEEL}: no single .dist-info/RECORD; cannot verify what it unpacks"


# -- extract ---------------------------------------------------------------------------------------------


def test_extract_writes_only_the_package_and_returns_every_file_hash(tmp_path: Path) -> None:
    wheel = tmp_path / WHEEL
    build_wheel(
        wheel, {**FILES, "sglang/srt/": ""}, "".join(f"{n},sha256={b64(t.encode())},1\n" for n, t in FILES.items())
    )
    big = tmp_path / "big"
    with zipfile.ZipFile(wheel) as zf:
        hashes = tree.extract(zf, WHEEL, big)
    assert hashes == {n: hexof(t) for n, t in FILES.items()}
    assert sorted(str(p.relative_to(big)) for p in big.rglob("*") if p.is_file()) == sorted(FILES)
    assert (big / DECODE).read_text() == FILES[DECODE]


def test_a_member_larger_than_one_read_is_written_whole(tmp_path: Path) -> None:
    data = "#" * ((1 << 20) + 17) + "\n"
    wheel = tmp_path / WHEEL
    build_wheel(wheel, {DECODE: data})
    with zipfile.ZipFile(wheel) as zf:
        assert tree.extract(zf, WHEEL, tmp_path / "t") == {DECODE: hexof(data)}
    assert (tmp_path / "t" / DECODE).read_text() == data


@pytest.mark.parametrize("member", ["sglang/../evil.py", "sglang/srt/../../../evil.py", "sglang/srt\\..\\..\\evil.py"])
def test_a_member_leading_out_of_the_tree_is_refused_before_anything_is_written(tmp_path: Path, member: str) -> None:
    wheel = tmp_path / WHEEL
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        build_wheel(wheel, {member: "import os\n", **FILES})
    with zipfile.ZipFile(wheel) as zf, pytest.raises(SourceError) as caught:
        tree.extract(zf, WHEEL, tmp_path / "t" / "x")
    assert str(caught.value) == f"{WHEEL}: unsafe member {member!r}"
    assert not list(tmp_path.rglob("evil.py")) and not (tmp_path / "t").exists()


def test_a_member_that_cannot_be_written_is_named(tmp_path: Path) -> None:
    wheel = tmp_path / WHEEL
    files = {"sglang/srt": "a file", "sglang/srt/x.py": "x"}  # the second needs a folder where a file is
    build_wheel(wheel, files)
    with zipfile.ZipFile(wheel) as zf, pytest.raises(SourceError) as caught:
        tree.extract(zf, WHEEL, tmp_path / "t")
    assert str(caught.value).startswith(f"{WHEEL}: cannot unpack member 'sglang/srt/x.py': ")
    assert caught.value.__cause__ is None and caught.value.__suppress_context__


def test_many_members_unlike_record_are_named_five_then_counted(tmp_path: Path) -> None:
    files = {f"sglang/m{i}.py": f"{i}\n" for i in range(6)}
    record = "".join(f"{n},sha256={b64(b'other')},5\n" for n in files)
    wheel = tmp_path / WHEEL
    build_wheel(wheel, files, record)
    with zipfile.ZipFile(wheel) as zf, pytest.raises(SourceError) as caught:
        tree.extract(zf, WHEEL, tmp_path / "t")
    shown = ", ".join(f"sglang/m{i}.py" for i in range(5))
    assert str(caught.value) == f"{WHEEL}: content does not match its RECORD: {shown} and 1 more; refusing to use it"
    build_wheel(wheel, dict(list(files.items())[:5]), "".join(record.splitlines(keepends=True)[:5]))
    with zipfile.ZipFile(wheel) as zf, pytest.raises(SourceError) as caught:
        tree.extract(zf, WHEEL, tmp_path / "u")
    assert str(caught.value) == f"{WHEEL}: content does not match its RECORD: {shown}; refusing to use it"


def test_a_record_entry_the_wheel_lacks_is_refused_by_name(tmp_path: Path) -> None:
    wheel = tmp_path / WHEEL
    record = "".join(f"{n},sha256={b64(t.encode())},1\n" for n, t in FILES.items())
    build_wheel(wheel, {k: v for k, v in FILES.items() if k != DECODE}, record)
    with zipfile.ZipFile(wheel) as zf, pytest.raises(SourceError) as caught:
        tree.extract(zf, WHEEL, tmp_path / "t")
    assert str(caught.value) == (
        f"{WHEEL}: content does not match its RECORD: {DECODE} (listed in RECORD, not in the wheel); refusing to use it"
    )


# -- walk, scan, signature -----------------------------------------------------------------------------


def test_walk_names_every_non_folder_entry_without_following_links(tmp_path: Path) -> None:
    root = tmp_path / "r"
    (root / "sglang" / "srt").mkdir(parents=True)
    (root / "sglang" / "a.py").write_text("a")
    (root / "sglang" / "srt" / "b.py").write_text("b")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "c.py").write_text("c")
    (root / "sglang" / "linked").symlink_to(tmp_path / "elsewhere")
    found = dict(tree.walk(root))
    assert sorted(found) == ["sglang/a.py", "sglang/linked", "sglang/srt/b.py"]
    assert stat.S_ISLNK(found["sglang/linked"].st_mode) and found["sglang/a.py"].st_size == 1


def test_the_signature_is_the_documented_stat_digest_and_racy_means_ctime_not_older(tmp_path: Path) -> None:
    root = tmp_path / "r"
    (root / "sglang" / "srt").mkdir(parents=True)
    (root / "sglang" / "a.py").write_text("a")
    (root / "sglang" / "srt" / "b.py").write_text("bb")
    digest = tree.signature_digest(root)
    assert digest == expected_signature(root)
    ctime = (root / "sglang" / "a.py").stat().st_ctime_ns
    other = (root / "sglang" / "srt" / "b.py").stat().st_ctime_ns
    signature, racy = tree.scan(root, ctime)
    assert signature == digest
    assert sorted(rel for rel, _ in racy) == sorted(["sglang/a.py"] + (["sglang/srt/b.py"] if other >= ctime else []))
    assert tree.scan(root, max(ctime, other) + 1)[1] == []


def test_filesystem_now_is_the_folders_own_clock_and_leaves_nothing(tmp_path: Path) -> None:
    (tmp_path / "before").touch()
    before = (tmp_path / "before").stat().st_ctime_ns
    now = tree.filesystem_now(tmp_path)
    (tmp_path / "after").touch()
    assert before <= now <= (tmp_path / "after").stat().st_ctime_ns
    assert sorted(p.name for p in tmp_path.iterdir()) == ["after", "before"]
    with pytest.raises(FileNotFoundError):
        tree.filesystem_now(tmp_path / "missing")  # a folder it cannot write in: an OSError, not another folder


def test_make_read_only_sets_files_and_every_folder(tmp_path: Path) -> None:
    root = tmp_path / "r"
    (root / "sglang" / "srt" / "deep").mkdir(parents=True)
    (root / "sglang" / "srt" / "deep" / "x.py").write_text("x")
    tree.make_read_only(root)
    assert (root / "sglang" / "srt" / "deep" / "x.py").stat().st_mode & 0o7777 == 0o444
    for folder in (root / "sglang", root / "sglang" / "srt", root / "sglang" / "srt" / "deep"):
        assert folder.stat().st_mode & 0o7777 == 0o555


# -- record, manifest, listing -------------------------------------------------------------------------


def unpacked(tmp_path: Path) -> tuple[Path, str]:
    wheel = tmp_path / WHEEL
    sha = build_wheel(wheel, FILES)
    root = tmp_path / "cache" / "0.5.21-x"
    digest = unpack_sglang(wheel, root, sha)
    return root, digest


def test_record_writes_the_listing_and_a_manifest_with_a_clock_read_before_the_tree_was_sealed(tmp_path: Path) -> None:
    root, digest = unpacked(tmp_path)
    hashes = {n: hexof(t) for n, t in FILES.items()}
    assert tree.listing_path(root).read_bytes() == tree.listing(hashes)
    assert digest == tree.tree_digest(hashes)
    text = tree.manifest_path(root).read_text()
    doc = json.loads(text)
    assert text == json.dumps(doc, sort_keys=True) + "\n"
    sha = hashlib.sha256((tmp_path / WHEEL).read_bytes()).hexdigest()
    assert {k: v for k, v in doc.items() if k != "verified_ns"} == {
        "schema": 1,
        "wheel_sha256": sha,
        "tree_sha256": digest,
        "signature_sha256": tree.signature_digest(root),
    }
    assert all(st.st_ctime_ns >= doc["verified_ns"] for _rel, st in tree.walk(root))  # every file racy
    assert tree.read_manifest(root, sha) == tree.Manifest(digest, sha, doc["signature_sha256"], doc["verified_ns"])
    assert not any(p.name.startswith(".") for p in root.parent.iterdir())  # no clock file, no partial folder


@pytest.mark.parametrize(
    "change",
    [
        {"schema": 2},
        {"wheel_sha256": "0" * 64},
        {"verified_ns": "12"},
        {"verified_ns": True},
        {"verified_ns": 1.5},
        {"tree_sha256": None, "drop": "tree_sha256"},
        {"signature_sha256": None, "drop": "signature_sha256"},
    ],
    ids=["schema", "other-wheel", "ns-string", "ns-bool", "ns-float", "no-digest", "no-signature"],
)
def test_a_manifest_that_is_not_this_wheels_or_not_well_formed_is_not_used(tmp_path: Path, change: dict) -> None:
    root, _digest = unpacked(tmp_path)
    sha = hashlib.sha256((tmp_path / WHEEL).read_bytes()).hexdigest()
    doc = json.loads(tree.manifest_path(root).read_text())
    change = dict(change)
    drop = change.pop("drop", None)
    doc.update(change)
    if drop:
        del doc[drop]
    tree.manifest_path(root).write_text(json.dumps(doc))
    assert tree.read_manifest(root, sha) is None
    assert tree.check(root, sha) is None


def test_an_old_manifest_without_a_clock_makes_every_file_racy(tmp_path: Path) -> None:
    root, digest = unpacked(tmp_path)
    sha = hashlib.sha256((tmp_path / WHEEL).read_bytes()).hexdigest()
    doc = json.loads(tree.manifest_path(root).read_text())
    del doc["verified_ns"]
    tree.manifest_path(root).write_text(json.dumps(doc))
    assert tree.read_manifest(root, sha) == tree.Manifest(digest, sha, doc["signature_sha256"], 0)
    for text in ("[1, 2]", "{not json", '"a string"'):
        tree.manifest_path(root).write_text(text)
        assert tree.read_manifest(root, sha) is None
    tree.manifest_path(root).unlink()
    assert tree.read_manifest(root, sha) is None


def test_the_listing_is_read_only_when_it_hashes_to_the_digest(tmp_path: Path) -> None:
    root, digest = unpacked(tmp_path)
    assert tree.read_listing(root, digest) == {n: hexof(t) for n, t in FILES.items()}
    assert tree.read_listing(root, "0" * 64) is None
    tree.listing_path(root).unlink()
    assert tree.read_listing(root, digest) is None


# -- check -----------------------------------------------------------------------------------------------


class Hashes:
    """Counts the files the check hashes (the cheap path hashes none)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.paths: list[str] = []
        real = tree.hash_file

        def counted(path: Path) -> str:
            self.paths.append(path.name)
            return real(path)

        monkeypatch.setattr(tree, "hash_file", counted)


def test_a_settled_tree_is_checked_by_its_signature_alone(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = source(cache)
    root = settled(src)
    manifest = tree.manifest_path(root).read_bytes()
    hashes = Hashes(monkeypatch)
    result = tree.check(root, src.releases[VERSION].sha256)
    assert result == tree.TreeCheck(src.release(VERSION).identity["tree_sha256"], ()) and result.intact
    assert hashes.paths == [] and tree.manifest_path(root).read_bytes() == manifest


def test_a_fresh_tree_is_hashed_once_then_its_clock_moves_on(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = source(cache)
    root = src.release(VERSION).root
    sha = src.releases[VERSION].sha256
    first = tree.read_manifest(root, sha)
    assert first is not None
    hashes = Hashes(monkeypatch)
    assert tree.check(root, sha) == tree.TreeCheck(first.digest, ())
    assert sorted(hashes.paths) == sorted(Path(n).name for n in FILES)  # the racy ones, each once
    second = tree.read_manifest(root, sha)
    assert second is not None and second.verified_ns > first.verified_ns and second.signature == first.signature
    hashes.paths.clear()
    assert tree.check(root, sha) == tree.TreeCheck(first.digest, ()) and hashes.paths == []


def test_an_edit_that_keeps_size_and_mtime_is_named_and_the_manifest_is_left_as_it_was(cache: Path) -> None:
    src = source(cache)
    root = settled(src)
    sha = src.releases[VERSION].sha256
    manifest = tree.manifest_path(root).read_bytes()
    same_size_edit(root / DECODE, REVERTED)
    for _ in range(2):  # the second check sees it too: nothing of the changed tree was recorded
        result = tree.check(root, sha)
        assert result is not None and result.changed == (f"{DECODE} (content differs from the wheel)",)
        assert not result.intact and tree.manifest_path(root).read_bytes() == manifest


def test_an_edit_in_the_same_clock_tick_as_the_signature_is_caught_as_racy(cache: Path) -> None:
    """The ctime of an edit made in the tick the signature was taken does not move the signature."""
    src = source(cache)
    root = settled(src)
    sha = src.releases[VERSION].sha256
    same_size_edit(root / DECODE, REVERTED)
    doc = json.loads(tree.manifest_path(root).read_text())
    doc["signature_sha256"] = tree.signature_digest(root)  # as if taken after the edit, in the same tick
    doc["verified_ns"] = (root / DECODE).stat().st_ctime_ns
    tree.manifest_path(root).write_text(json.dumps(doc))
    result = tree.check(root, sha)
    assert result is not None and result.changed == (f"{DECODE} (content differs from the wheel)",)


def test_added_removed_and_linked_files_are_named(cache: Path, tmp_path: Path) -> None:
    src = source(cache)
    root = settled(src)
    sha = src.releases[VERSION].sha256
    for folder in (root / "sglang", (root / DECODE).parent):
        folder.chmod(0o755)
    (root / "sglang" / "evil.py").write_text("import os\n")
    (root / "sglang" / "version.py").unlink()
    (tmp_path / "decode.py").write_text(FILES[DECODE])  # the same bytes, elsewhere
    (root / DECODE).unlink()
    (root / DECODE).symlink_to(tmp_path / "decode.py")
    result = tree.check(root, sha)
    assert result is not None and result.changed == (
        "sglang/evil.py (added)",
        f"{DECODE} (not a regular file)",
        "sglang/version.py (removed)",
    )


def test_a_tree_that_cannot_be_read_is_named(cache: Path) -> None:
    src = source(cache)
    root = settled(src)
    sha = src.releases[VERSION].sha256
    digest = src.release(VERSION).identity["tree_sha256"]
    (root / "sglang").chmod(0o755)
    os.rename(root / "sglang", root / "moved")
    result = tree.check(root, sha)
    assert result == tree.TreeCheck(digest, (f"{root / 'sglang'} (unreadable: No such file or directory)",))


def test_a_file_gone_between_the_scan_and_its_hash_is_named_unreadable(tmp_path: Path) -> None:
    root, _digest = unpacked(tmp_path)
    st = (root / DECODE).stat()
    (root / DECODE).parent.chmod(0o755)
    (root / DECODE).unlink()
    expected = {n: hexof(t) for n, t in FILES.items()}
    assert tree.compare(root, expected, [(DECODE, st)]) == [f"{root / DECODE} (unreadable: No such file or directory)"]
    assert tree.compare(root, expected) == [f"{DECODE} (removed)"]
    assert tree.compare(root, expected, []) == []  # only the racy ones: nothing said of the others


def test_a_signature_that_cannot_be_retaken_is_named(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = source(cache)
    root = src.release(VERSION).root
    sha = src.releases[VERSION].sha256
    digest = src.release(VERSION).identity["tree_sha256"]

    def gone(folder: Path) -> str:
        raise FileNotFoundError(2, "No such file or directory", str(folder / "sglang"))

    monkeypatch.setattr(tree, "signature_digest", gone)
    assert tree.check(root, sha) == tree.TreeCheck(
        digest, (f"{root / 'sglang'} (unreadable: No such file or directory)",)
    )


def test_a_tampered_listing_is_not_trusted_and_the_tree_is_checked_against_the_wheel(cache: Path) -> None:
    src = source(cache)
    root = settled(src)
    sha = src.releases[VERSION].sha256
    same_size_edit(root / DECODE, REVERTED)
    lines = tree.listing_path(root).read_text().replace(hexof(FILES[DECODE]), hexof(REVERTED))
    tree.listing_path(root).write_text(lines)  # agrees with the edit; the manifest's digest does not
    assert tree.check(root, sha) is None  # no usable listing: the caller checks against the wheel
    said: list[str] = []
    again = ReleaseSource(src.releases, cache=cache, say=said.append).release(VERSION)
    assert said == [
        f"release {VERSION}: the cached source {root} no longer matches {WHEEL} "
        f"({DECODE} (content differs from the wheel)); unpacking it again from the verified wheel"
    ]
    assert (root / DECODE).read_text() == FILES[DECODE]
    assert hashlib.sha256(tree.listing_path(root).read_bytes()).hexdigest() == again.identity["tree_sha256"]


# -- the release back end ------------------------------------------------------------------------------


def test_a_release_is_unpacked_into_its_pinned_folder_with_its_identity(cache: Path) -> None:
    src = source(cache)
    pin = src.releases[VERSION]
    got = src.release(VERSION)
    digest = tree.tree_digest({n: hexof(t) for n, t in FILES.items()})
    assert got.root == cache / "sources" / "release" / f"{VERSION}-{pin.sha256[:12]}"
    assert (got.label, got.kind) == (VERSION, "release")
    assert got.identity == {
        "kind": "release",
        "version": VERSION,
        "file": WHEEL,
        "sha256": pin.sha256,
        "tree_sha256": digest,
    }
    assert got.digest == f"sha256:{pin.sha256}+tree:{digest}"
    assert (got.root / DECODE).read_text() == FILES[DECODE]
    assert (cache / "sources" / "release" / f"{VERSION}-{pin.sha256[:12]}.lock").exists()
    assert src.wheel(VERSION) == cache / "wheels" / WHEEL


def test_a_release_is_checked_once_per_back_end(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = source(cache)
    first = src.release(VERSION)
    calls: list[Path] = []
    real = tree.check
    monkeypatch.setattr(tree, "check", lambda root, sha: calls.append(root) or real(root, sha))
    assert src.release(VERSION) == first and calls == []
    assert ReleaseSource(src.releases, cache=cache).release(VERSION) == first and calls == [first.root]


def test_an_unpinned_release_or_a_side_without_one_is_a_configuration_error(cache: Path) -> None:
    src = source(cache)
    for call in (src.release, src.wheel):
        with pytest.raises(ConfigError) as caught:
            call("0.5.99")
        assert str(caught.value) == "release '0.5.99' is not pinned in the matrix [releases] table"
    fix = Fix("38935", 38935, "t", SidePin(commit="a" * 40), SidePin(release=VERSION), ())
    with pytest.raises(ConfigError) as caught:
        src.materialise(fix, "base", fix.base)
    assert str(caught.value) == f"fix '38935': base is not a release pin ({'a' * 12})"
    assert ReleaseSource.pin(fix, "head") == SidePin(release=VERSION) and ReleaseSource.pin(fix, "base") == fix.base
    assert src.materialise(fix, "head", fix.head) == src.release(VERSION)


def test_the_back_end_for_a_matrix_takes_its_pins_and_the_lab_cache(
    cache: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("DIFFLAB_CACHE", str(cache))
    (tmp_path / "m.toml").write_text(RELEASES + FIX)
    matrix = load_matrix(tmp_path / "m.toml")
    src = ReleaseSource.for_matrix(matrix)
    assert src.releases is matrix.releases and src.cache == cache and src.kind == "release"


def test_many_changes_are_named_five_then_counted_and_said_on_stderr(
    cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    files = {**FILES, **{f"sglang/m{i}.py": f"{i}\n" for i in range(6)}}
    path = cache / "wheels" / WHEEL
    sha = build_wheel(path, files)
    pins = {VERSION: ReleasePin(VERSION, WHEEL, sha)}
    root = ReleaseSource(pins, cache=cache).release(VERSION).root
    (root / "sglang").chmod(0o755)
    for i in range(6):
        (root / "sglang" / f"n{i}.py").write_text("x")
    ReleaseSource(pins, cache=cache).release(VERSION)  # the default: said on stderr
    err = capsys.readouterr().err
    shown = ", ".join(f"sglang/n{i}.py (added)" for i in range(5))
    assert err == (
        f"difflab: release {VERSION}: the cached source {root} no longer matches {WHEEL} ({shown} and 1 more); "
        "unpacking it again from the verified wheel\n"
    )
    assert not (root / "sglang" / "n0.py").exists()


def test_a_tree_without_a_manifest_is_adopted_once_or_unpacked_again(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = source(cache)
    root = src.release(VERSION).root
    digest = src.release(VERSION).identity["tree_sha256"]
    tree.manifest_path(root).unlink()
    said: list[str] = []
    assert ReleaseSource(src.releases, cache=cache, say=said.append).release(VERSION).identity["tree_sha256"] == digest
    assert said == [] and tree.read_manifest(root, src.releases[VERSION].sha256) is not None
    inode = (root / DECODE).stat().st_ino
    assert (root / DECODE).stat().st_ino == inode  # adopted, not unpacked again
    tree.manifest_path(root).unlink()
    same_size_edit(root / DECODE, REVERTED)
    ReleaseSource(src.releases, cache=cache, say=said.append).release(VERSION)
    assert len(said) == 1 and f"({DECODE} (content differs from the wheel))" in said[0]
    assert (root / DECODE).read_text() == FILES[DECODE]


def test_a_failed_unpack_leaves_the_tree_refused_until_it_is_repaired(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The wheel is gone and the registry unreachable: the changed tree is never recorded as intact."""
    src = source(cache)
    root = settled(src)
    wheel = cache / "wheels" / WHEEL
    kept = wheel.read_bytes()
    manifest = tree.manifest_path(root).read_bytes()
    same_size_edit(root / DECODE, REVERTED)
    wheel.unlink()
    monkeypatch.setattr(release_mod.subprocess, "run", Registry(None, 1, "ERROR: No matching distribution\n"))
    for _run in range(2):
        said: list[str] = []
        with pytest.raises(SourceError, match="could not download"):
            ReleaseSource(src.releases, cache=cache, say=said.append).release(VERSION)
        assert len(said) == 1 and f"{DECODE} (content differs from the wheel)" in said[0], said
        assert tree.manifest_path(root).read_bytes() == manifest and (root / DECODE).read_text() == REVERTED
    wheel.write_bytes(kept)
    said = []
    ReleaseSource(src.releases, cache=cache, say=said.append).release(VERSION)
    assert len(said) == 1 and (root / DECODE).read_text() == FILES[DECODE]
    said.clear()
    ReleaseSource(src.releases, cache=cache, say=said.append).release(VERSION)
    assert said == []


def test_a_cached_wheel_with_another_hash_is_named_and_not_downloaded_over(cache: Path) -> None:
    src = source(cache)
    pin = src.releases[VERSION]
    path = cache / "wheels" / WHEEL
    path.write_bytes(b"not the wheel that was checked")
    with pytest.raises(SourceError) as caught:
        src.release(VERSION)
    assert str(caught.value) == (
        f"release {VERSION}: the cached wheel {path} has sha256 {hashlib.sha256(path.read_bytes()).hexdigest()}, "
        f"but the matrix pins {pin.sha256}: it changed after it was downloaded and checked; "
        "delete it to download it again"
    )


def test_the_wheel_is_downloaded_by_pip_for_its_own_platform_and_checked(
    cache: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    data_path = tmp_path / WHEEL
    sha = build_wheel(data_path, FILES)
    registry = Registry(data_path.read_bytes())
    monkeypatch.setattr(release_mod.subprocess, "run", registry)
    src = ReleaseSource({VERSION: ReleasePin(VERSION, WHEEL, sha)}, cache=tmp_path / "fresh")
    assert (src.release(VERSION).root / DECODE).read_text() == FILES[DECODE]
    (cmd,) = registry.commands
    dest = cmd[cmd.index("--dest") + 1]
    assert cmd == [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--platform", "manylinux_2_34_x86_64", "--implementation", "cp", "--python-version", "311",
        "--abi", "cp311", "--dest", dest, "--quiet", "--disable-pip-version-check", f"sglang=={VERSION}",
    ]  # fmt: skip
    assert Path(dest).parent == tmp_path / "fresh" / "wheels" and Path(dest).name.startswith(".download-")
    assert sorted(p.name for p in (tmp_path / "fresh" / "wheels").iterdir()) == [WHEEL]  # no download folder left
    assert sha256_file(tmp_path / "fresh" / "wheels" / WHEEL) == sha


def test_a_downloaded_wheel_with_another_hash_is_refused_and_not_kept(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(release_mod.subprocess, "run", Registry(b"a re-uploaded wheel"))
    src = ReleaseSource({VERSION: ReleasePin(VERSION, WHEEL, "0" * 64)}, cache=cache)
    with pytest.raises(SourceError) as caught:
        src.release(VERSION)
    actual = hashlib.sha256(b"a re-uploaded wheel").hexdigest()
    assert (
        str(caught.value)
        == f"release {VERSION}: {WHEEL} has sha256 {actual}, but the matrix pins {'0' * 64}; refusing to use it"
    )
    assert list((cache / "wheels").iterdir()) == [] and not list(cache.glob("sources/release/*/sglang"))


@pytest.mark.parametrize(
    ("registry", "detail"),
    [
        (
            Registry(None, 1, "Looking in indexes\nWARNING: retrying\nERROR: one\nERROR: two\n"),
            "WARNING: retrying | ERROR: one | ERROR: two",
        ),
        (Registry(None, 0, ""), "pip exited 0"),
        (Registry(b"wheel", 1, ""), "pip exited 1"),
    ],
    ids=["stderr", "no-file", "exit"],
)
def test_a_failed_download_names_the_release_and_pips_last_words(
    cache: Path, monkeypatch: pytest.MonkeyPatch, registry: Registry, detail: str
) -> None:
    monkeypatch.setattr(release_mod.subprocess, "run", registry)
    with pytest.raises(SourceError) as caught:
        ReleaseSource({VERSION: ReleasePin(VERSION, WHEEL, "0" * 64)}, cache=cache).wheel(VERSION)
    assert str(caught.value) == f"release {VERSION}: could not download {WHEEL} from the package registry: {detail}"


def test_a_pin_whose_file_is_not_a_wheel_name_is_refused_before_pip_runs(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    registry = Registry(None)
    monkeypatch.setattr(release_mod.subprocess, "run", registry)
    for name in (
        "sglang-0.5.21.tar.gz",
        "sglang-0.5.21-cp311-cp311-linux.whl.zip",
        "sglang-0.5.21-x-cp311-cp311-any.whl",
    ):
        with pytest.raises(ConfigError) as caught:
            ReleaseSource({VERSION: ReleasePin(VERSION, name, "0" * 64)}, cache=cache).wheel(VERSION)
        assert str(caught.value) == f"release {VERSION}: {name!r} is not a wheel file name"
    assert registry.commands == []


def test_sha256_file_reads_past_one_chunk(tmp_path: Path) -> None:
    path = tmp_path / "big"
    path.write_bytes(b"x" * ((1 << 20) * 2 + 3))
    assert sha256_file(path) == hashlib.sha256(path.read_bytes()).hexdigest()


# -- the paths the cheap check takes, and what it records ------------------------------------------------


def make_racy(root: Path, rel: str) -> None:
    """The manifest's clock set to ``rel``'s ctime: that file alone is racy, the signature still agrees."""
    doc = json.loads(tree.manifest_path(root).read_text())
    doc["verified_ns"] = (root / rel).stat().st_ctime_ns
    tree.manifest_path(root).write_text(json.dumps(doc))


def test_while_the_signature_agrees_only_the_racy_files_are_hashed(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = source(cache)
    root = settled(src)
    (root / DECODE).parent.chmod(0o755)
    os.utime(root / DECODE)  # a ctime newer than every other file's
    (root / DECODE).parent.chmod(0o555)
    ReleaseSource(src.releases, cache=cache).release(VERSION)  # recorded: signature agrees again
    make_racy(root, DECODE)
    hashes = Hashes(monkeypatch)
    result = tree.check(root, src.releases[VERSION].sha256)
    assert result is not None and result.intact and hashes.paths == [Path(DECODE).name]


def test_a_file_added_while_the_racy_files_are_hashed_is_named(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Between the check's scan and the rehash's signature: the signature moved, so every file is hashed."""
    src = source(cache)
    root = settled(src)
    make_racy(root, DECODE)
    real = tree.filesystem_now

    def add_then_read_the_clock(folder: Path) -> int:
        if not (root / "sglang" / "evil.py").exists():
            (root / "sglang").chmod(0o755)
            (root / "sglang" / "evil.py").write_text("import os\n")
        return real(folder)

    monkeypatch.setattr(tree, "filesystem_now", add_then_read_the_clock)
    result = tree.check(root, src.releases[VERSION].sha256)
    assert result is not None and result.changed == ("sglang/evil.py (added)",)


def test_the_clock_is_read_in_the_folder_that_holds_the_tree(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folders: list[Path] = []
    real = tree.filesystem_now
    monkeypatch.setattr(tree, "filesystem_now", lambda folder: folders.append(folder) or real(folder))
    src = source(cache)
    root = src.release(VERSION).root  # record()
    ReleaseSource(src.releases, cache=cache).release(VERSION)  # _rehash()
    assert folders == [root.parent, root.parent]


def test_a_cache_that_cannot_be_written_is_checked_by_content_and_its_manifest_left(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = source(cache)
    root = src.release(VERSION).root  # fresh: every file racy
    sha = src.releases[VERSION].sha256
    manifest = tree.manifest_path(root).read_bytes()

    def read_only(folder: Path) -> int:
        raise PermissionError(13, "Permission denied", str(folder))

    monkeypatch.setattr(tree, "filesystem_now", read_only)
    assert tree.check(root, sha) == tree.TreeCheck(src.release(VERSION).identity["tree_sha256"], ())
    assert tree.manifest_path(root).read_bytes() == manifest


def test_an_error_without_a_file_name_names_the_tree(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = source(cache)
    root = src.release(VERSION).root
    sha = src.releases[VERSION].sha256
    digest = src.release(VERSION).identity["tree_sha256"]

    def failing(*_args: object) -> object:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(tree, "signature_digest", failing)  # in the rehash (a fresh tree is racy)
    assert tree.check(root, sha) == tree.TreeCheck(digest, (f"{root} (unreadable: Input/output error)",))
    monkeypatch.setattr(tree, "scan", failing)  # in the first look
    assert tree.check(root, sha) == tree.TreeCheck(digest, (f"{root} (unreadable: Input/output error)",))


def test_a_file_name_that_is_not_utf8_is_named_not_a_crash(cache: Path) -> None:
    src = source(cache)
    root = settled(src)
    (root / "sglang").chmod(0o755)
    fd = os.open(os.path.join(os.fsencode(root / "sglang"), b"\xff.py"), os.O_CREAT | os.O_WRONLY, 0o644)
    os.close(fd)
    result = tree.check(root, src.releases[VERSION].sha256)
    assert result is not None and result.changed == ("sglang/\udcff.py (added)",)


def test_a_record_row_of_name_and_hash_alone_is_read(tmp_path: Path) -> None:
    wheel = tmp_path / WHEEL
    build_wheel(wheel, {DECODE: "x"}, f"{DECODE},sha256={b64(b'x')}\n")
    with zipfile.ZipFile(wheel) as zf:
        assert tree.record_hashes(zf, WHEEL) == {DECODE: hashlib.sha256(b"x").hexdigest()}


def test_a_member_twice_in_the_wheel_is_refused_by_name(tmp_path: Path) -> None:
    import warnings

    wheel = tmp_path / WHEEL
    build_wheel(wheel, FILES)
    with warnings.catch_warnings(), zipfile.ZipFile(wheel, "a") as zf:
        warnings.simplefilter("ignore")  # "Duplicate name": zipfile writes it all the same
        zf.writestr(DECODE, "def retire(req):\n    pass\n")
    with zipfile.ZipFile(wheel) as zf, pytest.raises(SourceError) as caught:
        tree.extract(zf, WHEEL, tmp_path / "t")
    assert str(caught.value) == f"{WHEEL}: member {DECODE!r} is in the wheel more than once; refusing to use it"


def test_a_wheel_without_record_is_named_by_its_file(cache: Path, tmp_path: Path) -> None:
    path = cache / "wheels" / WHEEL
    with zipfile.ZipFile(path, "w") as zf:
        for name, text in FILES.items():
            zf.writestr(name, text)
    pins = {VERSION: ReleasePin(VERSION, WHEEL, sha256_file(path))}
    message = f"{WHEEL}: no single .dist-info/RECORD; cannot verify what it unpacks"
    with pytest.raises(SourceError) as caught:
        ReleaseSource(pins, cache=cache).release(VERSION)  # unpacking it
    assert str(caught.value) == message
    target = cache / "sources" / "release" / f"{VERSION}-{pins[VERSION].sha256[:12]}"
    for name, text in FILES.items():  # a tree unpacked before manifests, beside that wheel
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        (target / name).write_text(text)
    with pytest.raises(SourceError) as caught:
        ReleaseSource(pins, cache=cache).release(VERSION)  # adopting it
    assert str(caught.value) == message


def test_five_changes_are_named_without_a_count(cache: Path) -> None:
    files = {**FILES, **{f"sglang/m{i}.py": f"{i}\n" for i in range(6)}}
    sha = build_wheel(cache / "wheels" / WHEEL, files)
    pins = {VERSION: ReleasePin(VERSION, WHEEL, sha)}
    root = ReleaseSource(pins, cache=cache).release(VERSION).root
    (root / "sglang").chmod(0o755)
    for i in range(5):
        (root / "sglang" / f"n{i}.py").write_text("x")
    said: list[str] = []
    ReleaseSource(pins, cache=cache, say=said.append).release(VERSION)
    shown = ", ".join(f"sglang/n{i}.py (added)" for i in range(5))
    assert said == [
        f"release {VERSION}: the cached source {root} no longer matches {WHEEL} ({shown}); "
        "unpacking it again from the verified wheel"
    ]


def test_a_wheel_is_fetched_into_a_cache_not_made_yet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sha = build_wheel(tmp_path / WHEEL, FILES)
    monkeypatch.setattr(release_mod.subprocess, "run", Registry((tmp_path / WHEEL).read_bytes()))
    src = ReleaseSource({VERSION: ReleasePin(VERSION, WHEEL, sha)}, cache=tmp_path / "new" / "cache")
    assert src.wheel(VERSION) == tmp_path / "new" / "cache" / "wheels" / WHEEL
