"""Shared helpers for the bundle tests: a synthetic run folder, keys, and config isolation.

Holds no tests; the test_bundle_* modules import from it (as other tests import matrix_samples).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from difflab.bundle import keys
from difflab.bundle.sealing import SealInfo, seal

WHEEL_20 = {
    "kind": "release",
    "version": "0.5.20",
    "file": "sglang-0.5.20-cp311-cp311-manylinux_2_34_x86_64.whl",
    "sha256": "1573527042f4f6b4ead838302818595fc77fdc611dbcc2e40cd150fbc8f8513c",
}
WHEEL_21 = {
    "kind": "release",
    "version": "0.5.21",
    "file": "sglang-0.5.21-cp311-cp311-manylinux_2_34_x86_64.whl",
    "sha256": "96c029f75dec99baa33a5db3d41b1bebefdd6bcfba3a2f7c807fe1cf49a87c20",
}
GIT_BASE = {
    "kind": "git",
    "repo": "https://github.com/sgl-project/sglang",
    "commit": "a" * 40,
    "tree": "b" * 40,
}
GIT_HEAD = {
    "kind": "git",
    "repo": "https://github.com/sgl-project/sglang",
    "commit": "c" * 40,
    "tree": "d" * 40,
}
SOURCES = {"0.5.20": WHEEL_20, "0.5.21": WHEEL_21, "git-base": GIT_BASE, "git-head": GIT_HEAD}
# fix id → probe, (base source, head source), (base fields, head fields)
FIXES = {
    "38935": (
        "pr38935_admission",
        (WHEEL_20, WHEEL_21),
        (
            {"rejected.enqueued": True, "valid.enqueued": True},
            {"rejected.enqueued": False, "valid.enqueued": True},
        ),
    ),
    "41404": (
        "pr41404_release",
        (GIT_BASE, GIT_HEAD),
        ({"timeout.freed": 0, "ratio": 0.5}, {"timeout.freed": 3, "ratio": 0.5}),
    ),
}
OBSERVATION = "observations/38935/base/pr38935_admission.json"
# Every file of the sealed synthetic run folder, bytewise sorted, written out (not derived from difflab.bundle.layout).
RUN_FILES = [
    "diff.json",
    "environment.json",
    "junit.xml",
    "matrix.toml",
    "observations/38935/base/pr38935_admission.json",
    "observations/38935/base/pr38935_admission.log",
    "observations/38935/head/pr38935_admission.json",
    "observations/38935/head/pr38935_admission.log",
    "observations/41404/base/pr41404_release.json",
    "observations/41404/base/pr41404_release.log",
    "observations/41404/head/pr41404_release.json",
    "observations/41404/head/pr41404_release.log",
    "run.json",
    "summary.md",
]
SEALED_FILES = sorted(
    [
        *RUN_FILES,
        "REPRODUCE.md",
        "SHA256SUMS",
        "attestations/38935/base.intoto.json",
        "attestations/38935/head.intoto.json",
        "attestations/checksums.intoto.json",
        "attestations/41404/base.intoto.json",
        "attestations/41404/head.intoto.json",
        "attestations/run.intoto.json",
        "keys/signing-key.fingerprint",
        "keys/signing-key.pub",
    ],
    key=str.encode,
)
RUN_STARTED = "2026-03-01T10:00:00Z"
RUN_FINISHED = "2026-03-01T10:05:00Z"


def _write_json(path: Path, value: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def observation(fix: str, side: str, probe: str, source: dict, fields: dict) -> dict:
    return {
        "schema": 1,
        "fix": fix,
        "probe": probe,
        "side": side,
        "source": source,
        "status": "ok",
        "fields": fields,
        "events": [],
        "problems": [],
        "error": None,
        "sglang_version": source.get("version", "0.5.21.dev0"),
        "duration_s": 0.4,
        "runner": "subprocess",
    }


def make_run_folder(root: Path, name: str = "run") -> Path:
    """A run folder shaped like the pipeline's, with one release-pinned and one git-pinned fix."""
    run_dir = root / name
    run_dir.mkdir(parents=True)
    _write_json(
        run_dir / "run.json",
        {
            "schema": 1,
            "tool": "sglang-difflab",
            "command": "run",
            "argv": ["difflab", "run", "--fix", "38935", "--fix", "41404"],
            "started_at": RUN_STARTED,
            "finished_at": RUN_FINISHED,
            "matrix": {"path": "matrices/upstream.toml", "sha256": "e" * 64},
            "fixes": list(FIXES),
            "source_kind": "release",
            "repo": None,
            "runner": {"name": "docker", "image": "ghcr.io/example/difflab@sha256:" + "f" * 64},
            "sources": SOURCES,
            "environment_digest": "9" * 64,
            "exit_code": 0,
        },
    )
    (run_dir / "matrix.toml").write_text('schema = 1\n[[fixes]]\nid = "38935"\n', encoding="utf-8")
    _write_json(
        run_dir / "environment.json",
        {
            "python_version": "3.11.9",
            "packages": ["torch==2.13.0+cpu", "numpy==2.1.0"],
            "digest": "9" * 64,
        },
    )
    diff_fixes = []
    for fix, (probe, (base_src, head_src), (base_fields, head_fields)) in FIXES.items():
        obs = {}
        for side, src, fields in (("base", base_src, base_fields), ("head", head_src, head_fields)):
            obs[side] = observation(fix, side, probe, src, fields)
            folder = run_dir / "observations" / fix / side
            _write_json(folder / f"{probe}.json", obs[side])
            (folder / f"{probe}.log").write_text(f"{fix} {side} probe log\n", encoding="utf-8")
        diff_fixes.append(
            {
                "fix": int(fix),
                "id": fix,
                "part": None,
                "verdict": "confirmed",
                "reason": "expected change",
                "base": {"label": "b", **base_src},
                "head": {"label": "h", **head_src},
                "probes": [{"probe": probe, "base": obs["base"], "head": obs["head"], "fields": []}],
            }
        )
    _write_json(run_dir / "diff.json", {"schema": 1, "fixes": diff_fixes})
    (run_dir / "junit.xml").write_text("<testsuites/>\n", encoding="utf-8")
    (run_dir / "summary.md").write_text("| fix | verdict |\n|---|---|\n| 38935 | confirmed |\n", encoding="utf-8")
    return run_dir


def make_key(folder: Path, name: str = "signer") -> tuple[Path, Path]:
    """A private key file (PEM, 0600) and its public key file."""
    folder.mkdir(parents=True, exist_ok=True)
    private = Ed25519PrivateKey.generate()
    priv_path, pub_path = folder / f"{name}.pem", folder / f"{name}.pub"
    priv_path.write_bytes(keys.private_pem(private))
    priv_path.chmod(0o600)
    pub_path.write_bytes(keys.public_pem(private.public_key()))
    return priv_path, pub_path


def sealed(root: Path, key: Path, name: str = "run") -> tuple[Path, SealInfo]:
    run_dir = make_run_folder(root, name)
    return run_dir, seal(run_dir, key, echo=lambda _m: None, environ={})


@pytest.fixture(autouse=True)
def isolated_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Never touch the real per-user key or trusted-keys file; no CI or signing variables leak in."""
    config = tmp_path / "user-config"
    monkeypatch.setattr(keys, "config_dir", lambda: config)
    for name in (
        "DIFFLAB_SIGNING_KEY",
        "SOURCE_DATE_EPOCH",
        "GITHUB_ACTIONS",
        "ACTIONS_ID_TOKEN_REQUEST_URL",
    ):
        monkeypatch.delenv(name, raising=False)
    return config
