"""The committed reference bundle verifies, matches its tarball, and reproduces."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PUBLISHED = ROOT / "results" / "published" / "upstream"
TARBALL = PUBLISHED.with_suffix(".tar.gz")
FINGERPRINT = "sha256:fb224e1ce2de6e5a9abf11aa75cddb1a40f7182d5d0ad75726943dc212e1000f"
"""The publishing key's fingerprint, as printed in the README (pinned here independently of the bundle)."""


def difflab(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "difflab", *args], capture_output=True, text=True, timeout=900)


def test_readme_pins_the_same_fingerprint() -> None:
    assert FINGERPRINT in (ROOT / "README.md").read_text()
    assert (PUBLISHED / "keys" / "signing-key.fingerprint").read_text().strip() == FINGERPRINT


@pytest.mark.parametrize("target", [PUBLISHED, TARBALL], ids=["folder", "tarball"])
def test_published_bundle_verifies_with_the_pinned_key(target: Path) -> None:
    out = difflab("verify", str(target), "--fingerprint", FINGERPRINT)
    assert out.returncode == 0, out.stdout + out.stderr


def test_published_bundle_fails_with_another_fingerprint() -> None:
    out = difflab("verify", str(PUBLISHED), "--fingerprint", "sha256:" + "0" * 64)
    assert out.returncode == 1


def test_packing_the_folder_again_gives_the_committed_tarball(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    out = difflab("pack", str(PUBLISHED), "-o", str(tmp_path / "again.tar.gz"))
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "again.tar.gz").read_bytes() == TARBALL.read_bytes()


def test_published_verdicts() -> None:
    import json

    diff = json.loads((PUBLISHED / "diff.json").read_text())
    assert {f["id"]: f["verdict"] for f in diff["fixes"]} == {
        "36988": "confirmed",
        "38935": "confirmed",
        "41404": "confirmed",
        "43719a": "confirmed",
        "43719b": "unavailable",
    }


@pytest.mark.sglang
@pytest.mark.xdist_group("release")
def test_published_bundle_reproduces() -> None:
    out = difflab("reproduce", str(TARBALL), "--fingerprint", FINGERPRINT)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "every verdict and observed field matches" in out.stdout + out.stderr
