"""Every file of a bundle is covered by a signature: nothing can be added, swapped or removed, even with a
recomputed SHA256SUMS. The Sigstore bundle is bound to the signed run statement, and a bundle of the
earlier format (the published reference bundle) verifies by its own rules, which cannot cover one.
"""

from __future__ import annotations

import base64
import json
import shutil
from pathlib import Path

import pytest

from difflab.bundle import checksums, keyless, keys, layout, trust
from difflab.bundle.sealing import seal, seal_checksums
from difflab.bundle.verify import verify_path
from sigstore_fake import FakeSigstore
from test_bundle_seal import fake_sigstore
from test_bundle_support import (  # noqa: F401 - isolated_config is an autouse fixture
    isolated_config,
    make_key,
    make_run_folder,
    sealed,
)

PUBLISHED = Path(__file__).resolve().parents[1] / "results" / "published" / "upstream"
PUBLISHED_FINGERPRINT = "sha256:fb224e1ce2de6e5a9abf11aa75cddb1a40f7182d5d0ad75726943dc212e1000f"
CI = {"GITHUB_ACTIONS": "true", "ACTIONS_ID_TOKEN_REQUEST_URL": "https://token.example"}


def relist_all(run_dir: Path) -> None:
    """What an attacker without the key can do: make SHA256SUMS agree with whatever files are there now."""
    files = [f for f in layout.scan(run_dir).files if f not in (layout.CHECKSUMS, layout.CHECKSUMS_ENVELOPE)]
    (run_dir / layout.CHECKSUMS).write_text(checksums.render(checksums.digests(run_dir, files)))


def problems_of(run_dir: Path, policy: trust.TrustPolicy) -> list[str]:
    return [str(p) for p in verify_path(run_dir, policy).problems]


@pytest.fixture
def signed(tmp_path: Path) -> tuple[Path, trust.TrustPolicy, Path]:
    """A bundle sealed in 'CI', so it carries a Sigstore bundle (from a local instance) over its run
    statement; the stand-in signer is gone again before anything verifies."""
    private, public = make_key(tmp_path / "keys")
    run_dir = make_run_folder(tmp_path)
    instance = FakeSigstore()
    with pytest.MonkeyPatch.context() as mp:
        fake_sigstore(mp, [], instance)
        seal(run_dir, private, echo=lambda _m: None, environ=CI)
    assert (run_dir / layout.SIGSTORE_BUNDLE).is_file()
    return run_dir, trust.build(key_files=[public]), instance.write_trusted_root(tmp_path / "trusted_root.json")


def test_a_sealed_bundle_with_a_sigstore_bundle_verifies_against_its_root_and_only_there(
    signed: tuple[Path, trust.TrustPolicy, Path],
) -> None:
    """Bound to the run statement and verified offline against the root that issued it; against the
    public-good root (which never issued this certificate) it is a problem, never "present"."""
    run_dir, policy, root = signed
    report = verify_path(run_dir, policy, keyless.KeylessPolicy(trust_root=root))
    assert report.ok, report.failure_message()
    (check,) = report.keyless
    text = "\n".join(check.lines())
    assert check.verified and "byte for byte the run statement" in text and "no identity pinned" in text
    elsewhere = verify_path(run_dir, policy)
    assert [str(p) for p in elsewhere.problems if layout.SIGSTORE_BUNDLE in str(p)]
    assert not elsewhere.ok


def test_every_file_is_covered_by_a_signature(signed: tuple[Path, trust.TrustPolicy, Path], tmp_path: Path) -> None:
    """Change any one file (and recompute SHA256SUMS): verification fails, naming a file."""
    run_dir, policy, _root = signed
    files = layout.scan(run_dir).files
    assert layout.SIGSTORE_BUNDLE in files and layout.CHECKSUMS_ENVELOPE in files
    for rel in files:
        copy = tmp_path / "copies" / rel.replace("/", "_")
        shutil.copytree(run_dir, copy)
        data = (copy / rel).read_bytes()
        (copy / rel).write_bytes(data[:-2] + bytes([data[-2] ^ 0x20]) + data[-1:])
        if rel != layout.CHECKSUMS:
            relist_all(copy)
        assert problems_of(copy, policy), f"{rel} changed, and verify still says OK"


def test_adding_a_sigstore_bundle_is_caught(tmp_path: Path) -> None:
    private, public = make_key(tmp_path / "keys")
    run_dir, _ = sealed(tmp_path, private)
    envelope = json.loads((run_dir / layout.RUN_ENVELOPE).read_text())
    bound = {"dsseEnvelope": {**envelope, "signatures": [{"sig": "MEUC"}]}}  # even one over the very statement
    (run_dir / layout.SIGSTORE_BUNDLE).write_text(json.dumps(bound))
    relist_all(run_dir)
    found = problems_of(run_dir, trust.build(key_files=[public]))
    assert any(p.startswith("SHA256SUMS: sha256 does not match the signed checksums statement") for p in found), found


def test_swapping_the_sigstore_bundle_is_caught(signed: tuple[Path, trust.TrustPolicy, Path]) -> None:
    run_dir, policy, _root = signed
    bundle = json.loads((run_dir / layout.SIGSTORE_BUNDLE).read_text())
    bundle["verificationMaterial"]["certificate"]["rawBytes"] = "MIID-someone-else"
    (run_dir / layout.SIGSTORE_BUNDLE).write_text(json.dumps(bundle))
    relist_all(run_dir)
    assert any(p.startswith("SHA256SUMS: ") for p in problems_of(run_dir, policy))


