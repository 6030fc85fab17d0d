"""Sealing: checksums in sha256sum format, deterministic in-toto/SLSA statements, DSSE, key sources."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import subprocess
import sys
import types
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from difflab.bundle import checksums, dsse, keyless, keys, layout, seal, statements, trust
from difflab.bundle.sealing import seal_with
from difflab.bundle.verify import verify_path
from difflab.errors import ConfigError
from sigstore_fake import IDENTITY, FakeSigstore
from test_bundle_support import (  # noqa: F401 - isolated_config is an autouse fixture
    GIT_BASE,
    OBSERVATION,
    SEALED_FILES,
    WHEEL_20,
    isolated_config,
    make_key,
    make_run_folder,
    sealed,
)


def payload(run_dir: Path, rel: str) -> dict:
    envelope = json.loads((run_dir / rel).read_text())
    return json.loads(base64.b64decode(envelope["payload"]))


def test_pae_matches_the_dsse_spec_example() -> None:
    assert dsse.pae("http://example.com/HelloWorld", b"hello world") == (
        b"DSSEv1 29 http://example.com/HelloWorld 11 hello world"
    )


def test_seal_writes_the_bundle_layout(tmp_path: Path) -> None:
    key, _ = make_key(tmp_path / "keys")
    run_dir, info = sealed(tmp_path, key)
    for rel in (
        layout.CHECKSUMS,
        layout.REPRODUCE,
        layout.PUBLIC_KEY,
        layout.FINGERPRINT,
        layout.RUN_ENVELOPE,
        "attestations/38935/base.intoto.json",
        "attestations/41404/head.intoto.json",
    ):
        assert (run_dir / rel).is_file(), rel
    assert (run_dir / layout.FINGERPRINT).read_text().strip() == info.fingerprint
    assert info.key_source == "argument" and info.files == 24 == len(SEALED_FILES)
    assert len(info.attestations) == 6  # 4 per fix and side, the run, and the checksums (signed last)
    assert (run_dir / layout.CHECKSUMS_ENVELOPE).is_file()
    assert info.fingerprint in (run_dir / layout.REPRODUCE).read_text()
    assert info.fingerprint in str(info)


def test_checksums_cover_every_file_sorted_bytewise_and_sha256sum_agrees(tmp_path: Path) -> None:
    key, _ = make_key(tmp_path / "keys")
    run_dir, _ = sealed(tmp_path, key)
    text = (run_dir / layout.CHECKSUMS).read_text()
    names = [line.split("  ", 1)[1] for line in text.splitlines()]
    assert names == sorted(names, key=lambda n: n.encode())
    assert names == [f for f in SEALED_FILES if f not in ("SHA256SUMS", "attestations/checksums.intoto.json")]
    assert "REPRODUCE.md" in names and "attestations/run.intoto.json" in names
    for line in text.splitlines():
        digest, rel = line.split("  ", 1)
        assert checksums.sha256_file(run_dir / rel) == digest
    if shutil.which("sha256sum"):
        done = subprocess.run(
            ["sha256sum", "-c", "--strict", layout.CHECKSUMS],
            cwd=run_dir,
            capture_output=True,
            text=True,
            env={**os.environ, "LC_ALL": "C"},
        )
        assert done.returncode == 0, done.stdout + done.stderr


def test_sealing_twice_gives_identical_bytes(tmp_path: Path) -> None:
    key, _ = make_key(tmp_path / "keys")
    run_dir, _ = sealed(tmp_path, key)
    first = {rel: (run_dir / rel).read_bytes() for rel in layout.scan(run_dir).files}
    seal(run_dir, key, echo=lambda _m: None, environ={})
    assert {rel: (run_dir / rel).read_bytes() for rel in layout.scan(run_dir).files} == first


def test_envelopes_are_dsse_over_canonical_in_toto_statements(tmp_path: Path) -> None:
    key, pub = make_key(tmp_path / "keys")
    run_dir, info = sealed(tmp_path, key)
    envelope = json.loads((run_dir / layout.RUN_ENVELOPE).read_text())
    assert envelope["payloadType"] == "application/vnd.in-toto+json"
    assert envelope["signatures"][0]["keyid"] == info.fingerprint
    raw = base64.b64decode(envelope["payload"])
    assert raw == json.dumps(json.loads(raw), sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    public = keys.load_public_key(pub.read_bytes(), "pub")
    opened = dsse.open_envelope((run_dir / layout.RUN_ENVELOPE).read_bytes(), {info.fingerprint: public})
    assert opened.payload == raw and opened.signer == info.fingerprint


def test_fix_statement_names_the_sources_and_carries_probe_results(tmp_path: Path) -> None:
    key, _ = make_key(tmp_path / "keys")
    run_dir, _ = sealed(tmp_path, key)
    release = payload(run_dir, "attestations/38935/base.intoto.json")
    assert release["_type"] == "https://in-toto.io/Statement/v1"
    assert release["predicateType"] == statements.PROBE_RESULTS
    assert release["subject"] == [
        {"name": WHEEL_20["file"], "uri": "pkg:pypi/sglang@0.5.20", "digest": {"sha256": WHEEL_20["sha256"]}}
    ]
    probe = release["predicate"]["probes"][0]
    assert probe["fields"] == {"rejected.enqueued": True, "valid.enqueued": True}
    assert probe["observation"] == {
        "name": OBSERVATION,
        "digest": {"sha256": checksums.sha256_file(run_dir / OBSERVATION)},
    }
    assert probe["sourceLabel"] == "0.5.20" and release["predicate"]["verdict"] == "confirmed"
    git = payload(run_dir, "attestations/41404/base.intoto.json")
    assert git["subject"][0]["digest"] == {"gitCommit": GIT_BASE["commit"], "gitTree": GIT_BASE["tree"]}


def test_run_statement_is_slsa_provenance_over_every_file(tmp_path: Path) -> None:
    key, _ = make_key(tmp_path / "keys")
    run_dir, _ = sealed(tmp_path, key)
    body = payload(run_dir, layout.RUN_ENVELOPE)
    assert body["predicateType"] == "https://slsa.dev/provenance/v1"
    names = {s["name"] for s in body["subject"]}
    # every file but those written after it: the checksum list and the statement that signs it (last)
    assert names == set(SEALED_FILES) - {
        "SHA256SUMS",
        "attestations/run.intoto.json",
        "attestations/checksums.intoto.json",
    }
    assert {"diff.json", "summary.md", "junit.xml", "run.json", "matrix.toml"} <= names
    definition, details = body["predicate"]["buildDefinition"], body["predicate"]["runDetails"]
    assert definition["externalParameters"]["fixes"] == ["38935", "41404"]
    assert definition["externalParameters"]["matrix"]["sha256"] == "e" * 64
    assert definition["internalParameters"]["environment"]["pythonVersion"] == "3.11.9"
    assert "torch==2.13.0+cpu" in definition["internalParameters"]["environment"]["packages"]
    image = [d for d in definition["resolvedDependencies"] if d["name"] == "runner-image"]
    assert image == [
        {"name": "runner-image", "uri": "docker://ghcr.io/example/difflab", "digest": {"sha256": "f" * 64}}
    ]
    assert details["metadata"] == {"startedOn": "2026-03-01T10:00:00Z", "finishedOn": "2026-03-01T10:05:00Z"}
    assert details["builder"]["id"] == statements.LOCAL_BUILDER


def test_unavailable_side_is_attested_by_its_observation_files(tmp_path: Path) -> None:
    key, _ = make_key(tmp_path / "keys")
    run_dir = make_run_folder(tmp_path)
    obs_path = run_dir / "observations/38935/head/pr38935_admission.json"
    obs = json.loads(obs_path.read_text())
    obs.update(source={}, status="unavailable", fields={}, error="no release carries it")
    obs_path.write_text(json.dumps(obs))
    seal(run_dir, key, echo=lambda _m: None, environ={})
    body = payload(run_dir, "attestations/38935/head.intoto.json")
    assert body["subject"][0]["name"] == "observations/38935/head/pr38935_admission.json"


def test_github_actions_provenance_names_the_workflow(tmp_path: Path) -> None:
    key, _ = make_key(tmp_path / "keys")
    run_dir = make_run_folder(tmp_path)
    ci = {
        "GITHUB_ACTIONS": "true",
        "GITHUB_SERVER_URL": "https://github.com",
        "GITHUB_REPOSITORY": "o/r",
        "GITHUB_RUN_ID": "7",
        "GITHUB_RUN_ATTEMPT": "2",
        "GITHUB_WORKFLOW_REF": "o/r/.github/workflows/ci.yml@main",
    }
    seal(run_dir, key, echo=lambda _m: None, environ=ci, sigstore=False)
    details = payload(run_dir, layout.RUN_ENVELOPE)["predicate"]["runDetails"]
    assert details["builder"]["id"] == "https://github.com/o/r/.github/workflows/ci.yml@main"
    assert details["metadata"]["invocationId"] == "https://github.com/o/r/actions/runs/7/attempts/2"


def test_sigstore_is_skipped_with_a_message_when_not_installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    key, _ = make_key(tmp_path / "keys")
    run_dir = make_run_folder(tmp_path)
    monkeypatch.setitem(sys.modules, "sigstore", None)  # import fails as if not installed
    said: list[str] = []
    ci = {"GITHUB_ACTIONS": "true", "ACTIONS_ID_TOKEN_REQUEST_URL": "https://token.example"}
    info = seal(run_dir, key, echo=said.append, environ=ci)
    assert info.sigstore_bundle is None and not (run_dir / layout.SIGSTORE_BUNDLE).exists()
    assert any("sigstore is not installed" in m for m in said)


def fake_sigstore(
    monkeypatch: pytest.MonkeyPatch,
    signed: list[bytes],
    instance: FakeSigstore | None = None,
    *,
    signs: Callable[[bytes], bytes] = lambda payload: payload,
) -> None:
    """Stand-in sigstore-python signing modules (4.x layout): they record what would be signed and
    return a real bundle from a local Sigstore instance, so no OIDC provider or log is reached.
    ``signs`` lets a test make the signer sign something other than what it was handed."""
    instance = instance or FakeSigstore()

    class Statement:
        def __init__(self, contents: bytes) -> None:
            self.contents = contents

    class Bundle:
        def __init__(self, text: str) -> None:
            self.text = text

        def to_json(self) -> str:
            return self.text

    class Signer:
        def sign_dsse(self, statement: Statement) -> Bundle:
            signed.append(statement.contents)
            return Bundle(instance.sign_statement(signs(statement.contents)))

    class SigningContext:
        @classmethod
        def from_trust_config(cls, config: object) -> SigningContext:
            return cls()

        @contextlib.contextmanager
        def signer(self, token: object) -> Iterator[Signer]:
            yield Signer()

    modules = {
        "sigstore": {},
        "sigstore.dsse": {"Statement": Statement},
        "sigstore.oidc": {"IdentityToken": lambda raw: raw, "detect_credential": lambda: "token"},
        "sigstore.sign": {"SigningContext": SigningContext},
        "sigstore.models": {"ClientTrustConfig": types.SimpleNamespace(production=lambda: "trust")},
    }
    for name, attributes in modules.items():
        module = types.ModuleType(name)
        module.__dict__.update(attributes)
        monkeypatch.setitem(sys.modules, name, module)


def test_keyless_signature_covers_the_run_statement(tmp_path: Path) -> None:
    pytest.importorskip("sigstore", reason="sigstore-python is in the [dev] extra")
    key, pub = make_key(tmp_path / "keys")
    run_dir = make_run_folder(tmp_path)
    signed: list[bytes] = []
    instance = FakeSigstore()
    with pytest.MonkeyPatch.context() as mp:
        fake_sigstore(mp, signed, instance)
        ci = {"GITHUB_ACTIONS": "true", "ACTIONS_ID_TOKEN_REQUEST_URL": "https://token.example"}
        info = seal(run_dir, key, echo=lambda _m: None, environ=ci)
    assert info.sigstore_bundle == run_dir / layout.SIGSTORE_BUNDLE
    envelope = json.loads((run_dir / layout.RUN_ENVELOPE).read_text())
    assert signed == [base64.b64decode(envelope["payload"])]
    assert layout.SIGSTORE_BUNDLE in (run_dir / layout.CHECKSUMS).read_text()
    # verified by sigstore-python itself, offline, against the local instance's trust root
    policy = keyless.KeylessPolicy(IDENTITY, trust_root=instance.write_trusted_root(tmp_path / "root.json"))
    report = verify_path(run_dir, trust.build(key_files=[pub]), policy)
    assert report.ok, report.failure_message()
    (check,) = report.keyless
    assert check.verified and check.signer == IDENTITY
    assert any("byte for byte the run statement" in c for c in check.checked)
    # without a trusted Ed25519 key the Sigstore bundle cannot be bound to a verified run statement
    other, other_pub = make_key(tmp_path / "other")
    report = verify_path(run_dir, trust.build(key_files=[other_pub]), policy)
    assert not report.ok and report.keyless == []
    assert f"{layout.SIGSTORE_BUNDLE}: cannot be bound: {layout.RUN_ENVELOPE} did not verify" in [
        str(p) for p in report.problems
    ]
    # a keyless bundle over another statement is refused as unbound, naming the file (and the
    # re-written checksum list no longer matches the signed one)
    (run_dir / layout.SIGSTORE_BUNDLE).write_text(instance.sign_statement(b'{"_type": "other"}'))
    checksums.write(run_dir, layout.scan(run_dir).files)
    report = verify_path(run_dir, trust.build(key_files=[pub]), policy)
    problems = [str(p) for p in report.problems]
    assert (
        f"{layout.SIGSTORE_BUNDLE}: signs something other than the run statement in {layout.RUN_ENVELOPE}; unbound"
    ) in problems
    assert any(p.startswith(f"{layout.CHECKSUMS}: sha256 does not match the signed checksums") for p in problems)


# -- where the signing key comes from -----------------------------------------------------------------


def test_key_argument_wins_over_environment(tmp_path: Path) -> None:
    arg, _ = make_key(tmp_path / "a")
    env, _ = make_key(tmp_path / "e")
    chosen = keys.resolve_signing_key(arg, {keys.ENV_SIGNING_KEY: str(env)})
    assert chosen.source == "argument" and chosen.location == str(arg)


def test_environment_key_as_path_or_inline_pem(tmp_path: Path) -> None:
    env, _ = make_key(tmp_path / "e")
    by_path = keys.resolve_signing_key(None, {keys.ENV_SIGNING_KEY: str(env)})
    inline = keys.resolve_signing_key(None, {keys.ENV_SIGNING_KEY: env.read_text()})
    assert by_path.source == inline.source == "environment"
    assert by_path.fingerprint == inline.fingerprint
    assert inline.path is None


def test_user_key_is_generated_once_private_and_pinned(isolated_config: Path) -> None:  # noqa: F811
    first = keys.resolve_signing_key(None, {})
    second = keys.resolve_signing_key(None, {})
    assert first.generated and not second.generated
    assert first.fingerprint == second.fingerprint and first.source == "user"
    key_file = isolated_config / keys.USER_KEY_NAME
    assert key_file.stat().st_mode & 0o777 == 0o600
    assert first.fingerprint in (isolated_config / keys.TRUSTED_KEYS_NAME).read_text()


def test_user_key_with_open_permissions_is_refused(isolated_config: Path) -> None:  # noqa: F811
    keys.resolve_signing_key(None, {})
    (isolated_config / keys.USER_KEY_NAME).chmod(0o644)
    with pytest.raises(ConfigError, match="chmod 600"):
        keys.resolve_signing_key(None, {})


def test_seal_refuses_a_key_inside_the_run_folder(tmp_path: Path) -> None:
    run_dir = make_run_folder(tmp_path)
    key, _ = make_key(run_dir / "secret")
    with pytest.raises(ConfigError, match="would be published"):
        seal_with(run_dir, keys.resolve_signing_key(key, {}), echo=lambda _m: None, environ={})


def test_seal_refuses_a_folder_without_run_json(tmp_path: Path) -> None:
    key, _ = make_key(tmp_path / "keys")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="run.json"):
        seal(tmp_path / "empty", key, echo=lambda _m: None, environ={})


def test_seal_refuses_symlinks(tmp_path: Path) -> None:
    key, _ = make_key(tmp_path / "keys")
    run_dir = make_run_folder(tmp_path)
    (run_dir / "link").symlink_to("/etc/passwd")
    with pytest.raises(ConfigError, match="link"):
        seal(run_dir, key, echo=lambda _m: None, environ={})
