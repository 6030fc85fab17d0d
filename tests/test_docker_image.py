"""The docker back end's pieces that need no engine: rootfs filters, staging, container settings.

They run everywhere, so a machine without Docker still checks what would go into the image
and how a probe container would be isolated; tests/test_docker_runner.py checks the real thing.
"""

from __future__ import annotations

import io
import json
import os
import sys
import tarfile
from pathlib import Path

import pytest

from difflab.errors import EnvironmentSetupError
from difflab.image.build import _changes, _imported_id
from difflab.image.catalog import ENV_IN_IMAGE, DifflabImage
from difflab.image.rootfs import BASE_EXCLUDE, BASE_KEEP, ENV_EXCLUDE, Rootfs, RootfsStats, Stage, Tree, ldd
from difflab.runner.base import ProbeJob
from difflab.runner.docker import DockerRunner
from difflab.source.base import MaterialisedSource


def touch(root: Path, *rels: str) -> None:
    for rel in rels:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(rel)


def test_env_tree_drops_what_probes_never_need(tmp_path: Path) -> None:
    sp = "lib/python3.11/site-packages"
    touch(
        tmp_path,
        f"{sp}/torch/__init__.py",
        f"{sp}/torch/test/Dict_test",
        f"{sp}/torch/include/ATen.h",
        f"{sp}/torch/bin/test_api",
        f"{sp}/torch/bin/TCPStoreTest",
        f"{sp}/torch/bin/torch_shm_manager",
        f"{sp}/torch/__pycache__/x.cpython-311.pyc",
        f"{sp}/torch/__pycache__/x.cpython-311.opt-1.pyc",
        "pyvenv.cfg",
    )
    kept = {rel for _p, rel in Tree(tmp_path, ENV_IN_IMAGE, ENV_EXCLUDE).walk()}
    assert f"{sp}/torch/bin/torch_shm_manager" in kept and f"{sp}/torch/__init__.py" in kept
    assert f"{sp}/torch/__pycache__/x.cpython-311.pyc" in kept  # without it every probe recompiles torch
    assert "pyvenv.cfg" in kept
    for gone in (
        "torch/test",
        "torch/include",
        "torch/bin/test_api",
        "torch/bin/TCPStoreTest",
        "torch/__pycache__/x.cpython-311.opt-1.pyc",
    ):
        assert f"{sp}/{gone}" not in kept and not any(k.startswith(f"{sp}/{gone}/") for k in kept)


def test_base_tree_keeps_the_interpreter_and_stdlib_only(tmp_path: Path) -> None:
    touch(
        tmp_path,
        "bin/python3.11",
        "bin/pip3",
        "bin/idle3.11",
        "bin/python3.11-config",
        "lib/libpython3.11.so.1.0",
        "lib/libpython3.11.a",
        "lib/python3.11/os.py",
        "lib/python3.11/site-packages/awscli/x.py",
        "lib/python3.11/test/test_os.py",
        "lib/python3.11/lib-dynload/_ssl.cpython-311-x86_64-linux-gnu.so",
        "lib/python3.11/lib-dynload/_tkinter.cpython-311-x86_64-linux-gnu.so",
    )
    os.symlink("python3.11", tmp_path / "bin" / "python3")
    kept = {rel for _p, rel in Tree(tmp_path, "/x", BASE_EXCLUDE, BASE_KEEP).walk()}
    assert {
        "bin/python3.11",
        "bin/python3",
        "lib/libpython3.11.so.1.0",
        "lib/python3.11/os.py",
        "lib/python3.11/lib-dynload/_ssl.cpython-311-x86_64-linux-gnu.so",
        "lib/python3.11/site-packages",
    } <= kept
    for gone in (
        "bin/pip3",
        "bin/idle3.11",
        "bin/python3.11-config",
        "lib/libpython3.11.a",
        "lib/python3.11/site-packages/awscli",
        "lib/python3.11/test",
        "lib/python3.11/lib-dynload/_tkinter.cpython-311-x86_64-linux-gnu.so",
    ):
        assert gone not in kept, gone


def test_ldd_finds_libc_and_the_interpreter_of_this_python() -> None:
    found, missing = ldd([Path(os.path.realpath(sys.executable))])
    assert any("/libc.so" in p for p in found)
    assert any("ld-linux" in p for p in found)
    assert missing == []


def test_stage_keeps_directory_and_soname_symlinks(tmp_path: Path) -> None:
    libc = next(p for p in ldd([Path(os.path.realpath(sys.executable))])[0] if "/libc.so" in p)
    stage = Stage(tmp_path / "stage")
    stage.add_host_path(libc)
    stage.etc()
    placed = tmp_path / "stage" / os.path.realpath(os.path.dirname(libc)).lstrip("/") / os.path.basename(libc)
    assert placed.exists()
    top = "/" + libc.lstrip("/").split("/", 1)[0]
    if os.path.islink(top):  # merged /usr: /lib -> usr/lib must exist in the image too
        assert os.readlink(tmp_path / "stage" / top.lstrip("/")) == os.readlink(top)
    assert "root:x:0:0" in (tmp_path / "stage" / "etc" / "passwd").read_text()
    assert (tmp_path / "stage" / "tmp").stat().st_mode & 0o1777 == 0o1777


