"""The Docker image the docker runner runs probes in, built without any image registry.

The image *is* the shared CPU environment: the venv (at ``/opt/difflab/env``),
the Python installation it was created from (at its own absolute path: the
venv's interpreter finds ``libpython`` and the standard library there), and
the few host shared libraries those need, found with ``ldd`` (glibc,
libstdc++, libssl, ...). Nothing is downloaded: the root filesystem is
streamed as a tar straight into ``docker import``. Copying the host's own
library files (rather than a debootstrapped distribution's) means the
interpreter meets exactly the ABI it was built against, and the build works
offline; ``verify_image`` then proves that every module the host environment
can import, the image can import too.

Images are labelled with the environment digest and reused: a second build
for the same environment is a label lookup. ``ci/Dockerfile`` builds an
equivalent image on engines that can pull ``python:3.11-slim`` (same labels).
"""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from difflab.environment.shared import SharedEnvironment
from difflab.errors import EnvironmentSetupError
from difflab.paths import cache_root

REPOSITORY = "difflab/cpu-env"
IMAGE_SCHEMA = "1"
"""Bumped when the image layout the runner relies on changes (paths, labels)."""
RECIPE = "host-rootfs-2"
"""Bumped when what goes into the root filesystem changes; part of the reuse key."""
ENV_IN_IMAGE = "/opt/difflab/env"
LABEL = "org.difflab"

Say = Callable[[str], None]

# What the probes never need. Measured on the cpu env: torch/test 83 MB of C++ test
# binaries, torch/include 62 MB of headers (only for compiling extensions), torch/bin
# test binaries 45 MB; the stdlib's own test suite 123 MB, its static libpython 44 MB.
ENV_EXCLUDE = (
    "lib/python3.*/site-packages/torch/test",
    "lib/python3.*/site-packages/torch/include",
    "lib/python3.*/site-packages/torch/bin/test_*",
    "lib/python3.*/site-packages/torch/bin/*Test",
    "lib/python3.*/site-packages/torch/bin/protoc*",
    "*/__pycache__/*.opt-1.pyc",
    "*/__pycache__/*.opt-2.pyc",
)
BASE_EXCLUDE = (
    "bin/*",
    "include",
    "share",
    "lib/pkgconfig",
    "lib/*.a",
    "lib/python3.*/site-packages/*",
    "lib/python3.*/test",
    "lib/python3.*/idlelib",
    "lib/python3.*/tkinter",
    "lib/python3.*/turtledemo",
    "lib/python3.*/ensurepip",
    "lib/python3.*/lib2to3/tests",
    "lib/python3.*/config-3.*",
    "lib/python3.*/lib-dynload/_tkinter*",
    "*/__pycache__/*.opt-1.pyc",
    "*/__pycache__/*.opt-2.pyc",
)
BASE_KEEP = ("bin/python", "bin/python3", "bin/python3.*[0-9]")
"""Exceptions to ``BASE_EXCLUDE``: the interpreter itself, not pip, idle, 2to3 or other tools."""

HOST_TOOLS = ("/bin/sh", "/sbin/ldconfig")
"""``sh`` for ``subprocess(shell=True)``; ``ldconfig -p`` is how ``ctypes.util.find_library`` looks."""
DLOPENED = ("libgcc_s.so.1",)
"""Loaded by glibc at run time (thread cancellation, unwinding), so ``ldd`` does not list it."""

SMOKE_MODULES = (
    "ssl",
    "sqlite3",
    "ctypes",
    "lzma",
    "bz2",
    "zlib",
    "hashlib",
    "decimal",
    "uuid",
    "multiprocessing",
    "numpy",
    "torch",
    "zmq",
    "PIL.Image",
    "tokenizers",
    "sentencepiece",
    "pydantic",
    "orjson",
    "msgspec",
    "psutil",
    "setproctitle",
    "pybase64",
    "aiohttp",
    "uvicorn",
    "fastapi",
    "yaml",
    "regex",
    "safetensors",
    "xgrammar",
    "tvm_ffi",
    "transformers",
    "openai",
    "einops",
    "gguf",
    "compressed_tensors",
)
"""Imported once in the host environment and once in the image: the two must fail alike."""

_SMOKE = """
import importlib, json, sys
out = {}
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
        out[name] = "ok"
    except BaseException as exc:
        text = str(exc).splitlines()[0][:200] if str(exc) else ""
        out[name] = type(exc).__name__ + (": " + text if text else "")
import torch
out["torch.sum"] = float(torch.arange(4.0).sum())
print("DIFFLAB-SMOKE " + json.dumps(out, sort_keys=True))
"""


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


