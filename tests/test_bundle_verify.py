"""verify: an untouched bundle passes (folder and tarball); every kind of tampering fails, naming the file."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from difflab.bundle import canonical, checksums, dsse, keys, layout, trust
from difflab.bundle.pack import pack
from difflab.bundle.sealing import seal_checksums, write_run_statement
from difflab.bundle.verify import verify_path
from difflab.cli import main
from test_bundle_support import (  # noqa: F401 - isolated_config is an autouse fixture
    OBSERVATION,
    isolated_config,
    make_key,
    sealed,
)


@pytest.fixture
def bundle(tmp_path: Path) -> tuple[Path, Path, Path]:
    """(run folder, private key, public key)."""
    private, public = make_key(tmp_path / "keys")
    run_dir, _ = sealed(tmp_path, private)
    return run_dir, private, public


def problems(path: Path, public: Path) -> list[str]:
    return [str(p) for p in verify_path(path, trust.build(key_files=[public])).problems]


def named(found: list[str], culprit: str) -> bool:
    return any(p.startswith(f"{culprit}: ") for p in found)


def relist(run_dir: Path, rel: str) -> None:
    """Update one SHA256SUMS line, as an attacker who edits the list too would."""
    lines = (run_dir / layout.CHECKSUMS).read_text().splitlines()
    digest = checksums.sha256_file(run_dir / rel)
    fixed = [f"{digest}  {rel}" if line.endswith(f"  {rel}") else line for line in lines]
    (run_dir / layout.CHECKSUMS).write_text("\n".join(fixed) + "\n")


def test_untouched_folder_verifies(bundle: tuple[Path, Path, Path]) -> None:
    run_dir, _, public = bundle
    report = verify_path(run_dir, trust.build(key_files=[public]))
    assert report.ok, report.failure_message()
    assert len(report.envelopes) == 6 and len(report.signers) == 1  # 4 per fix and side, the run, the checksums


def test_packed_tarball_verifies(bundle: tuple[Path, Path, Path]) -> None:
    run_dir, _, public = bundle
    assert problems(pack(run_dir, environ={}), public) == []


def test_flipped_byte_in_an_observation_is_named(bundle: tuple[Path, Path, Path]) -> None:
    run_dir, _, public = bundle
    data = bytearray((run_dir / OBSERVATION).read_bytes())
    data[10] ^= 0x01
    (run_dir / OBSERVATION).write_bytes(bytes(data))
    found = problems(run_dir, public)
    assert named(found, OBSERVATION)
    assert all(p.startswith(OBSERVATION) or "attests" in p for p in found), found


def test_flipped_byte_caught_even_when_sha256sums_is_updated(bundle: tuple[Path, Path, Path]) -> None:
    run_dir, _, public = bundle
    (run_dir / "summary.md").write_text("| 38935 | not-fixed |\n")
    relist(run_dir, "summary.md")
    found = problems(run_dir, public)
    assert found and all(p.startswith(("summary.md: ", "SHA256SUMS: ")) for p in found), found
    assert any(p.startswith("summary.md: ") and "attestations/run.intoto.json" in p for p in found), found
    assert any(p.startswith("SHA256SUMS: ") and "signed checksums statement" in p for p in found), found


def test_deleted_listed_file_is_named(bundle: tuple[Path, Path, Path]) -> None:
    run_dir, _, public = bundle
    (run_dir / "junit.xml").unlink()
    found = problems(run_dir, public)
    assert named(found, "junit.xml") and any("missing" in p for p in found)


def test_added_unlisted_file_is_named(bundle: tuple[Path, Path, Path]) -> None:
    run_dir, _, public = bundle
    (run_dir / "observations" / "extra.json").write_text("{}")
    found = problems(run_dir, public)
    assert named(found, "observations/extra.json") and any("not listed" in p for p in found)


def test_added_file_also_listed_is_still_caught_by_the_run_statement(bundle: tuple[Path, Path, Path]) -> None:
    run_dir, _, public = bundle
    (run_dir / "notes.txt").write_text("trust me")
    sums = (run_dir / layout.CHECKSUMS).read_text() + f"{checksums.sha256_file(run_dir / 'notes.txt')}  notes.txt\n"
    (run_dir / layout.CHECKSUMS).write_text(sums)
    found = problems(run_dir, public)
    assert found == [
        "SHA256SUMS: sha256 does not match the signed checksums statement (attestations/checksums.intoto.json)",
        "notes.txt: not covered by the signed run statement (attestations/run.intoto.json)",
    ]


def test_replaced_signature_is_named(bundle: tuple[Path, Path, Path], tmp_path: Path) -> None:
    run_dir, _, public = bundle
    other, _ = make_key(tmp_path / "other")
    rel = "attestations/38935/head.intoto.json"
    envelope = json.loads((run_dir / rel).read_text())
    forged = dsse.sign(base64.b64decode(envelope["payload"]), keys.load_private_key(other.read_bytes(), "o"), "x")
    envelope["signatures"][0]["sig"] = forged["signatures"][0]["sig"]
    (run_dir / rel).write_bytes(dsse.serialise(envelope))
    relist(run_dir, rel)
    found = problems(run_dir, public)
    assert named(found, rel) and any("signature does not verify" in p for p in found), found


def test_wrong_key_fails_every_envelope(bundle: tuple[Path, Path, Path], tmp_path: Path) -> None:
    run_dir, _, _ = bundle
    _, wrong = make_key(tmp_path / "wrong")
    found = problems(run_dir, wrong)
    for rel in (
        layout.RUN_ENVELOPE,
        "attestations/38935/base.intoto.json",
        "attestations/41404/head.intoto.json",
    ):
        assert named(found, rel), found


def test_fix_statement_with_wrong_subject_digest_is_named(bundle: tuple[Path, Path, Path]) -> None:
    """A validly signed statement that names a different wheel than the observation ran on."""
    run_dir, private, public = bundle
    signing = keys.resolve_signing_key(private, {})
    rel = "attestations/38935/base.intoto.json"
    body = json.loads(base64.b64decode(json.loads((run_dir / rel).read_text())["payload"]))
    body["subject"][0]["digest"]["sha256"] = "0" * 64
    (run_dir / rel).write_bytes(dsse.serialise(dsse.sign(canonical.dumps(body), signing.private, signing.fingerprint)))
    write_run_statement(run_dir, signing, {})
    seal_checksums(run_dir, signing)
    found = problems(run_dir, public)
    assert len(found) == 1 and found[0].startswith(f"{rel}: subject digest"), found
    assert OBSERVATION in found[0]


def test_missing_statement_for_observations_is_named(bundle: tuple[Path, Path, Path]) -> None:
    run_dir, private, public = bundle
    signing = keys.resolve_signing_key(private, {})
    (run_dir / "attestations/41404/base.intoto.json").unlink()
    write_run_statement(run_dir, signing, {})
    seal_checksums(run_dir, signing)
    assert problems(run_dir, public) == [
        "observations/41404/base: no signed statement (attestations/41404/base.intoto.json missing)"
    ]


def test_symlink_in_the_folder_is_named_and_not_followed(bundle: tuple[Path, Path, Path]) -> None:
    run_dir, _, public = bundle
    (run_dir / "escape").symlink_to("/etc")
    assert named(problems(run_dir, public), "escape")


# -- trust: a key inside the bundle is used only when pinned ------------------------------------------


def test_bundle_key_alone_is_not_trusted(bundle: tuple[Path, Path, Path]) -> None:
    run_dir, _, _ = bundle
    report = verify_path(run_dir, trust.build())
    assert not report.ok
    assert any(p.path == layout.PUBLIC_KEY and "--fingerprint" in p.message for p in report.problems)


def test_pinned_fingerprint_trusts_the_bundle_key(bundle: tuple[Path, Path, Path]) -> None:
    run_dir, _, _ = bundle
    fingerprint = (run_dir / layout.FINGERPRINT).read_text().strip()
    assert verify_path(run_dir, trust.build(fingerprints=[fingerprint.upper().replace("SHA256:", "")])).ok
    assert not verify_path(run_dir, trust.build(fingerprints=["sha256:" + "1" * 64])).ok


def test_trusted_keys_file(bundle: tuple[Path, Path, Path], tmp_path: Path) -> None:
    run_dir, _, _ = bundle
    listed = tmp_path / "trusted"
    listed.write_text(f"# team keys\n{(run_dir / layout.FINGERPRINT).read_text().strip()}  # release signer\n")
    assert verify_path(run_dir, trust.build(trusted_files=[listed])).ok


def test_own_generated_key_is_trusted_by_default(tmp_path: Path) -> None:
    run_dir, _ = sealed(tmp_path, None)  # per-user key, generated now and pinned in the user's file
    assert verify_path(run_dir, trust.build()).ok


# -- command line ---------------------------------------------------------------------------------------


def test_cli_exit_codes(bundle: tuple[Path, Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    run_dir, _, public = bundle
    assert main(["verify", str(run_dir), "--key", str(public)]) == 0
    assert "OK" in capsys.readouterr().out
    (run_dir / "junit.xml").write_text("<changed/>")
    assert main(["verify", str(run_dir), "--key", str(public)]) == 1
    assert "junit.xml: sha256" in capsys.readouterr().err
    assert main(["verify", str(run_dir), "--fingerprint", "nonsense"]) == 2