def test_rootfs_tar_of_a_tiny_venv(tmp_path: Path) -> None:
    """The full recipe on a venv without pip: paths, ownership, modes, parents, libraries, reproducible."""
    import venv

    env = tmp_path / "env"
    venv.EnvBuilder(with_pip=False).create(env)
    env.chmod(0o700)  # like the shared environment's mkdtemp folder
    rootfs = Rootfs.for_environment(env)
    buf = io.BytesIO()
    stats = RootfsStats()
    sha = rootfs.write_tar(buf, stats)
    assert len(sha) == 64 and stats.files > 100
    buf.seek(0)
    with tarfile.open(fileobj=buf) as tar:
        members = {m.name: m for m in tar.getmembers()}
    base = str(rootfs.python.base_prefix).lstrip("/")
    assert f"{ENV_IN_IMAGE.lstrip('/')}/pyvenv.cfg" in members
    assert members[ENV_IN_IMAGE.lstrip("/")].mode & 0o755 == 0o755  # usable by a non-root uid
    assert any(name.startswith(f"{base}/lib/python{rootfs.python.xy}/") for name in members)
    assert "opt" in members and "opt/difflab" in members  # parents exist with sane modes
    assert "etc/passwd" in members and "tmp" in members
    assert any(name.endswith("/libc.so.6") for name in members)
    assert all(m.uid == 0 and m.gid == 0 for m in members.values())
    assert not any("/site-packages/" in n for n in members if n.startswith(base))
    again = io.BytesIO()
    assert rootfs.write_tar(again, RootfsStats()) == sha  # reproducible: the layer digest names the content


def test_import_answer_parsing() -> None:
    ok = b'{"status":"sha256:' + b"a" * 64 + b'"}\r\n'
    assert _imported_id(ok) == "sha256:" + "a" * 64
    with pytest.raises(EnvironmentSetupError, match="no space"):
        _imported_id(b'{"errorDetail":{"message":"no space"},"error":"no space"}')


def test_import_changes_carry_labels_and_environment() -> None:
    lines = _changes({"org.difflab.env-digest": "abc"})
    assert 'LABEL org.difflab.env-digest="abc"' in lines
    assert any(line.startswith("ENV PATH=/opt/difflab/env/bin") for line in lines)


def test_container_config_isolates_the_probe(tmp_path: Path) -> None:
    src = MaterialisedSource(label="x", kind="test", root=tmp_path / "src", identity={}, digest="0")
    probe = tmp_path / "probes" / "p.py"
    job = ProbeJob(fix_id="f", probe="p", side="base", source=src, probe_file=probe)
    image = DifflabImage(
        ref="difflab/cpu-env:x",
        id="sha256:" + "b" * 64,
        env_digest="x",
        python="/opt/difflab/env/bin/python",
        recipe="r",
    )
    runner = DockerRunner(docker_host="unix:///nonexistent")  # no engine is contacted
    cfg = runner.container_config(job, image, tmp_path / "child", tmp_path / "out")
    assert cfg["network_mode"] == "none" and cfg["read_only"] is True
    assert cfg["nano_cpus"] == 1_000_000_000 and cfg["mem_limit"] == "2g"
    mounts = {m["Target"]: m for m in cfg["mounts"]}
    for target in ("/difflab/source", "/difflab/child", "/difflab/probes"):
        assert mounts[target]["ReadOnly"] is True, target
    assert mounts["/difflab/out"]["ReadOnly"] is False
    assert cfg["command"][-2:] == ["/difflab/probes/p.py", "/difflab/out/result.json"]
    assert cfg["environment"]["PYTHONPATH"] == "/difflab/child"  # the lab's package only: the build goes behind it
    assert cfg["environment"]["DIFFLAB_SOURCE_ROOT"] == "/difflab/source"
    assert cfg["command"][1:3] == ["-s", "-P"]
    json.dumps({k: v for k, v in cfg.items() if k != "mounts"})


def test_engine_fixture_states_why_it_skips(monkeypatch: pytest.MonkeyPatch) -> None:
    import docker_engine

    monkeypatch.setattr(docker_engine, "existing", lambda: None)
    monkeypatch.setattr(docker_engine.shutil, "which", lambda _name: None)
    monkeypatch.setattr(docker_engine.os.path, "exists", lambda _p: False)
    engine, reason = docker_engine.acquire()
    assert engine is None
    assert "dockerd is not installed (Debian: apt-get install docker.io)" in reason
    assert "DOCKER_HOST=" in reason
