"""A cached release tree is checked before every use: an edit in the cache is never run or attested as the wheel.

The wheel here is built like a real one (``sglang/`` plus a ``.dist-info`` whose RECORD lists every
file's urlsafe-base64 sha256) and placed in the cache's wheel folder, so nothing is downloaded.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import subprocess
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from difflab.bundle import statements
from difflab.errors import SourceError
from difflab.matrix.model import ReleasePin
from difflab.runner.base import ProbeJob
from difflab.runner.cache import CachingRunner
from difflab.source import tree
from difflab.source.release import ReleaseSource

VERSION = "0.5.21"
WHEEL = f"sglang-{VERSION}-cp311-cp311-manylinux_2_34_x86_64.whl"
DECODE = "sglang/srt/disaggregation/decode.py"
FILES = {
    "sglang/__init__.py": "from sglang.version import __version__\n",
    "sglang/version.py": f'__version__ = "{VERSION}"\n',
    DECODE: "def retire(req):\n    req.finished = True  # the fix\n",
}


def record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}\n"


def build_wheel(path: Path, files: dict[str, str], record: dict[str, str] | None = None) -> str:
    """A wheel holding ``files``; RECORD lists ``record`` (default: the same files). Returns its sha256."""
    dist = f"sglang-{VERSION}.dist-info"
    lines = "".join(record_line(n, t.encode()) for n, t in (record or files).items())
    with zipfile.ZipFile(path, "w") as zf:
        for name, text in files.items():
            zf.writestr(name, text)
        zf.writestr(f"{dist}/METADATA", f"Metadata-Version: 2.1\nName: sglang\nVersion: {VERSION}\n")
        zf.writestr(f"{dist}/RECORD", lines + f"{dist}/METADATA,,\n{dist}/RECORD,,\n")
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private cache; the registry is unreachable, so any download attempt fails at once."""
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_RETRIES", "0")
    (tmp_path / "cache" / "wheels").mkdir(parents=True)
    return tmp_path / "cache"


def backend(cache: Path, files: dict[str, str] = FILES, said: list[str] | None = None) -> ReleaseSource:
    sha = build_wheel(cache / "wheels" / WHEEL, files) if not (cache / "wheels" / WHEEL).exists() else None
    sha = sha or hashlib.sha256((cache / "wheels" / WHEEL).read_bytes()).hexdigest()
    sink = said if said is not None else []
    return ReleaseSource({VERSION: ReleasePin(VERSION, WHEEL, sha)}, cache=cache, say=sink.append)


def edit(path: Path, text: str) -> None:
    """What someone reverting the fix in the cache does: make it writable, change it."""
    path.parent.chmod(0o755)
    path.chmod(0o644)
    path.write_text(text)


def test_an_edited_file_in_the_cached_tree_is_named_and_unpacked_again(cache: Path) -> None:
    first = backend(cache).release(VERSION)
    edit(first.root / DECODE, "def retire(req):\n    pass  # fix reverted\n")
    said: list[str] = []
    again = backend(cache, said=said).release(VERSION)  # a later run
    assert (again.root / DECODE).read_text() == FILES[DECODE]
    assert again.identity == first.identity and again.digest == first.digest
    assert len(said) == 1 and f"{DECODE} (content differs from the wheel)" in said[0], said
    assert "unpacking it again from the verified wheel" in said[0]


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (lambda root: (root / "sglang" / "srt" / "evil.py").write_text("import os\n"), "sglang/srt/evil.py (added)"),
        (lambda root: (root / "sglang" / "version.py").unlink(), "sglang/version.py (removed)"),
    ],
    ids=["added", "removed"],
)
def test_added_and_removed_files_are_named(cache: Path, change, named: str) -> None:
    root = backend(cache).release(VERSION).root
    for folder in (root / "sglang", root / "sglang" / "srt"):
        folder.chmod(0o755)
    change(root)
    said: list[str] = []
    backend(cache, said=said).release(VERSION)
    assert said and named in said[0], said
    assert sorted(rel for rel, _ in tree.walk(root)) == sorted(FILES)


def test_the_tree_is_read_only_and_a_touch_is_not_a_change(cache: Path) -> None:
    root = backend(cache).release(VERSION).root
    assert (root / DECODE).stat().st_mode & 0o777 == 0o444
    assert (root / "sglang").stat().st_mode & 0o777 == 0o555
    os.utime(root / DECODE, (1, 1))  # signature moves, content does not
    said: list[str] = []
    backend(cache, said=said).release(VERSION)
    assert said == []
    manifest = json.loads(tree.manifest_path(root).read_text())
    assert manifest["signature_sha256"] == tree.signature_digest(root)  # the new signature is kept


