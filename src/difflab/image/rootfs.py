"""The plan for the image's root filesystem, and the tar that carries it.

The image *is* the shared CPU environment: the venv (at ``/opt/difflab/env``), the Python
installation it was created from (at its own absolute path: the venv's interpreter finds
``libpython`` and the standard library there), and the few host shared libraries those
need, found with ``ldd`` (glibc, libstdc++, libssl, ...). Copying the host's own library
files (rather than a debootstrapped distribution's) means the interpreter meets exactly the
ABI it was built against, and the build works offline.
"""

from __future__ import annotations

import fnmatch
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from difflab.errors import EnvironmentSetupError
from difflab.image.catalog import ENV_IN_IMAGE
from difflab.image.tarball import HashingWriter, add_parents, normalise

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
        hashing = HashingWriter(fileobj)
        with tempfile.TemporaryDirectory(prefix="difflab-rootfs-") as tmp:
            stage = self.stage(Path(tmp), stats)
            trees = [Tree(stage.root, "/", fixed_mtime=True), *self.trees]
            with tarfile.open(fileobj=hashing, mode="w|", format=tarfile.PAX_FORMAT) as tar:
                parents_done: set[str] = set()
                for tree in trees:
                    dest = tree.dest.strip("/")
                    add_parents(tar, dest, parents_done)
                    if dest:
                        tar.addfile(normalise(tar.gettarinfo(str(tree.src), dest)))
                    for path, rel in tree.walk():
                        arc = f"{dest}/{rel}" if dest else rel
                        info = normalise(tar.gettarinfo(str(path), arc))
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