# -- the root filesystem ----------------------------------------------------------------


@dataclass
class PythonInstall:
    """What the environment's interpreter says about itself (run, not guessed)."""

    base_prefix: Path
    version: str
    xy: str

    @classmethod
    def of(cls, python: Path) -> PythonInstall:
        code = (
            "import json, platform, sys; print(json.dumps({'base_prefix': sys.base_prefix, "
            "'version': platform.python_version(), 'xy': '%d.%d' % sys.version_info[:2]}))"
        )
        proc = subprocess.run([str(python), "-c", code], capture_output=True, text=True)
        if proc.returncode != 0:
            raise EnvironmentSetupError(f"cannot run the environment's interpreter {python}: {proc.stderr.strip()}")
        data = json.loads(proc.stdout)
        return cls(Path(data["base_prefix"]), data["version"], data["xy"])


@dataclass
class RootfsStats:
    files: int = 0
    bytes: int = 0
    host_libraries: list[str] = field(default_factory=list)
    unresolved: list[str] = field(default_factory=list)
    """Names ``ldd`` could not resolve on the host either (loaded at run time by their package)."""
    seconds: float = 0.0


def _matches(rel: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatchcase(rel, p) for p in patterns)


@dataclass
class Tree:
    """A host folder that goes into the image at ``dest``, minus what ``exclude`` names."""

    src: Path
    dest: str
    exclude: tuple[str, ...] = ()
    keep: tuple[str, ...] = ()
    fixed_mtime: bool = False
    """For files written at build time (the staged /etc, copies' folders): a reproducible tar."""

    def wanted(self, rel: str) -> bool:
        return not _matches(rel, self.exclude) or _matches(rel, self.keep)

    def walk(self) -> Iterator[tuple[Path, str]]:
        """(host path, path relative to the tree) for everything kept, parents before children."""
        for top, dirs, files in os.walk(self.src):
            dirs.sort()
            rel_top = os.path.relpath(top, self.src)
            rel_top = "" if rel_top == "." else rel_top
            kept_dirs = []
            for name in dirs:
                rel = f"{rel_top}/{name}" if rel_top else name
                if self.wanted(rel):
                    kept_dirs.append(name)
                    yield Path(top, name), rel
            dirs[:] = kept_dirs
            for name in sorted(files):
                rel = f"{rel_top}/{name}" if rel_top else name
                if self.wanted(rel):
                    yield Path(top, name), rel


def _is_elf(path: Path) -> bool:
    try:
        with path.open("rb") as fh:
            return fh.read(4) == b"\x7fELF"
    except OSError:
        return False


def ldd(paths: list[Path]) -> tuple[set[str], list[str]]:
    """Host libraries (absolute paths) the ELF files need, and the names no one could resolve."""
    found: set[str] = set()
    missing: list[str] = []
    for path in paths:
        proc = subprocess.run(["ldd", str(path)], capture_output=True, text=True)
        if proc.returncode != 0:  # "not a dynamic executable": a static binary
            continue
        for line in proc.stdout.splitlines():
            line = line.strip()
            if "=>" in line:
                name, _, target = line.partition("=>")
                target = target.strip().split(" (", 1)[0].strip()
                if target == "not found":
                    missing.append(f"{path.name}: {name.strip()}")
                elif target.startswith("/"):
                    found.add(target)
            elif line.startswith("/"):  # the ELF interpreter
                found.add(line.split(" (", 1)[0])
    return found, missing


def _beside(libs: set[str], soname: str) -> str | None:
    """``soname`` from the folder the other libraries came from (for libraries glibc loads itself)."""
    for folder in sorted({os.path.dirname(p) for p in libs}):
        candidate = os.path.join(folder, soname)
        if os.path.exists(candidate):
            return candidate
    return None


