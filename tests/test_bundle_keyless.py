"""A Sigstore-signed archive, as the CI workflow makes one (``difflab pack`` -> ``sigstore sign``), checked
offline by ``difflab verify`` through sigstore-python's own verifier.

The signatures come from a local Sigstore instance (tests/sigstore_fake.py: CA, CT log, transparency
log) whose trust root is passed with ``--sigstore-trust-root``; the archive is the real published bundle.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from difflab import cli
from difflab.bundle import keyless, layout, pack, seal, trust
from difflab.bundle.checksums import sha256_file
from difflab.bundle.verify import verify_path
from difflab.errors import ConfigError

pytest.importorskip("sigstore", reason="sigstore-python is in the [dev] extra")

from sigstore_fake import IDENTITY, FakeSigstore  # noqa: E402
from test_bundle_support import isolated_config, make_key, make_run_folder  # noqa: E402, F401 - autouse fixture

ROOT = Path(__file__).resolve().parents[1]
PUBLISHED = ROOT / "results" / "published" / "upstream.tar.gz"
PUBLISHED_FINGERPRINT = "sha256:fb224e1ce2de6e5a9abf11aa75cddb1a40f7182d5d0ad75726943dc212e1000f"


@pytest.fixture
def signed(tmp_path: Path) -> tuple[Path, Path, FakeSigstore]:
    """(the published archive, its trust root, the instance) with ARCHIVE.sigstore.json beside the archive."""
    instance = FakeSigstore()
    archive = tmp_path / "difflab-ci.tar.gz"
    shutil.copyfile(PUBLISHED, archive)
    (tmp_path / "difflab-ci.tar.gz.sigstore.json").write_text(instance.sign_artifact(archive.read_bytes()))
    return archive, instance.write_trusted_root(tmp_path / "trusted_root.json"), instance


def test_pinned_signer_verifies_offline_and_vouches_for_the_carried_key(signed):
    archive, root, _ = signed
    policy = keyless.KeylessPolicy(IDENTITY, trust_root=root)
    report = verify_path(archive, trust.build(), policy)  # no --key, no --fingerprint
    assert report.ok, report.failure_message()
    assert report.signers == {PUBLISHED_FINGERPRINT}  # the key inside, trusted through the signature
    (check,) = report.keyless
    assert check.verified and check.identity_pinned and check.signer == IDENTITY
    text = "\n".join(check.lines())
    assert f"sha256 {sha256_file(archive)}" in text
    assert "is the identity you pinned" in text and "Merkle inclusion proof" in text
    assert "not checked: the live log" in text
    assert "no identity pinned" not in text


def test_unpinned_signature_is_checked_but_vouches_for_nothing(signed):
    archive, root, _ = signed
    policy = keyless.KeylessPolicy(trust_root=root)
    report = verify_path(archive, trust.build(), policy)
    (check,) = report.keyless
    assert check.verified and not check.identity_pinned
    assert any("no identity pinned" in c for c in check.not_checked)
    assert not report.ok and "a key you have not trusted" in report.failure_message()  # the key is not vouched for
    assert verify_path(archive, trust.build(fingerprints=[PUBLISHED_FINGERPRINT]), policy).ok


def test_another_signer_a_changed_archive_or_a_foreign_root_is_refused(signed, tmp_path: Path, monkeypatch):
    archive, root, _ = signed
    wrong = verify_path(archive, trust.build(), keyless.KeylessPolicy("https://github.com/evil/x", trust_root=root))
    assert not wrong.ok
    assert "difflab-ci.tar.gz.sigstore.json: Sigstore signature does not verify: Certificate's SANs do not match" in (
        wrong.failure_message()
    )
    # re-sealed and re-packed with a key of one's own: Ed25519 is happy, the Sigstore signature is not
    with pack.opened(archive) as unpacked:
        work = tmp_path / "resealed" / "upstream"
        shutil.copytree(unpacked, work)
    (work / "summary.md").write_text("# all confirmed\n")
    key, pub = make_key(tmp_path / "k")
    seal(work, key, echo=lambda _m: None, environ={})
    shutil.copyfile(pack.pack(work, tmp_path / "resealed.tar.gz"), archive)
    report = verify_path(archive, trust.build(key_files=[pub]), keyless.KeylessPolicy(IDENTITY, trust_root=root))
    assert [p.message for p in report.problems] == [
        "Sigstore signature does not verify: Bundle message digest mismatch"
    ]
    # sigstore-python's production root, offline, does not trust a private instance
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    shutil.copyfile(PUBLISHED, archive)
    (check,) = verify_path(archive, trust.build(), keyless.KeylessPolicy(IDENTITY)).keyless
    assert check.failure and "certificate chain" in check.failure


def test_cli_reports_what_it_checked(signed, capsys):
    archive, root, _ = signed
    code = cli.main(["verify", str(archive), "--sigstore-identity", IDENTITY, "--sigstore-trust-root", str(root)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "sigstore difflab-ci.tar.gz.sigstore.json: verified offline" in out
    assert "  checked: the signing certificate chains to a Fulcio CA of the trust root" in out
    assert "  not checked: the live log" in out
    assert f"(key trusted through the Sigstore signature of difflab-ci.tar.gz by {IDENTITY})" in out


def test_bad_inputs(signed, tmp_path: Path, capsys):
    archive, root, _ = signed
    folder = make_run_folder(tmp_path / "f")
    with pytest.raises(ConfigError, match="is a folder"):
        verify_path(folder, trust.build(), keyless.KeylessPolicy(), sigstore_bundle=archive)
    with pytest.raises(ConfigError, match="no such Sigstore bundle"):
        verify_path(archive, trust.build(), keyless.KeylessPolicy(), sigstore_bundle=tmp_path / "none.json")
    broken = tmp_path / "broken.sigstore.json"
    broken.write_text('{"mediaType": "application/vnd.dev.sigstore.bundle.v0.3+json"}')
    report = verify_path(archive, trust.build(), keyless.KeylessPolicy(IDENTITY, trust_root=root), broken)
    assert any(p.path == broken.name and "not a Sigstore bundle" in p.message for p in report.problems)
    bad_root = tmp_path / "root.json"
    bad_root.write_text("{}")
    assert cli.main(["verify", str(archive), "--sigstore-trust-root", str(bad_root)]) == 2
    assert "not a Sigstore trusted_root.json" in capsys.readouterr().err
    # an identity is asked for, and the archive has no signature at all
    (tmp_path / "difflab-ci.tar.gz.sigstore.json").unlink()
    report = verify_path(archive, trust.build(), keyless.KeylessPolicy(IDENTITY, trust_root=root))
    assert any(
        "--sigstore-identity asks for a Sigstore signature, and there is none" in p.message for p in report.problems
    )
    assert layout.SIGSTORE_BUNDLE in report.failure_message()