def test_the_tree_digest_is_the_sha256sum_listing_and_part_of_the_identity(cache: Path) -> None:
    src = backend(cache).release(VERSION)
    subprocess.run(["sha256sum", "--quiet", "-c", str(tree.listing_path(src.root))], cwd=src.root, check=True)
    listing = subprocess.run(
        "find sglang -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum",
        shell=True,
        cwd=src.root,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()[0]
    assert src.identity["tree_sha256"] == listing
    assert listing in src.digest  # the result cache key's source part


def test_the_tree_digest_keys_the_result_cache_and_is_an_attested_subject(cache: Path) -> None:
    src = backend(cache).release(VERSION)
    job = ProbeJob("38935", "p", "head", src, Path(__file__))
    env = SimpleNamespace(digest="env")
    runner = CachingRunner(inner=SimpleNamespace(name="warm"), environment=env)  # type: ignore[arg-type]
    parts = runner.key_parts(job, {"harness": "", "child": ""})
    assert src.identity["tree_sha256"] in parts["source"]
    subjects = statements.source_subjects(src.identity)
    assert {"sha256": src.identity["sha256"]} in [s["digest"] for s in subjects]
    assert {"sha256": src.identity["tree_sha256"]} in [s["digest"] for s in subjects]


def test_a_tree_unpacked_before_manifests_is_checked_against_the_wheel_once(cache: Path) -> None:
    root = backend(cache).release(VERSION).root
    tree.manifest_path(root).unlink()
    edit(root / DECODE, "tampered\n")
    said: list[str] = []
    backend(cache, said=said).release(VERSION)
    assert said and f"{DECODE} (content differs from the wheel)" in said[0]
    assert tree.manifest_path(root).is_file()


def test_a_wheel_whose_content_does_not_match_its_record_is_refused(cache: Path) -> None:
    build_wheel(cache / "wheels" / WHEEL, {**FILES, DECODE: "patched\n"}, record=FILES)
    with pytest.raises(SourceError, match=f"does not match its RECORD: {DECODE}"):
        backend(cache).release(VERSION)
    assert not any((cache / "sources").glob("**/*.py"))  # nothing half-unpacked is left to be used


def test_a_cached_wheel_with_the_wrong_hash_is_named_as_such(cache: Path) -> None:
    good = backend(cache)
    (cache / "wheels" / WHEEL).write_bytes(b"not the wheel that was checked")
    with pytest.raises(SourceError) as caught:
        good.release(VERSION)
    message = str(caught.value)
    assert f"the cached wheel {cache / 'wheels' / WHEEL} has sha256" in message
    assert "could not download" not in message


def same_size_edit(path: Path, text: str) -> None:
    """An edit that keeps the file's size, mode and inode and puts its mtime back: only the ctime moves.

    The ctime is the kernel's: nobody can set it back.
    """
    before = path.stat()
    assert len(text.encode()) == before.st_size
    edit(path, text)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    path.chmod(before.st_mode & 0o7777)
    path.parent.chmod(0o555)
    after = path.stat()
    kept = ("st_size", "st_mtime_ns", "st_ino", "st_mode")
    assert [getattr(after, k) for k in kept] == [getattr(before, k) for k in kept]


REVERTED = FILES[DECODE].replace("req.finished = True", "req.finished = 0   ")
"""The fix reverted in as many bytes."""


def test_an_edit_that_keeps_the_size_and_the_mtime_is_caught(cache: Path) -> None:
    root = backend(cache).release(VERSION).root
    backend(cache).release(VERSION)  # a later run: the fresh tree hashed once more, no file racy now
    same_size_edit(root / DECODE, REVERTED)
    said: list[str] = []
    backend(cache, said=said).release(VERSION)
    assert len(said) == 1 and f"{DECODE} (content differs from the wheel)" in said[0], said
    assert (root / DECODE).read_text() == FILES[DECODE]


def test_an_edit_between_the_hashing_and_the_signature_of_an_unpack_is_caught(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The signature is taken after the tree is made read-only; an edit just before, in the same clock tick."""
    real = tree.make_read_only

    def edit_then_make_read_only(root: Path) -> None:
        same_size_edit(root / DECODE, REVERTED)
        real(root)

    monkeypatch.setattr(tree, "make_read_only", edit_then_make_read_only)
    root = backend(cache).release(VERSION).root
    monkeypatch.setattr(tree, "make_read_only", real)
    said: list[str] = []
    backend(cache, said=said).release(VERSION)  # the next run
    assert len(said) == 1 and f"{DECODE} (content differs from the wheel)" in said[0], said
    assert (root / DECODE).read_text() == FILES[DECODE]


def test_an_edit_while_the_tree_is_being_hashed_is_caught_by_the_next_check(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = backend(cache).release(VERSION).root
    backend(cache).release(VERSION)
    os.utime(root / "sglang" / "version.py")  # the signature moves: the next check hashes every file
    real = tree.hash_file

    def hash_then_edit(path: Path) -> str:
        digest = real(path)
        if path == root / DECODE and path.read_text() == FILES[DECODE]:
            same_size_edit(path, REVERTED)  # just after its hash was taken
        return digest

    monkeypatch.setattr(tree, "hash_file", hash_then_edit)
    said: list[str] = []
    backend(cache, said=said).release(VERSION)
    assert said == []  # this check hashed it before the edit
    monkeypatch.setattr(tree, "hash_file", real)
    backend(cache, said=said).release(VERSION)  # the next run
    assert len(said) == 1 and f"{DECODE} (content differs from the wheel)" in said[0], said
    assert (root / DECODE).read_text() == FILES[DECODE]


def test_a_file_added_while_a_racy_tree_is_rehashed_is_named(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fresh unpack is racy as a whole; a file added between the check's two looks is not let in."""
    root = backend(cache).release(VERSION).root
    real = tree.filesystem_now

    added: list[Path] = []

    def add_then_read_the_clock(folder: Path) -> int:
        if not added:  # once: the unpack that repairs the tree reads the clock too
            (root / "sglang" / "srt").chmod(0o755)
            added.append(root / "sglang" / "srt" / "evil.py")
            added[0].write_text("import os\n")
        return real(folder)

    monkeypatch.setattr(tree, "filesystem_now", add_then_read_the_clock)
    said: list[str] = []
    backend(cache, said=said).release(VERSION)
    assert len(said) == 1 and "sglang/srt/evil.py (added)" in said[0], said
    assert not (root / "sglang" / "srt" / "evil.py").exists()


def test_a_cache_that_cannot_be_written_is_checked_by_content_and_left_as_it_is(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = backend(cache).release(VERSION)  # fresh: every file racy
    root, wheel_sha256 = src.root, src.identity["sha256"]
    manifest = tree.manifest_path(root).read_bytes()

    def read_only(folder: Path) -> int:
        raise PermissionError(13, "Permission denied", str(folder))

    monkeypatch.setattr(tree, "filesystem_now", read_only)
    assert tree.check(root, wheel_sha256) == tree.TreeCheck(src.identity["tree_sha256"], ())
    assert tree.manifest_path(root).read_bytes() == manifest  # nothing recorded: checked by content again
    same_size_edit(root / DECODE, REVERTED)
    result = tree.check(root, wheel_sha256)
    assert result is not None and result.changed == (f"{DECODE} (content differs from the wheel)",)


def test_a_failed_unpack_leaves_the_changed_tree_refused_at_every_later_use(cache: Path) -> None:
    root = backend(cache).release(VERSION).root
    wheel = cache / "wheels" / WHEEL
    kept = wheel.read_bytes()
    same_size_edit(root / DECODE, REVERTED)
    wheel.unlink()  # the wheel is gone and the registry unreachable: the tree cannot be unpacked again
    pinned = ReleasePin(VERSION, WHEEL, hashlib.sha256(kept).hexdigest())
    for _run in range(2):
        said: list[str] = []
        with pytest.raises(SourceError, match="could not download"):
            ReleaseSource({VERSION: pinned}, cache=cache, say=said.append).release(VERSION)
        assert len(said) == 1 and f"{DECODE} (content differs from the wheel)" in said[0], said
    wheel.write_bytes(kept)
    said = []
    ReleaseSource({VERSION: pinned}, cache=cache, say=said.append).release(VERSION)
    assert len(said) == 1 and (root / DECODE).read_text() == FILES[DECODE]


def _relist(root: Path, rel: str, text: str) -> None:
    """Rewrite the listing so that it agrees with an edited file (the manifest's digest does not)."""
    path = tree.listing_path(root)
    lines = path.read_text().splitlines(keepends=True)
    digest = hashlib.sha256(text.encode()).hexdigest()
    path.write_text("".join(f"{digest}  {rel}\n" if line.endswith(f"  {rel}\n") else line for line in lines))


def test_a_listing_edited_to_agree_with_an_edited_file_is_not_trusted(cache: Path) -> None:
    root = backend(cache).release(VERSION).root
    same_size_edit(root / DECODE, REVERTED)
    _relist(root, DECODE, REVERTED)
    said: list[str] = []
    again = backend(cache, said=said).release(VERSION)
    assert len(said) == 1 and f"{DECODE} (content differs from the wheel)" in said[0], said
    assert (root / DECODE).read_text() == FILES[DECODE]
    assert hashlib.sha256(tree.listing_path(root).read_bytes()).hexdigest() == again.identity["tree_sha256"]


def test_a_symlink_in_place_of_a_listed_file_is_named(cache: Path, tmp_path: Path) -> None:
    root = backend(cache).release(VERSION).root
    (tmp_path / "decode.py").write_text(FILES[DECODE])  # the same bytes, elsewhere
    (root / DECODE).parent.chmod(0o755)
    (root / DECODE).unlink()
    (root / DECODE).symlink_to(tmp_path / "decode.py")
    said: list[str] = []
    backend(cache, said=said).release(VERSION)
    assert len(said) == 1 and f"{DECODE} (not a regular file)" in said[0], said
    assert not (root / DECODE).is_symlink() and (root / DECODE).read_text() == FILES[DECODE]


def test_a_record_entry_the_wheel_lacks_and_a_file_record_does_not_list_are_refused(cache: Path) -> None:
    lacking = {k: v for k, v in FILES.items() if k != "sglang/version.py"}
    build_wheel(cache / "wheels" / WHEEL, lacking, record=FILES)
    with pytest.raises(SourceError, match=r"sglang/version.py \(listed in RECORD, not in the wheel\)"):
        backend(cache).release(VERSION)
    build_wheel(cache / "wheels" / WHEEL, {**FILES, "sglang/srt/extra.py": "import os\n"}, record=FILES)
    with pytest.raises(SourceError, match="does not match its RECORD: sglang/srt/extra.py"):
        backend(cache).release(VERSION)
    assert not any((cache / "sources").glob("**/*.py"))


@pytest.mark.parametrize(
    "member",
    ["sglang/../evil.py", "sglang/srt/../../../../evil.py", "sglang/srt/..\\..\\evil.py"],
    ids=["parent", "deep-parent", "backslash"],
)
def test_a_member_name_leading_out_of_the_tree_is_refused(cache: Path, member: str) -> None:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile itself lets such names be written
        build_wheel(cache / "wheels" / WHEEL, {**FILES, member: "import os\n"})
    with pytest.raises(SourceError, match=f"unsafe member {re.escape(repr(member))}"):
        backend(cache).release(VERSION)
    assert not list(cache.parent.rglob("evil.py")) and not any((cache / "sources").glob("**/*.py"))


def test_a_member_twice_in_the_wheel_is_refused_by_name(cache: Path) -> None:
    path = cache / "wheels" / WHEEL
    build_wheel(path, FILES)
    import warnings

    with warnings.catch_warnings(), zipfile.ZipFile(path, "a") as zf:
        warnings.simplefilter("ignore")  # "Duplicate name": zipfile writes it all the same
        zf.writestr(DECODE, "def retire(req):\n    pass\n")
    with pytest.raises(SourceError, match=f"{DECODE!r} is in the wheel more than once"):
        backend(cache).release(VERSION)
    assert not any((cache / "sources").glob("**/*.py"))


# -- git worktrees: the same check, by git ---------------------------------------------------------------


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> tuple[Path, str]:
    """A repository shaped like SGLang's: the package under ``python/``."""
    root = tmp_path / "sglang-repo"
    for name, text in FILES.items():
        (root / "python" / name).parent.mkdir(parents=True, exist_ok=True)
        (root / "python" / name).write_text(text)
    _git(root.parent, "init", "-q", "-b", "main", str(root))
    _git(root, "add", "-A")
    _git(root, "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qm", "release")
    return root, _git(root, "rev-parse", "HEAD")


def test_an_edited_or_added_file_in_a_cached_worktree_is_named_and_checked_out_again(
    repo: tuple[Path, str], tmp_path: Path
) -> None:
    from difflab.source.git import GitSource

    path, sha = repo
    first = GitSource(str(path), cache=tmp_path / "cache").rev(sha)
    (first.root / DECODE).write_text("def retire(req):\n    pass  # fix reverted\n")
    (first.root / "sglang" / "sitecustomize.py").write_text("import os\n")
    said: list[str] = []
    again = GitSource(str(path), cache=tmp_path / "cache", say=said.append).rev(sha)
    assert (again.root / DECODE).read_text() == FILES[DECODE]
    assert not (again.root / "sglang" / "sitecustomize.py").exists()
    assert again.identity == first.identity
    assert len(said) == 1, said
    assert "python/sglang/sitecustomize.py (added)" in said[0] and f"python/{DECODE} (content differs" in said[0]
    said.clear()
    GitSource(str(path), cache=tmp_path / "cache", say=said.append).rev(sha)
    assert said == []  # intact now: used as is