def test_removing_the_sigstore_bundle_is_caught(signed: tuple[Path, trust.TrustPolicy, Path]) -> None:
    run_dir, policy, _root = signed
    (run_dir / layout.SIGSTORE_BUNDLE).unlink()
    relist_all(run_dir)
    assert any(p.startswith("SHA256SUMS: ") for p in problems_of(run_dir, policy))


def test_removing_the_checksums_statement_is_caught(signed: tuple[Path, trust.TrustPolicy, Path]) -> None:
    """No downgrade: the signed run statement says the bundle is format 2, so the statement must be there."""
    run_dir, policy, _root = signed
    (run_dir / layout.CHECKSUMS_ENVELOPE).unlink()
    found = problems_of(run_dir, policy)
    assert (
        f"{layout.CHECKSUMS_ENVELOPE}: missing: SHA256SUMS is not signed (the run statement says it must be)" in found
    )


def test_a_sigstore_bundle_over_something_else_is_unbound(tmp_path: Path) -> None:
    private, public = make_key(tmp_path / "keys")
    run_dir = make_run_folder(tmp_path)
    with pytest.MonkeyPatch.context() as mp:
        fake_sigstore(mp, [], signs=lambda payload: payload.replace(b'"run"', b'"forged"'))
        seal(run_dir, private, echo=lambda _m: None, environ=CI)
    found = problems_of(run_dir, trust.build(key_files=[public]))
    assert found == [
        f"{layout.SIGSTORE_BUNDLE}: signs something other than the run statement in {layout.RUN_ENVELOPE}; unbound"
    ]


def test_an_unreadable_sigstore_bundle_is_not_accepted(tmp_path: Path) -> None:
    """Covered by the signatures (the signer put it there) but not a bundle over a DSSE envelope: a problem."""
    private, public = make_key(tmp_path / "keys")
    run_dir, _ = sealed(tmp_path, private)
    (run_dir / layout.SIGSTORE_BUNDLE).write_text('{"mediaType": "application/vnd.dev.sigstore.bundle.v0.3+json"}')
    seal_checksums(run_dir, keys.resolve_signing_key(private, {}))
    found = problems_of(run_dir, trust.build(key_files=[public]))
    assert found == [
        f"{layout.SIGSTORE_BUNDLE}: not a Sigstore bundle over a DSSE envelope (no dsseEnvelope); "
        "unbound, so not accepted"
    ]


# -- the earlier format: the published reference bundle -----------------------------------------------


@pytest.fixture
def published(tmp_path: Path) -> Path:
    copy = tmp_path / "upstream"
    shutil.copytree(PUBLISHED, copy)
    return copy


def test_the_published_bundle_is_format_1_and_verifies(published: Path) -> None:
    assert not (published / layout.CHECKSUMS_ENVELOPE).exists()
    report = verify_path(published, trust.build(fingerprints=[PUBLISHED_FINGERPRINT]))
    assert report.ok, report.failure_message()


def test_a_sigstore_bundle_added_to_a_format_1_bundle_is_not_covered(published: Path) -> None:
    envelope = json.loads((published / layout.RUN_ENVELOPE).read_text())
    (published / layout.SIGSTORE_BUNDLE).write_text(json.dumps({"dsseEnvelope": envelope}))
    relist_all(published)
    found = problems_of(published, trust.build(fingerprints=[PUBLISHED_FINGERPRINT]))
    assert found == [
        f"{layout.SIGSTORE_BUNDLE}: not covered by any signature: bundle format 1 "
        f"({layout.RUN_ENVELOPE}) signs nothing written after it"
    ]


def test_a_checksums_statement_added_to_a_format_1_bundle_is_not_covered(published: Path, tmp_path: Path) -> None:
    """An attacker's own signed checksums statement does not turn the published bundle into format 2."""
    payload = base64.b64encode(b"{}").decode()
    (published / layout.CHECKSUMS_ENVELOPE).write_text(json.dumps({"payload": payload, "signatures": []}))
    relist_all(published)
    found = problems_of(published, trust.build(fingerprints=[PUBLISHED_FINGERPRINT]))
    assert any(p.startswith(f"{layout.CHECKSUMS_ENVELOPE}: ") for p in found), found


def test_the_threat_model_table_names_only_tests_that_exist() -> None:
    """docs/bundle.md's threat model names its tests; a renamed or dropped test must not leave it stale."""
    import ast
    import re

    root = Path(__file__).resolve().parents[1]
    text = (root / "docs" / "bundle.md").read_text()
    table = text[text.index("## Threat model") : text.index("## From code")]
    named: list[tuple[str, str | None]] = []
    for row in (line for line in table.splitlines() if line.startswith("| ") and "`test_" in line):
        current = None
        for ref in re.findall(r"`((?:test_\w+\.py)?(?:::\w+)?)`", row.split("|")[4]):
            file, _, name = ref.partition("::")
            current = file or current
            assert current, f"{ref}: no test file named before it"
            named.append((current, name or None))
    assert len(named) > 30
    for file, name in named:
        path = root / "tests" / file
        assert path.is_file(), file
        if name:
            functions = {n.name for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.FunctionDef)}
            assert name in functions, f"{file}::{name} is named in docs/bundle.md but does not exist"
