"""The README's two commands on a stock Debian Python, where ``pip install --user`` is refused (PEP 668).

The image is Debian bookworm as ``debootstrap --variant=minbase`` makes it from Debian's mirror, plus
Debian's own ``python3``, ``python3-pip`` and ``pipx`` packages: nothing from this machine's Python.
It is imported into the tests' Docker engine from a tar (no registry) and cached in
``$DIFFLAB_CACHE/debian/``. The container has no network: nox, ruff and pip come from a wheelhouse
downloaded here, through ``PIP_NO_INDEX``/``PIP_FIND_LINKS``, which pipx's and nox's pip honour like
any index setting. In it, in a copy of the checkout:

1. ``python3 -m pip install --user nox`` is refused (``externally-managed-environment``): why the
   README does not use it;
2. ``pipx run nox --list`` lists the sessions the README's commands run (``lab``, ``tests``);
3. ``pipx run nox -s lint``: nox makes its session virtualenv from Debian's Python 3.11, installs
   into it and runs it.

``pipx run nox -s tests`` itself is not run in the container: it is the whole suite (SGLang's
wheels, a 1.4 GB environment, Docker) inside the suite. What Debian changes is only how nox is
started and how it makes its virtualenvs, which steps 2 and 3 run; the suite itself runs here.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
from filelock import FileLock

import docker_engine
from difflab.paths import cache_root

ROOT = Path(__file__).resolve().parents[1]
SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
PACKAGES = ("python3", "python3-pip", "pipx")
KEY = hashlib.sha256(f"{SUITE} {MIRROR} {' '.join(PACKAGES)}".encode()).hexdigest()[:12]
IMAGE = f"difflab-test/debian-pipx:{KEY}"

pytestmark = [pytest.mark.docker, pytest.mark.xdist_group("debian")]


def _rootfs_tar() -> Path:
    """Debian's minimal root filesystem with python3, python3-pip and pipx, as a tar (built once)."""
    folder = cache_root() / "debian"
    folder.mkdir(parents=True, exist_ok=True)
    tar = folder / f"{SUITE}-pipx-{KEY}.tar"
    with FileLock(str(tar) + ".lock"):
        if tar.is_file():
            return tar
        debootstrap = shutil.which("debootstrap") or shutil.which("debootstrap", path="/usr/sbin:/sbin")
        if debootstrap is None:
            pytest.skip("debootstrap is not installed (Debian: apt-get install debootstrap); no Debian root filesystem")
        if os.geteuid() != 0:
            pytest.skip(f"debootstrap needs root to make a root filesystem (uid is {os.geteuid()})")
        with tempfile.TemporaryDirectory(dir=folder, prefix=".rootfs-") as tmp:
            rootfs = Path(tmp) / "rootfs"
            argv = [debootstrap, "--variant=minbase", f"--include={','.join(PACKAGES)}", SUITE, str(rootfs), MIRROR]
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=1200, check=False)
            assert proc.returncode == 0, f"debootstrap failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}"
            partial = Path(tmp) / "rootfs.tar"
            with tarfile.open(partial, "w") as out:
                out.add(rootfs, arcname=".")
            os.replace(partial, tar)
    return tar


def _wheelhouse() -> Path:
    """nox and the ruff this environment lints with, for the offline container (downloaded once)."""
    ruff = metadata.version("ruff")
    folder = cache_root() / "debian" / f"wheels-ruff-{ruff}"
    with FileLock(str(folder) + ".lock"):
        if not (folder / "done").is_file():
            shutil.rmtree(folder, ignore_errors=True)
            argv = [sys.executable, "-m", "pip", "download", "--quiet", "-d", str(folder), "nox", f"ruff=={ruff}"]
            argv += ["pip", "setuptools", "wheel"]  # pipx upgrades its shared pip; nox's venvs may ask for these
            subprocess.run(argv, check=True, capture_output=True, timeout=600)
            (folder / "done").write_text("")
    return folder


@pytest.fixture(scope="module")
def debian(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Path]]:
    """(a running, network-less Debian container with a copy of the checkout at /work, that copy here)."""
    engine, reason = docker_engine.acquire()
    if engine is None:
        pytest.skip(f"no Docker engine: {reason}")
    client = engine.client()
    import docker.errors

    try:
        client.images.get(IMAGE)
    except docker.errors.ImageNotFound:
        repository, tag = IMAGE.split(":")
        client.api.import_image_from_file(str(_rootfs_tar()), repository=repository, tag=tag)
    project = tmp_path_factory.mktemp("debian") / "work"
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True, check=True
    )
    for rel in (f for f in listed.stdout.decode().split("\0") if f and (ROOT / f).is_file()):
        (project / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, project / rel)
    container = client.containers.run(
        IMAGE,
        ["sleep", "infinity"],
        detach=True,
        network_mode="none",
        working_dir="/work",
        environment={"HOME": "/root", "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": "/wheels", "LANG": "C.UTF-8"},
        volumes={str(_wheelhouse()): {"bind": "/wheels", "mode": "ro"}, str(project): {"bind": "/work", "mode": "rw"}},
    )
    try:
        yield container, project
    finally:
        container.remove(force=True)
        engine.stop()


def _sh(container: Any, command: str) -> tuple[int, str]:
    code, output = container.exec_run(["sh", "-c", command], workdir="/work")
    return code, output.decode(errors="replace")


def test_pip_install_user_is_refused_on_debians_python(debian: tuple[Any, Path]) -> None:
    container, _ = debian
    code, out = _sh(container, "python3 --version && python3 -m pip install --user nox")
    assert out.startswith("Python 3.11."), out
    assert code != 0 and "externally-managed-environment" in out, out


def test_pipx_run_nox_lists_the_readmes_sessions(debian: tuple[Any, Path]) -> None:
    container, _ = debian
    code, out = _sh(container, "pipx run nox --list")
    assert code == 0, out
    listed = {line.split()[1] for line in out.splitlines() if line.startswith(("* ", "- "))}
    assert {"lab", "tests", "wheel", "lint"} <= listed, out


def test_pipx_run_nox_runs_a_session_in_a_virtualenv_of_debians_python(debian: tuple[Any, Path]) -> None:
    container, project = debian
    code, out = _sh(container, "pipx run nox -s lint")
    assert code == 0, out
    assert "Session lint was successful" in out, out
    created = project / ".nox" / "lint" / "pyvenv.cfg"
    assert "home = /usr/bin" in created.read_text(), created.read_text()  # Debian's interpreter, not this one
