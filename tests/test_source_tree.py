"""A cached release tree is checked before every use: an edit in the cache is never run or attested as the wheel.

The wheel here is built like a real one (``sglang/`` plus a ``.dist-info`` whose RECORD lists every
file's urlsafe-base64 sha256) and placed in the cache's wheel folder, so nothing is downloaded.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
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