class Stage:
    """A small folder holding the host files the image needs (libraries, tools, /etc)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.added: set[str] = set()

    def _place(self, path: str) -> Path:
        return self.root / path.lstrip("/")

    def add_host_path(self, path: str, depth: int = 0) -> None:
        """Copy ``path`` with the symlinks on its way (``/lib`` → ``usr/lib``, soname links)."""
        if path in self.added or depth > 16:
            return
        self.added.add(path)
        parts = PurePosixPath(path).parts
        for i in range(2, len(parts)):  # directory symlinks on the way, e.g. /lib -> usr/lib
            ancestor = str(PurePosixPath(*parts[:i]))
            if os.path.islink(ancestor):
                self._symlink(ancestor, os.readlink(ancestor))
        real_dir = os.path.realpath(os.path.dirname(path))
        placed = f"{real_dir}/{os.path.basename(path)}"
        if os.path.islink(path):
            target = os.readlink(path)
            self._symlink(placed, target)
            self.add_host_path(os.path.normpath(os.path.join(real_dir, target)), depth + 1)
        elif os.path.isfile(path):
            dest = self._place(placed)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, dest)

    def _symlink(self, at: str, target: str) -> None:
        dest = self._place(at)
        if dest.is_symlink() or dest.exists():
            return
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.symlink_to(target)

    def write(self, path: str, text: str, mode: int = 0o644) -> None:
        dest = self._place(path)
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(text)
        dest.chmod(mode)

    def etc(self) -> None:
        """Just enough for ``getpwuid``, ``getpass`` and name lookups of localhost."""
        self.write(
            "/etc/passwd", "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
        )
        self.write("/etc/group", "root:x:0:\nnogroup:x:65534:\n")
        self.write("/etc/nsswitch.conf", "passwd: files\ngroup: files\nhosts: files\n")
        self.write("/etc/hosts", "127.0.0.1 localhost\n::1 localhost\n")
        tmp = self._place("/tmp")
        tmp.mkdir(exist_ok=True)
        tmp.chmod(0o1777)

    def ld_cache(self) -> bool:
        """``/etc/ld.so.cache`` for the staged libraries (``ldconfig -r`` needs root; else skipped)."""
        dirs = sorted({os.path.dirname(p) for p in self.added if ".so" in os.path.basename(p)})
        real = sorted({os.path.realpath(d) for d in dirs})
        self.write("/etc/ld.so.conf", "".join(f"{d}\n" for d in real))
        if os.geteuid() != 0 or not shutil.which("ldconfig"):
            return False
        proc = subprocess.run(["ldconfig", "-r", str(self.root)], capture_output=True, text=True)
        return proc.returncode == 0


class _Hashing(io.RawIOBase):
    """A write-only file object that forwards to ``sink`` and counts/hashes what passes."""

    def __init__(self, sink: Any) -> None:
        self.sink = sink
        self.sha256 = hashlib.sha256()
        self.count = 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self.sink.write(view)
        self.sha256.update(view)
        self.count += len(view)
        return len(view)


@dataclass
class Rootfs:
    """The plan for one image's root filesystem: trees from the host plus a staged folder."""

    env_path: Path
    python: PythonInstall
    trees: list[Tree] = field(default_factory=list)

    @classmethod
    def for_environment(cls, env_path: Path) -> Rootfs:
        python = PythonInstall.of(env_path / "bin" / "python")
        trees = [
            Tree(python.base_prefix, str(python.base_prefix), BASE_EXCLUDE, BASE_KEEP),
            Tree(env_path, ENV_IN_IMAGE, ENV_EXCLUDE),
        ]
        return cls(env_path=env_path, python=python, trees=trees)

    def elf_files(self) -> list[Path]:
        out = []
        for tree in self.trees:
            for path, rel in tree.walk():
                name = path.name
                if path.is_symlink() or not path.is_file():
                    continue
                if (".so" in name or "/bin/" in f"/{rel}") and _is_elf(path):
                    out.append(path)
        return out

    def stage(self, into: Path, stats: RootfsStats) -> Stage:
        """Host libraries by ``ldd`` closure, a shell, ``ldconfig``, /etc files."""
        stage = Stage(into)
        inside = tuple(str(t.src) + "/" for t in self.trees)
        tools = [t for t in HOST_TOOLS if os.path.exists(t)]
        libs, missing = ldd(self.elf_files() + [Path(os.path.realpath(t)) for t in tools])
        for soname in DLOPENED:
            found = _beside(libs, soname)
            if found:
                libs.add(found)
        needed = sorted(p for p in libs if not p.startswith(inside))
        for path in needed + tools:
            stage.add_host_path(path)
        stage.etc()
        stage.ld_cache()
        stats.host_libraries = needed
        # e.g. xgrammar's bindings → libtvm_ffi.so, which tvm_ffi loads first: the same on the
        # host, so the smoke test (which imports xgrammar on both sides) decides.
        stats.unresolved = sorted(missing)
        return stage

    def write_tar(self, fileobj: Any, stats: RootfsStats) -> str:
        """Write the whole root filesystem as an uncompressed tar to ``fileobj``; its sha256."""
        started = time.perf_counter()
        hashing = _Hashing(fileobj)
        with tempfile.TemporaryDirectory(prefix="difflab-rootfs-") as tmp:
            stage = self.stage(Path(tmp), stats)
            trees = [Tree(stage.root, "/", fixed_mtime=True), *self.trees]
            with tarfile.open(fileobj=hashing, mode="w|", format=tarfile.PAX_FORMAT) as tar:
                parents_done: set[str] = set()
                for tree in trees:
                    dest = tree.dest.strip("/")
                    self._parents(tar, dest, parents_done)
                    if dest:
                        tar.addfile(self._normalise(tar.gettarinfo(str(tree.src), dest)))
                    for path, rel in tree.walk():
                        arc = f"{dest}/{rel}" if dest else rel
                        info = self._normalise(tar.gettarinfo(str(path), arc))
                        if tree.fixed_mtime:
                            info.mtime = 0
                        if info.isreg():
                            with path.open("rb") as fh:
                                tar.addfile(info, fh)
                            stats.bytes += info.size
                        else:
                            tar.addfile(info)
                        stats.files += 1
        stats.seconds = time.perf_counter() - started
        return hashing.sha256.hexdigest()

    @staticmethod
    def _parents(tar: tarfile.TarFile, dest: str, done: set[str]) -> None:
        parts = PurePosixPath(dest).parts if dest else ()
        for i in range(1, len(parts)):
            parent = "/".join(parts[:i])
            if parent in done:
                continue
            done.add(parent)
            info = tarfile.TarInfo(parent)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, 0
            tar.addfile(info)

    @staticmethod
    def _normalise(info: tarfile.TarInfo) -> tarfile.TarInfo:
        """Owned by root and readable by anyone (the probe may run as the caller's uid).

        Modification times are kept: the ``.pyc`` files are validated against them, and
        without valid ``.pyc`` files every probe would recompile torch (seconds each).
        """
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        if info.isdir():
            info.mode = (info.mode | 0o755) & 0o7777
        elif info.isreg():
            info.mode = (info.mode | 0o444 | (0o111 if info.mode & 0o100 else 0)) & 0o7777
        return info


