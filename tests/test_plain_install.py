"""A plain install (no extras) fails cleanly where an extra is needed, and runs where none is.

The environment is a fresh venv in a temporary folder that sees the project's source and exactly the
closure of its base dependencies (linked from this environment, read from the installed metadata):
no numpy, scipy, prometheus_client, sigstore or dev tools, just as after ``pip install sglang-difflab``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from difflab.extras import EXTRA_OF, MissingExtra, require

ROOT = Path(__file__).resolve().parents[1]
PROJECT = "sglang-difflab"

pytestmark = pytest.mark.xdist_group("plain-install")


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def base_closure(project: str = PROJECT) -> dict[str, metadata.Distribution]:
    """Every distribution a plain install of ``project`` pulls in (markers evaluated, no extras)."""
    found: dict[str, metadata.Distribution] = {}
    todo = [Requirement(r) for r in metadata.requires(project) or []]
    while todo:
        req = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        key = _norm(req.name)
        if key in found:
            continue
        dist = metadata.distribution(req.name)
        found[key] = dist
        todo += [Requirement(r) for r in dist.requires or []]
    return found


def _top_level(dist: metadata.Distribution) -> set[str]:
    """The entries a distribution put into site-packages (packages, modules, its .dist-info)."""
    names = set()
    for f in dist.files or []:
        first = f.parts[0]
        if first in ("..", "__pycache__") or first.endswith(".pth"):
            continue
        names.add(first)
    return names


def _link(dist: metadata.Distribution, into: Path) -> None:
    site = Path(str(dist.locate_file("")))
    for name in _top_level(dist):
        target = into / name
        if not target.exists() and (site / name).exists():
            target.symlink_to(site / name)


@pytest.fixture(scope="module")
def plain(tmp_path_factory) -> tuple[Path, Path]:
    """(python of the fresh venv, folder of linked distributions on its path)."""
    home = tmp_path_factory.mktemp("plain")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(home / "venv")], check=True, timeout=120)
    python = home / "venv" / "bin" / "python"
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    linked = home / "base"
    linked.mkdir()
    closure = base_closure()
    assert not set(closure) & {_norm(m) for m in EXTRA_OF}, sorted(closure)
    for dist in closure.values():
        _link(dist, linked)
    (site / "difflab-plain.pth").write_text(f"{ROOT / 'src'}\n{linked}\n")
    return python, linked


def _run(python: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    return subprocess.run(
        [str(python), *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=300, check=False
    )


def _absent(python: Path, cwd: Path) -> list[str]:
    probe = "import importlib.util as u, json; print(json.dumps([m for m in %r if u.find_spec(m) is None]))"
    modules = sorted([*EXTRA_OF, "yaml", "zizmor"])
    return json.loads(_run(python, "-c", probe % (modules,), cwd=cwd).stdout)


def test_each_optional_module_is_in_the_extra_it_names():
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for module, extra in EXTRA_OF.items():
        listed = {_norm(Requirement(r).name) for r in extras[extra]}
        assert _norm(module) in listed, (module, extra)
        assert _norm(module) in {_norm(Requirement(r).name) for r in extras["dev"]}  # the tests have them all


def test_require_translates_only_the_missing_package(monkeypatch):
    for name in ("scipy", "scipy.stats"):  # importing them now fails as if they were not installed
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(MissingExtra) as err:
        require("scipy.stats", "the A/B statistics")
    assert err.value.exit_code == 2
    assert (
        str(err.value) == "the A/B statistics needs scipy, which is not installed: pip install 'sglang-difflab[stats]'"
    )
    with pytest.raises(ValueError, match="not an optional dependency"):
        require("yaml", "x")


def test_gpu_testserver_on_a_plain_install(plain, tmp_path: Path):
    python, linked = plain
    assert set(_absent(python, tmp_path)) == {*EXTRA_OF, "yaml", "zizmor"}  # truly plain
    out = tmp_path / "gpu-38935"
    proc = _run(python, "-m", "difflab.cli", "gpu", "--testserver", "--fix", "38935", "--out", str(out), cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert "needs prometheus_client, which is not installed: pip install 'sglang-difflab[gpu]'" in proc.stderr
    assert not out.exists()  # stopped before anything was written

    # with the gpu tier's parser (but still without numpy/scipy) #38935 runs to its verdicts:
    # the statistics are imported only by the throughput A/B, which #38935 does not have
    _link(metadata.distribution("prometheus_client"), linked)
    proc = _run(python, "-m", "difflab.cli", "gpu", "--testserver", "--fix", "38935", "--out", str(out), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    verdicts = json.loads((out / "diff.json").read_text())["fixes"]
    assert [(v["id"], v["verdict"]) for v in verdicts] == [("38935", "confirmed")]
    assert {"numpy", "scipy"} <= set(_absent(python, tmp_path))

    # a fix whose plan has the throughput A/B needs the statistics: said before anything starts
    ab = tmp_path / "gpu-41404"
    proc = _run(python, "-m", "difflab.cli", "gpu", "--testserver", "--fix", "41404", "--out", str(ab), cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "needs numpy, which is not installed: pip install 'sglang-difflab[stats]'" in proc.stderr
    assert not ab.exists()


def test_verify_on_a_plain_install_says_what_it_could_not_check(plain, tmp_path: Path):
    """Without the sigstore extra the Ed25519 checks still run; the Sigstore bundle is reported unverified."""
    pytest.importorskip("rfc8785", reason="the local Sigstore instance needs sigstore-python's rfc8785 ([dev])")
    from sigstore_fake import IDENTITY, FakeSigstore

    python, _ = plain
    archive = tmp_path / "difflab-ci.tar.gz"
    archive.write_bytes((ROOT / "results" / "published" / "upstream.tar.gz").read_bytes())
    (tmp_path / "difflab-ci.tar.gz.sigstore.json").write_text(FakeSigstore().sign_artifact(archive.read_bytes()))
    fingerprint = "sha256:fb224e1ce2de6e5a9abf11aa75cddb1a40f7182d5d0ad75726943dc212e1000f"
    proc = _run(python, "-m", "difflab.cli", "verify", str(archive), "--fingerprint", fingerprint, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (
        "sigstore difflab-ci.tar.gz.sigstore.json: not verified: sigstore-python is not installed "
        "(pip install 'sglang-difflab[sigstore]')" in proc.stdout
    )
    proc = _run(python, "-m", "difflab.cli", "verify", str(archive), "--sigstore-identity", IDENTITY, cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "needs sigstore, which is not installed: pip install 'sglang-difflab[sigstore]'" in proc.stderr