# -- building and importing ---------------------------------------------------------------


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


def smoke_results(output: str) -> dict[str, Any]:
    for line in output.splitlines():
        if line.startswith("DIFFLAB-SMOKE "):
            return dict(json.loads(line[len("DIFFLAB-SMOKE ") :]))
    raise EnvironmentSetupError(f"smoke test printed no result:\n{output[-2000:]}")


def verify_image(client: Any, image: DifflabImage, env: SharedEnvironment | None = None) -> dict[str, Any]:
    """Import the same modules in the image as in the host environment; every difference is fatal.

    The host side runs at the same time as the container (each is one busy core for ~15 s).
    """
    import docker.errors

    quiet = {"PYTHONDONTWRITEBYTECODE": "1", "CUDA_VISIBLE_DEVICES": ""}
    host_proc = None
    if env is not None and env.ready:
        host_proc = subprocess.Popen(
            [str(env.python), "-c", _SMOKE, *SMOKE_MODULES],
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env={**os.environ, **quiet},
        )
    try:
        out = client.containers.run(
            image.id,
            [image.python, "-c", _SMOKE, *SMOKE_MODULES],
            network_mode="none",
            remove=True,
            stdout=True,
            stderr=True,
            environment=quiet,
        )
    except docker.errors.ContainerError as exc:
        err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else str(exc.stderr)
        raise EnvironmentSetupError(f"docker image {image.ref}: the interpreter does not run:\n{err[-2000:]}") from None
    finally:
        host_out = host_proc.communicate()[0] if host_proc is not None else None
    inside = smoke_results(out.decode(errors="replace"))
    if host_out is not None:
        host = smoke_results(host_out)
        diff = {
            k: (host.get(k), inside.get(k))
            for k in sorted(set(host) | set(inside))
            if (host.get(k) == "ok") != (inside.get(k) == "ok") or k == "torch.sum" and host.get(k) != inside.get(k)
        }
        if diff:
            lines = "\n".join(f"  {k}: host {h!r}, image {i!r}" for k, (h, i) in diff.items())
            raise EnvironmentSetupError(f"docker image {image.ref} differs from the host environment:\n{lines}")
    return inside


def ensure_image(
    client: Any, env: SharedEnvironment, say: Say | None = None, rebuild: bool = False, tar_path: Path | None = None
) -> BuildReport:
    """The image for ``env``: reused if the engine has one with its digest, built otherwise."""
    from filelock import FileLock

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
