"""Each check of ``verify`` in isolation, on a copy of the real published bundle.

Every test breaks one property and asserts the exact problem list, so a check that is removed or
weakened fails its own test (end-to-end tamper tests are often caught by some other check). The copy is
resealed with a throwaway key where a test must re-sign a tampered statement; tests that need no new
signature keep the publisher's signature and pin its fingerprint.
"""

from __future__ import annotations

import base64
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

import pytest

from difflab.bundle import canonical, checksums, dsse, keyless, keys, layout, trust
from difflab.bundle.sealing import seal_checksums, seal_with, write_run_statement
from difflab.bundle.verify import VerifyReport, verify_folder, verify_path
from difflab.errors import ConfigError, VerificationFailed
from difflab.extras import MissingExtra
from sigstore_fake import IDENTITY, FakeSigstore
from test_bundle_support import isolated_config, make_key  # noqa: F401 - isolated_config is an autouse fixture

ROOT = Path(__file__).resolve().parents[1]
PUBLISHED = ROOT / "results" / "published" / "upstream"
FINGERPRINT = "sha256:fb224e1ce2de6e5a9abf11aa75cddb1a40f7182d5d0ad75726943dc212e1000f"
UNAVAILABLE = "observations/43719b/head/pr43719_failed_room_quarantine.json"  # the side no release carries
UNAVAILABLE_ENV = "attestations/43719b/head.intoto.json"
DOOR_ENV = "attestations/38935/base.intoto.json"
DECODE_OBS = "observations/38935/base/pr38935_decode_door.json"
PREFILL_OBS = "observations/38935/base/pr38935_prefill_door.json"
RUN_ENV = "attestations/run.intoto.json"
ENVELOPES = [
    "attestations/36988/base.intoto.json",
    "attestations/36988/head.intoto.json",
    "attestations/38935/base.intoto.json",
    "attestations/38935/head.intoto.json",
    "attestations/41404/base.intoto.json",
    "attestations/41404/head.intoto.json",
    "attestations/43719a/base.intoto.json",
    "attestations/43719a/head.intoto.json",
    "attestations/43719b/base.intoto.json",
    "attestations/43719b/head.intoto.json",
    "attestations/run.intoto.json",
]


RESEALED_ENVELOPES = sorted([*ENVELOPES, layout.CHECKSUMS_ENVELOPE], key=str.encode)  # format 2 signs SHA256SUMS


def untrusted(fingerprints: list[str]) -> str:
    """What verify says when no trusted key signed the bundle (the keys it carries are named, not trusted)."""
    return (
        f"signed with a key you have not trusted (trust: --fingerprint sha256:{'0' * 64}). The bundle names "
        f"its key as (untrusted: {', '.join(fingerprints)}): anyone who can change the bundle can change that "
        "too. Get the fingerprint the publisher published through another channel and pass that with "
        "--fingerprint, or pass --key with their public key"
    )


def problems_of(report: VerifyReport) -> list[str]:
    return [str(p) for p in report.problems]


@pytest.fixture
def published(tmp_path: Path) -> Path:
    """A copy of the published bundle with the publisher's own signatures."""
    return Path(shutil.copytree(PUBLISHED, tmp_path / "upstream"))


def pinned(run_dir: Path) -> list[str]:
    return problems_of(verify_folder(run_dir, trust.build(fingerprints=[FINGERPRINT])))


class Resealed:
    """The published bundle's content sealed with a throwaway key, so tampered statements can be re-signed."""

    def __init__(self, root: Path, public: Path, signing: keys.SigningKey) -> None:
        self.root, self.public, self.signing = root, public, signing

    def report(self) -> VerifyReport:
        return verify_folder(self.root, trust.build(key_files=[self.public]))

    def problems(self) -> list[str]:
        return problems_of(self.report())

    def statement(self, rel: str) -> dict:
        return json.loads(base64.b64decode(json.loads((self.root / rel).read_text())["payload"]))

    def resign(self, rel: str, edit: Callable[[dict], None], payload_type: str = dsse.IN_TOTO_PAYLOAD) -> None:
        """Edit a statement and sign it again, then re-sign the run statement and relist, as the publisher would."""
        body = self.statement(rel)
        edit(body)
        envelope = dsse.sign(canonical.dumps(body), self.signing.private, self.signing.fingerprint, payload_type)
        (self.root / rel).write_bytes(dsse.serialise(envelope))
        self.refresh(run_statement=rel != RUN_ENV)

    def refresh(self, run_statement: bool = True) -> None:
        if run_statement:
            write_run_statement(self.root, self.signing, {})
        self.relist()

    def relist(self) -> None:
        """SHA256SUMS over what is there now, and its signed statement (the last step of sealing)."""
        seal_checksums(self.root, self.signing)


@pytest.fixture(scope="module")
def resealed_template(tmp_path_factory: pytest.TempPathFactory) -> Resealed:
    """Sealed once per module; each test tampers with its own copy."""
    base = tmp_path_factory.mktemp("resealed")
    root = Path(shutil.copytree(PUBLISHED, base / "upstream"))
    private, public = make_key(base / "keys")
    signing = keys.resolve_signing_key(private, {})
    seal_with(root, signing, sigstore=False, echo=lambda _m: None, environ={})
    return Resealed(root, public, signing)


@pytest.fixture
def resealed(resealed_template: Resealed, tmp_path: Path) -> Resealed:
    root = Path(shutil.copytree(resealed_template.root, tmp_path / "upstream"))
    return Resealed(root, resealed_template.public, resealed_template.signing)


def sums_lines(run_dir: Path) -> list[str]:
    return (run_dir / layout.CHECKSUMS).read_text().splitlines()


def write_sums(run_dir: Path, lines: list[str]) -> None:
    (run_dir / layout.CHECKSUMS).write_text("".join(f"{line}\n" for line in lines))


def digest(run_dir: Path, rel: str) -> str:
    return checksums.sha256_file(run_dir / rel)


def published_digest(rel: str) -> str:
    return checksums.sha256_file(PUBLISHED / rel)


# -- the untouched bundle -------------------------------------------------------------------------------------


def test_the_published_copy_verifies_and_the_report_counts_what_it_checked(published: Path) -> None:
    report = verify_folder(published, trust.build(fingerprints=[FINGERPRINT]))
    assert problems_of(report) == [] and report.ok
    assert report.target == published and report.files == 44
    assert report.envelopes == ENVELOPES
    assert report.signers == {FINGERPRINT}
    assert report.notes == []


def test_the_resealed_copy_verifies(resealed: Resealed) -> None:
    assert resealed.problems() == []


def test_failure_message_lists_every_problem(published: Path) -> None:
    (published / "summary.md").write_text("changed\n")
    report = verify_path(published, trust.build(fingerprints=[FINGERPRINT]))
    assert report.target == published and not report.ok
    assert report.failure_message().splitlines() == [
        f"{published} does not verify (2 problem(s)):",
        f"  summary.md: sha256 {digest(published, 'summary.md')} does not match SHA256SUMS "
        f"({checksums.sha256_file(PUBLISHED / 'summary.md')})",
        f"  summary.md: sha256 does not match its subject in {RUN_ENV} ({published_digest('summary.md')})",
    ]


# -- SHA256SUMS -----------------------------------------------------------------------------------------------


def test_a_folder_without_sha256sums_is_not_a_bundle(published: Path) -> None:
    (published / layout.CHECKSUMS).unlink()
    assert pinned(published) == ["SHA256SUMS: missing: this is not a sealed bundle"]


def test_sha256sums_that_is_not_utf8(published: Path) -> None:
    (published / layout.CHECKSUMS).write_bytes(b"\xff\xfe not text\n")
    assert pinned(published) == ["SHA256SUMS: is not UTF-8 text"]


def test_a_malformed_sha256sums_line_is_named_by_number(published: Path) -> None:
    lines = sums_lines(published)
    write_sums(published, [*lines, "garbage"])
    assert pinned(published) == [f"SHA256SUMS line {len(lines) + 1}: not a '<sha256>  <path>' line"]


@pytest.mark.parametrize("unsafe", ["../outside", "/etc/passwd", "a/./b", "C:/x", "a\\b"])
def test_an_unsafe_path_in_sha256sums_is_refused_and_never_opened(published: Path, unsafe: str) -> None:
    lines = sums_lines(published)
    write_sums(published, [*lines, f"{'0' * 64}  {unsafe}"])
    assert pinned(published) == [f"SHA256SUMS line {len(lines) + 1}: unsafe path {unsafe!r}"]


def test_a_path_listed_twice(published: Path) -> None:
    lines = sums_lines(published)
    twice = next(line for line in lines if line.endswith(f"  {UNAVAILABLE}"))
    write_sums(published, [*lines, twice])
    assert pinned(published) == [f"{UNAVAILABLE}: listed twice in SHA256SUMS"]


def test_a_listed_file_that_is_missing(published: Path) -> None:
    write_sums(published, [*sums_lines(published), f"{'1' * 64}  observations/43719b/head/ghost.json"])
    assert pinned(published) == ["observations/43719b/head/ghost.json: listed in SHA256SUMS but missing"]


def test_a_listed_digest_that_does_not_match(published: Path) -> None:
    lines = [
        f"{'2' * 64}  {UNAVAILABLE}" if line.endswith(f"  {UNAVAILABLE}") else line for line in sums_lines(published)
    ]
    write_sums(published, lines)
    assert pinned(published) == [
        f"{UNAVAILABLE}: sha256 {digest(published, UNAVAILABLE)} does not match SHA256SUMS ({'2' * 64})"
    ]


def test_a_file_left_out_of_sha256sums(published: Path) -> None:
    write_sums(published, [line for line in sums_lines(published) if not line.endswith(f"  {UNAVAILABLE}")])
    assert pinned(published) == [f"{UNAVAILABLE}: not listed in SHA256SUMS"]


def test_sha256sums_accepts_what_sha256sum_writes(published: Path) -> None:
    """Upper-case digests and the binary-mode marker are the same listing."""
    lines = []
    for line in sums_lines(published):
        hexdigest, rel = line.split("  ", 1)
        lines.append(f"{hexdigest.upper()} *{rel}")
    write_sums(published, lines)
    assert pinned(published) == []


def test_a_link_in_the_folder_is_named_and_not_followed(published: Path) -> None:
    (published / "observations" / "escape").symlink_to("/etc")
    (published / "hosts").symlink_to("/etc/hosts")
    assert pinned(published) == [
        "hosts: is a link or special file; bundles hold plain files",
        "observations/escape: is a link or special file; bundles hold plain files",
    ]


# -- keys and trust ---------------------------------------------------------------------------------------------


def test_the_carried_key_alone_is_not_trusted(published: Path) -> None:
    found = problems_of(verify_folder(published, trust.build(fingerprints=["sha256:" + "0" * 64])))
    assert found == [f"keys/signing-key.pub: {untrusted([FINGERPRINT])}"]


def test_no_key_at_all(published: Path) -> None:
    shutil.rmtree(published / layout.KEYS)
    write_sums(published, [line for line in sums_lines(published) if f"  {layout.KEYS}/" not in line])
    found = problems_of(verify_folder(published, trust.build(fingerprints=["sha256:" + "0" * 64])))
    # nothing is trusted, so no statement is opened: the missing key files are not reported a second time
    assert found == [f"keys: no trusted key to check signatures with (trust: --fingerprint sha256:{'0' * 64})"]


def test_a_carried_key_file_that_is_not_a_key(published: Path) -> None:
    (published / "keys" / "other.pub").write_text("not a key\n")
    write_sums(published, [*sums_lines(published), f"{digest(published, 'keys/other.pub')}  keys/other.pub"])
    found = pinned(published)
    assert found[0].startswith("keys/other.pub: not a PEM or OpenSSH public key (")
    assert found[1:] == [f"keys/other.pub: not covered by the signed run statement ({RUN_ENV})"]


def test_without_a_trust_policy_only_integrity_is_checked(published: Path) -> None:
    report = verify_folder(published, None)
    assert problems_of(report) == [] and report.signers == set()
    assert report.envelopes == ENVELOPES
    assert report.notes == ["signatures not checked (integrity against SHA256SUMS only)"]
    (published / "summary.md").write_text("changed\n")
    assert [p.path for p in verify_folder(published, None).problems] == ["summary.md"]


def test_a_sigstore_bundle_that_binds_nothing_is_not_accepted(resealed: Resealed) -> None:
    """Listed and signed over, but no bundle over a DSSE envelope: never reported as a present signature."""
    (resealed.root / layout.SIGSTORE_BUNDLE).write_text("{}\n")
    resealed.relist()
    report = verify_folder(resealed.root, trust.build(key_files=[resealed.public]))
    assert problems_of(report) == [
        f"{layout.SIGSTORE_BUNDLE}: not a Sigstore bundle over a DSSE envelope (no dsseEnvelope); "
        "unbound, so not accepted"
    ]
    assert not any("present" in n for n in report.notes)


# -- envelopes ----------------------------------------------------------------------------------------------------


def test_an_envelope_that_is_not_json(resealed: Resealed) -> None:
    (resealed.root / DOOR_ENV).write_text("{not json")
    resealed.refresh()
    report = resealed.report()
    (found,) = problems_of(report)
    assert found.startswith(f"{DOOR_ENV}: not a JSON envelope (")
    assert report.envelopes == RESEALED_ENVELOPES  # the envelopes after it are still opened


def test_an_envelope_signed_by_another_key(resealed: Resealed, tmp_path: Path) -> None:
    other = keys.resolve_signing_key(make_key(tmp_path / "other")[0], {})
    body = canonical.dumps(resealed.statement(DOOR_ENV))
    (resealed.root / DOOR_ENV).write_bytes(dsse.serialise(dsse.sign(body, other.private, resealed.signing.fingerprint)))
    resealed.refresh()
    assert resealed.problems() == [
        f"{DOOR_ENV}: signature does not verify with any trusted key (envelope names {resealed.signing.fingerprint}; "
        f"trusted: {resealed.signing.fingerprint})"
    ]


@pytest.mark.parametrize("rel", [RUN_ENV, DOOR_ENV])
def test_an_envelope_whose_payload_type_is_not_in_toto(resealed: Resealed, rel: str) -> None:
    resealed.resign(rel, lambda _body: None, payload_type="application/json")
    report = resealed.report()
    assert problems_of(report) == [f"{rel}: payloadType 'application/json' is not application/vnd.in-toto+json"]
    assert report.envelopes == RESEALED_ENVELOPES and report.signers == {resealed.signing.fingerprint}


def test_a_payload_that_is_not_a_statement(resealed: Resealed) -> None:
    resealed.resign(DOOR_ENV, lambda body: body.update(_type="https://example.com/Other"))
    report = resealed.report()
    assert problems_of(report) == [
        f"{DOOR_ENV}: payload is not an in-toto Statement v1 (_type https://in-toto.io/Statement/v1)"
    ]
    assert report.envelopes == RESEALED_ENVELOPES


# -- the run statement --------------------------------------------------------------------------------------------


def test_a_missing_run_statement(resealed: Resealed) -> None:
    (resealed.root / RUN_ENV).unlink()
    resealed.relist()
    assert resealed.problems() == [f"{RUN_ENV}: missing: the bundle has no signed run statement"]


def test_a_run_statement_of_another_predicate_type(resealed: Resealed) -> None:
    resealed.resign(RUN_ENV, lambda body: body.update(predicateType="https://slsa.dev/provenance/v0.2"))
    assert resealed.problems() == [f"{RUN_ENV}: predicateType is not https://slsa.dev/provenance/v1"]


def test_a_run_statement_subject_with_an_unsafe_name(resealed: Resealed) -> None:
    subject = {"name": "../outside", "digest": {"sha256": "3" * 64}}
    resealed.resign(RUN_ENV, lambda body: body["subject"].insert(0, subject))  # the subjects after it still count
    assert resealed.problems() == [f"{RUN_ENV}: subject with unsafe name '../outside'"]


def test_a_run_statement_subject_that_is_missing(resealed: Resealed) -> None:
    subject = {"name": "observations/43719b/head/ghost.json", "digest": {"sha256": "3" * 64}}
    resealed.resign(RUN_ENV, lambda body: body["subject"].append(subject))
    assert resealed.problems() == [
        f"observations/43719b/head/ghost.json: named in the signed run statement ({RUN_ENV}) but missing"
    ]


def test_a_run_statement_subject_with_another_digest(resealed: Resealed) -> None:
    def edit(body: dict) -> None:
        for subject in body["subject"]:
            if subject["name"] == UNAVAILABLE:
                subject["digest"]["sha256"] = "4" * 64

    resealed.resign(RUN_ENV, edit)
    assert resealed.problems() == [f"{UNAVAILABLE}: sha256 does not match its subject in {RUN_ENV} ({'4' * 64})"]


@pytest.mark.parametrize("rel", ["diff.json", "summary.md", UNAVAILABLE, DOOR_ENV, layout.PUBLIC_KEY])
def test_a_file_the_run_statement_does_not_cover(resealed: Resealed, rel: str) -> None:
    resealed.resign(RUN_ENV, lambda body: body.update(subject=[s for s in body["subject"] if s["name"] != rel]))
    assert resealed.problems() == [f"{rel}: not covered by the signed run statement ({RUN_ENV})"]


def test_the_run_statement_covers_every_file_but_itself_and_sha256sums(resealed: Resealed) -> None:
    names = {s["name"] for s in resealed.statement(RUN_ENV)["subject"]}
    assert len(names) == 42
    assert {"SHA256SUMS", RUN_ENV} & names == set()
    assert {"diff.json", "summary.md", "junit.xml", "run.json", "matrix.toml", "environment.json"} <= names
    assert {"REPRODUCE.md", layout.PUBLIC_KEY, layout.FINGERPRINT, UNAVAILABLE_ENV, UNAVAILABLE} <= names


# -- the per-fix statements -------------------------------------------------------------------------------------


def test_observations_without_their_statement(resealed: Resealed) -> None:
    (resealed.root / UNAVAILABLE_ENV).unlink()
    resealed.refresh()
    assert resealed.problems() == [
        "observations/43719b/head: no signed statement (attestations/43719b/head.intoto.json missing)"
    ]


def test_a_fix_statement_of_another_predicate_type(resealed: Resealed) -> None:
    resealed.resign(DOOR_ENV, lambda body: body.update(predicateType="https://slsa.dev/provenance/v1"))
    assert resealed.problems() == [f"{DOOR_ENV}: predicateType is not urn:sglang-difflab:probe-results:v1"]


def test_a_statement_for_observations_that_are_not_in_the_bundle(resealed: Resealed) -> None:
    (resealed.root / "attestations" / "99999").mkdir()
    shutil.copy(resealed.root / DOOR_ENV, resealed.root / "attestations" / "99999" / "base.intoto.json")
    resealed.refresh()
    assert resealed.problems() == [
        "attestations/99999/base.intoto.json: attests observations that are not in the bundle"
    ]


def test_removed_observations_leave_their_statement_attesting_nothing(resealed: Resealed) -> None:
    (resealed.root / UNAVAILABLE).unlink()
    resealed.refresh()
    assert resealed.problems() == [f"{UNAVAILABLE_ENV}: attests observations that are not in the bundle"]


def probe_entry(body: dict, name: str) -> dict:
    return next(p for p in body["predicate"]["probes"] if p["observation"]["name"] == name)


def test_an_observation_its_statement_does_not_attest(resealed: Resealed) -> None:
    def edit(body: dict) -> None:
        body["predicate"]["probes"] = [p for p in body["predicate"]["probes"] if p["observation"]["name"] != DECODE_OBS]

    resealed.resign(DOOR_ENV, edit)
    assert resealed.problems() == [f"{DECODE_OBS}: not attested by {DOOR_ENV}"]


@pytest.mark.parametrize("name", ["../outside.json", None])
def test_a_probe_entry_with_an_unsafe_observation_name(resealed: Resealed, name: str | None) -> None:
    resealed.resign(DOOR_ENV, lambda body: body["predicate"]["probes"].append({"observation": {"name": name}}))
    assert resealed.problems() == [f"{DOOR_ENV}: probe entry with unsafe observation name {name!r}"]


def test_entries_after_an_unsafe_one_are_still_checked(resealed: Resealed) -> None:
    def edit(body: dict) -> None:
        body["predicate"]["probes"].insert(0, {"observation": {"name": "../outside.json"}})
        probe_entry(body, DECODE_OBS).update(status="error")

    resealed.resign(DOOR_ENV, edit)
    assert resealed.problems() == [
        f"{DOOR_ENV}: probe entry with unsafe observation name '../outside.json'",
        f"{DECODE_OBS}: status differs from what {DOOR_ENV} attests",
    ]


def test_an_entry_naming_a_link_is_never_read_through_it(resealed: Resealed) -> None:
    link = "observations/38935/base/linked.json"
    (resealed.root / link).symlink_to("pr38935_decode_door.json")

    def edit(body: dict) -> None:
        entry = json.loads(json.dumps(probe_entry(body, DECODE_OBS)))
        entry["observation"]["name"], entry["status"] = link, "error"
        body["predicate"]["probes"].append(entry)

    resealed.resign(DOOR_ENV, edit)
    assert resealed.problems() == [
        f"{link}: attested by {DOOR_ENV} but missing",
        f"{link}: is a link or special file; bundles hold plain files",
    ]


def test_an_observation_that_is_not_a_json_object_is_only_a_digest_mismatch(resealed: Resealed) -> None:
    (resealed.root / DECODE_OBS).write_text("[]\n")
    resealed.refresh()
    assert resealed.problems() == [f"{DECODE_OBS}: sha256 does not match the digest attested in {DOOR_ENV}"]


def test_an_attested_observation_digest_that_does_not_match(resealed: Resealed) -> None:
    resealed.resign(
        DOOR_ENV, lambda body: probe_entry(body, DECODE_OBS)["observation"]["digest"].update(sha256="5" * 64)
    )
    assert resealed.problems() == [f"{DECODE_OBS}: sha256 does not match the digest attested in {DOOR_ENV}"]


def test_an_attested_log_that_is_missing_or_differs(resealed: Resealed) -> None:
    ghost = "observations/38935/base/ghost.log"
    resealed.resign(DOOR_ENV, lambda body: probe_entry(body, DECODE_OBS)["log"].update(name=ghost))
    assert resealed.problems() == [f"{ghost}: attested by {DOOR_ENV} but missing"]
    resealed.resign(
        DOOR_ENV,
        lambda body: probe_entry(body, DECODE_OBS)["log"].update(
            name=DECODE_OBS.replace(".json", ".log"), digest={"sha256": "6" * 64}
        ),
    )
    assert resealed.problems() == [
        f"{DECODE_OBS.replace('.json', '.log')}: sha256 does not match the digest attested in {DOOR_ENV}"
    ]


@pytest.mark.parametrize(
    ("key", "value"),
    [("status", "error"), ("fields", {"rejected.pending": False}), ("source", {"kind": "release", "sha256": "7" * 64})],
)
def test_attested_results_are_compared_with_the_observation(resealed: Resealed, key: str, value: object) -> None:
    resealed.resign(DOOR_ENV, lambda body: probe_entry(body, DECODE_OBS).update({key: value}))
    assert resealed.problems() == [f"{DECODE_OBS}: {key} differs from what {DOOR_ENV} attests"]


def test_the_unavailable_side_is_attested_as_unavailable(resealed: Resealed) -> None:
    entry = probe_entry(resealed.statement(UNAVAILABLE_ENV), UNAVAILABLE)
    assert (entry["status"], entry["fields"], entry["source"]) == ("unavailable", {}, None)
    resealed.resign(UNAVAILABLE_ENV, lambda body: probe_entry(body, UNAVAILABLE).update(status="ok"))
    assert resealed.problems() == [f"{UNAVAILABLE}: status differs from what {UNAVAILABLE_ENV} attests"]


def test_a_sourceless_observation_must_be_a_subject_of_its_statement(resealed: Resealed) -> None:
    resealed.resign(UNAVAILABLE_ENV, lambda body: body["subject"][0]["digest"].update(sha256="8" * 64))
    assert resealed.problems() == [
        f"{UNAVAILABLE_ENV}: records no source for {UNAVAILABLE} and does not name it as subject"
    ]


def test_a_subject_that_is_not_the_recorded_source(resealed: Resealed) -> None:
    """Signed, but not canonical: the message still shows every subject digest with its keys sorted."""
    body = resealed.statement(DOOR_ENV)
    body["subject"] = [
        {"name": "a.whl", "digest": {"sha256": "9" * 64}},
        {"name": "b", "digest": {"sha256": "8" * 64, "gitCommit": "a" * 40}},
    ]
    payload = json.dumps(body).encode()  # keys in insertion order, as another signer might write them
    envelope = dsse.sign(payload, resealed.signing.private, resealed.signing.fingerprint)
    (resealed.root / DOOR_ENV).write_bytes(dsse.serialise(envelope))
    resealed.refresh()
    wheel = json.loads((resealed.root / DECODE_OBS).read_text())["source"]["sha256"]
    expected = f'{{"sha256": "{wheel}"}}'
    forged = f'{{"sha256": "{"9" * 64}"}}; {{"gitCommit": "{"a" * 40}", "sha256": "{"8" * 64}"}}'
    assert resealed.problems() == [
        f"{DOOR_ENV}: subject digest {forged} does not match the source recorded in {DECODE_OBS} ({expected})",
        f"{DOOR_ENV}: subject digest {forged} does not match the source recorded in {PREFILL_OBS} ({expected})",
    ]


def test_an_observation_whose_source_is_not_one_the_run_recorded(resealed: Resealed) -> None:
    run = json.loads((resealed.root / layout.RUN_JSON).read_text())
    run["sources"] = {k: v for k, v in run["sources"].items() if k != "0.5.19"}
    (resealed.root / layout.RUN_JSON).write_text(json.dumps(run))
    resealed.refresh()
    assert resealed.problems() == [
        "observations/36988/base/pr36988_retire_aborted.json: source is not one of the sources recorded in run.json"
    ]


def test_a_recorded_source_that_names_nothing(resealed: Resealed) -> None:
    obs = json.loads((resealed.root / DECODE_OBS).read_text())
    obs["source"] = {"kind": "directory", "path": "/tmp/sglang"}
    (resealed.root / DECODE_OBS).write_text(json.dumps(obs))

    def edit(body: dict) -> None:
        entry = probe_entry(body, DECODE_OBS)
        entry["source"] = obs["source"]
        entry["observation"]["digest"]["sha256"] = digest(resealed.root, DECODE_OBS)

    resealed.resign(DOOR_ENV, edit)
    assert resealed.problems() == [
        f"{DECODE_OBS}: source: source {{'kind': 'directory', 'path': '/tmp/sglang'}} names neither a wheel "
        "sha256 nor a git commit"
    ]


def test_every_problem_is_reported_once_and_sorted(published: Path) -> None:
    """A tampered unavailable observation, relisted by the attacker: each check that sees it says so."""
    obs = json.loads((published / UNAVAILABLE).read_text())
    obs["error"] = "carried after all"
    (published / UNAVAILABLE).write_text(json.dumps(obs))
    lines = [
        f"{digest(published, UNAVAILABLE)}  {UNAVAILABLE}" if line.endswith(f"  {UNAVAILABLE}") else line
        for line in sums_lines(published)
    ]
    write_sums(published, lines)
    assert pinned(published) == [
        f"{UNAVAILABLE_ENV}: records no source for {UNAVAILABLE} and does not name it as subject",
        f"{UNAVAILABLE}: sha256 does not match its subject in {RUN_ENV} ({published_digest(UNAVAILABLE)})",
        f"{UNAVAILABLE}: sha256 does not match the digest attested in {UNAVAILABLE_ENV}",
    ]


# -- SHA256SUMS, the module on its own ---------------------------------------------------------------------------


def test_render_is_the_sha256sum_format_sorted_bytewise() -> None:
    assert checksums.render({"b": "1" * 64, "B": "2" * 64, "a/é": "3" * 64, "a/z": "4" * 64}) == (
        f"{'2' * 64}  B\n{'4' * 64}  a/z\n{'3' * 64}  a/é\n{'1' * 64}  b\n"
    )
    assert checksums.render({}) == ""


@pytest.mark.parametrize("name", ["a\nb", "a\\b", "../x", "/x", "a/../b", "a\rb"])
def test_render_refuses_names_sha256sum_would_escape_or_that_leave_the_folder(name: str) -> None:
    from difflab.errors import ConfigError

    with pytest.raises(ConfigError, match="cannot be listed in SHA256SUMS"):
        checksums.render({name: "0" * 64})


def test_render_refuses_a_name_that_is_not_utf8() -> None:
    from difflab.errors import ConfigError

    with pytest.raises(ConfigError, match="file name cannot be listed in SHA256SUMS"):
        checksums.render({"bad\udcff": "0" * 64})


def test_parse_and_compare() -> None:
    text = f"{'A' * 64}  x\n{'b' * 64} *y\nnope\n{'c' * 64}  ../z\n{'d' * 64}  x\n{'e' * 63}  w\n"
    entries, found = checksums.parse(text)
    assert entries == {"x": "a" * 64, "y": "b" * 64}
    assert [str(p) for p in found] == [
        "SHA256SUMS line 3: not a '<sha256>  <path>' line",
        "SHA256SUMS line 4: unsafe path '../z'",
        "x: listed twice in SHA256SUMS",
        "SHA256SUMS line 6: not a '<sha256>  <path>' line",
    ]
    assert [str(p) for p in checksums.compare({"x": "a" * 64, "y": "b" * 64}, {"x": "a" * 64, "z": "c" * 64})] == [
        "y: listed in SHA256SUMS but missing",
        "z: not listed in SHA256SUMS",
    ]
    assert [str(p) for p in checksums.compare({"x": "a" * 64}, {"x": "f" * 64})] == [
        f"x: sha256 {'f' * 64} does not match SHA256SUMS ({'a' * 64})"
    ]
    assert checksums.compare({}, {}) == []


def test_write_lists_everything_but_itself(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("a\n")
    (tmp_path / layout.CHECKSUMS).write_text("old\n")
    out = checksums.write(tmp_path, ["a.txt", layout.CHECKSUMS])
    assert out == tmp_path / layout.CHECKSUMS
    assert out.read_text() == "87428fc522803d31065e7bce3cf03fe475096631e5e07bbd7a0fde60c4cf25c7  a.txt\n"
    assert checksums.digests(tmp_path, ["a.txt"]) == {
        "a.txt": "87428fc522803d31065e7bce3cf03fe475096631e5e07bbd7a0fde60c4cf25c7"
    }


def test_a_predicate_that_is_not_an_object_attests_nothing(resealed: Resealed) -> None:
    resealed.resign(DOOR_ENV, lambda body: body.update(predicate=["not", "an", "object"]))
    assert resealed.problems() == [
        f"{DECODE_OBS}: not attested by {DOOR_ENV}",
        f"{PREFILL_OBS}: not attested by {DOOR_ENV}",
    ]


def test_every_carried_key_is_named_when_none_is_trusted(published: Path, tmp_path: Path) -> None:
    _, other = make_key(tmp_path / "other")
    shutil.copy(other, published / "keys" / "other.pub")
    other_fp = keys.fingerprint(keys.load_public_key(other.read_bytes(), "other"))
    report = verify_folder(published, trust.build(fingerprints=["sha256:" + "0" * 64]))
    first = sorted([FINGERPRINT, other_fp])
    assert [p.message for p in report.problems if p.path == layout.PUBLIC_KEY] == [untrusted(first)]
    assert report.envelopes == ENVELOPES and report.signers == set()


def test_only_key_files_are_read_as_keys(published: Path) -> None:
    (published / "keys" / "notes.txt").write_text("not a key\n")
    write_sums(published, [*sums_lines(published), f"{digest(published, 'keys/notes.txt')}  keys/notes.txt"])
    assert pinned(published) == [f"keys/notes.txt: not covered by the signed run statement ({RUN_ENV})"]


def test_envelopes_are_the_statements_under_attestations_only(resealed: Resealed) -> None:
    (resealed.root / layout.SIGSTORE_BUNDLE).write_text("{}\n")
    (resealed.root / "notes.intoto.json").write_text("{}\n")
    resealed.relist()
    report = verify_folder(resealed.root, trust.build(key_files=[resealed.public]))
    assert report.envelopes == RESEALED_ENVELOPES  # the Sigstore bundle and a stray statement are not opened
    assert problems_of(report) == [
        f"{layout.SIGSTORE_BUNDLE}: not a Sigstore bundle over a DSSE envelope (no dsseEnvelope); "
        "unbound, so not accepted",
        f"notes.intoto.json: not covered by the signed run statement ({RUN_ENV})",
    ]


def test_without_a_trust_policy_problems_are_sorted_and_once(published: Path) -> None:
    for rel in ("summary.md", "diff.json"):
        (published / rel).write_text("changed\n")
    lines = sums_lines(published)
    write_sums(published, [*lines, lines[0], lines[0]])  # REPRODUCE.md three times: the same problem twice
    report = verify_folder(published, None)
    assert [(p.path, p.message.split(" ")[0]) for p in report.problems] == [
        ("REPRODUCE.md", "listed"),
        ("diff.json", "sha256"),
        ("summary.md", "sha256"),
    ]


def test_render_accepts_ordinary_names() -> None:
    assert checksums.render({"X.txt": "0" * 64, "a b/c-d_e.json": "1" * 64}) == (
        f"{'0' * 64}  X.txt\n{'1' * 64}  a b/c-d_e.json\n"
    )


# -- verify_path over an archive, and the Sigstore bundle of a folder ---------------------------------------------

ARCHIVE = ROOT / "results" / "published" / "upstream.tar.gz"
SIGNATURE = "difflab-ci.tar.gz.sigstore.json"
KNOWN_FORMATS = "urn:sglang-difflab:run:v1, urn:sglang-difflab:run:v2"
NOTHING_TRUSTED = "nothing (no --key, --fingerprint or trusted-keys file)"
NOT_INSTALLED = "sigstore-python is not installed (pip install 'sglang-difflab[sigstore]')"


@pytest.fixture
def archive(tmp_path: Path) -> tuple[Path, Path, FakeSigstore]:
    """(the published archive with a Sigstore signature beside it, the trust root of the instance that signed it,
    that instance)."""
    instance = FakeSigstore()
    path = tmp_path / "difflab-ci.tar.gz"
    shutil.copyfile(ARCHIVE, path)
    (tmp_path / SIGNATURE).write_text(instance.sign_artifact(path.read_bytes()))
    return path, instance.write_trusted_root(tmp_path / "trusted_root.json"), instance


def without_sigstore(module: str, purpose: str) -> NoReturn:
    """What importing the optional sigstore-python does where it is not installed."""
    raise MissingExtra(module, purpose)


def sign_checksums_statement(resealed: Resealed, edit: Callable[[dict], None]) -> None:
    """Re-sign the checksums statement with an edit; SHA256SUMS does not list it, so nothing else changes."""
    body = resealed.statement(layout.CHECKSUMS_ENVELOPE)
    edit(body)
    envelope = dsse.sign(canonical.dumps(body), resealed.signing.private, resealed.signing.fingerprint)
    (resealed.root / layout.CHECKSUMS_ENVELOPE).write_bytes(dsse.serialise(envelope))


def bind_sigstore_bundle(resealed: Resealed, instance: FakeSigstore) -> None:
    """A Sigstore bundle over the signed run statement, listed in SHA256SUMS, as sealing in CI leaves it."""
    payload = base64.b64decode(json.loads((resealed.root / RUN_ENV).read_text())["payload"])
    (resealed.root / layout.SIGSTORE_BUNDLE).write_text(instance.sign_statement(payload))
    resealed.relist()


def test_a_file_name_with_control_characters_is_named_escaped(published: Path) -> None:
    (published / "notes\x1b[2K.txt").write_text("hidden\n")
    assert pinned(published) == [
        "notes\\x1b[2K.txt: file name holds control characters; a bundle never does (shown escaped)",
        f"notes\\x1b[2K.txt: not covered by the signed run statement ({RUN_ENV})",
        "notes\\x1b[2K.txt: not listed in SHA256SUMS",
    ]


def test_the_report_carries_the_trust_it_was_checked_with(published: Path) -> None:
    policy = trust.build(fingerprints=[FINGERPRINT])
    assert verify_folder(published, policy).trust is policy
    assert verify_folder(published, None).trust is None


def test_a_run_statement_of_an_unknown_bundle_format(resealed: Resealed) -> None:
    """Named, and the bundle is still checked by the newest format's rules (which it otherwise meets)."""
    resealed.resign(
        RUN_ENV, lambda body: body["predicate"]["buildDefinition"].update(buildType="urn:sglang-difflab:run:v9")
    )
    assert resealed.problems() == [
        f"{RUN_ENV}: buildType 'urn:sglang-difflab:run:v9' is not a bundle format this verifier knows ({KNOWN_FORMATS})"
    ]


def test_a_checksums_statement_of_another_predicate_type(resealed: Resealed) -> None:
    sign_checksums_statement(resealed, lambda body: body.update(predicateType="urn:sglang-difflab:probe-results:v1"))
    assert resealed.problems() == [f"{layout.CHECKSUMS_ENVELOPE}: predicateType is not urn:sglang-difflab:checksums:v1"]


def test_a_checksums_statement_that_names_more_than_sha256sums(resealed: Resealed) -> None:
    extra = {"name": "diff.json", "digest": {"sha256": "a" * 64}}
    sign_checksums_statement(resealed, lambda body: body["subject"].append(extra))
    assert resealed.problems() == [
        f"{layout.CHECKSUMS_ENVELOPE}: names ['SHA256SUMS', 'diff.json'], not just SHA256SUMS"
    ]


def test_without_a_trust_policy_a_format_2_bundle_does_not_list_its_checksums_statement(resealed: Resealed) -> None:
    report = verify_folder(resealed.root, None)
    assert problems_of(report) == []
    assert report.envelopes == RESEALED_ENVELOPES
    assert report.notes == ["signatures not checked (integrity against SHA256SUMS only)"]


def test_a_bound_sigstore_bundle_is_checked_under_its_name(resealed: Resealed, tmp_path: Path) -> None:
    instance = FakeSigstore()
    bind_sigstore_bundle(resealed, instance)
    policy = keyless.KeylessPolicy(IDENTITY, trust_root=instance.write_trusted_root(tmp_path / "trusted_root.json"))
    report = verify_folder(resealed.root, trust.build(key_files=[resealed.public]), policy)
    assert problems_of(report) == [] and report.notes == []
    assert [(c.bundle, c.verified, c.identity_pinned, c.signer) for c in report.keyless] == [
        (layout.SIGSTORE_BUNDLE, True, True, IDENTITY)
    ]


def test_a_bound_sigstore_bundle_that_cannot_be_checked_here_is_a_note(
    resealed: Resealed, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without sigstore-python (and no identity asked for) the signer is unknown: said, not a problem."""
    bind_sigstore_bundle(resealed, FakeSigstore())
    monkeypatch.setattr(keyless, "require", without_sigstore)
    report = verify_folder(resealed.root, trust.build(key_files=[resealed.public]), keyless.KeylessPolicy())
    assert problems_of(report) == []
    assert report.notes == [
        f"{layout.SIGSTORE_BUNDLE}: Sigstore bundle bound to the signed run statement, but its signer was NOT "
        f"verified ({NOT_INSTALLED})"
    ]
    assert [(c.bundle, c.verified) for c in report.keyless] == [(layout.SIGSTORE_BUNDLE, False)]


def test_a_pinned_signature_over_the_archive_vouches_for_the_key_inside(
    archive: tuple[Path, Path, FakeSigstore],
) -> None:
    path, root, _ = archive
    report = verify_path(path, trust.build(), keyless.KeylessPolicy(IDENTITY, trust_root=root))
    assert problems_of(report) == [] and report.target == path
    assert report.signers == {FINGERPRINT} and report.envelopes == ENVELOPES
    assert report.trust is not None
    assert report.trust.vouched_by == f"the Sigstore signature of difflab-ci.tar.gz by {IDENTITY}"
    assert [(c.bundle, c.verified, c.identity_pinned, c.signer) for c in report.keyless] == [
        (SIGNATURE, True, True, IDENTITY)
    ]


def test_an_unpinned_signature_over_the_archive_vouches_for_nothing(archive: tuple[Path, Path, FakeSigstore]) -> None:
    path, root, _ = archive
    report = verify_path(path, trust.build(), keyless.KeylessPolicy(trust_root=root))
    assert problems_of(report) == [
        f"{layout.PUBLIC_KEY}: signed with a key you have not trusted (trust: {NOTHING_TRUSTED}). The bundle names "
        f"its key as (untrusted: {FINGERPRINT}): anyone who can change the bundle can change that too. Get the "
        "fingerprint the publisher published through another channel and pass that with --fingerprint, or pass "
        "--key with their public key"
    ]
    assert report.trust is not None and report.trust.vouched_by is None
    assert [(c.bundle, c.verified, c.identity_pinned) for c in report.keyless] == [(SIGNATURE, True, False)]


def test_a_signature_over_other_bytes_is_a_problem_named_after_its_file(
    archive: tuple[Path, Path, FakeSigstore],
) -> None:
    path, root, instance = archive
    (path.parent / SIGNATURE).write_text(instance.sign_artifact(b"another archive"))
    policy = keyless.KeylessPolicy(IDENTITY, trust_root=root)
    report = verify_path(path, trust.build(fingerprints=[FINGERPRINT]), policy)
    assert problems_of(report) == [f"{SIGNATURE}: Sigstore signature does not verify: Bundle message digest mismatch"]


def test_a_sigstore_bundle_given_by_path_is_the_one_checked(
    archive: tuple[Path, Path, FakeSigstore], tmp_path: Path
) -> None:
    path, root, _ = archive
    given = tmp_path / "elsewhere" / "release.sigstore.json"
    given.parent.mkdir()
    (path.parent / SIGNATURE).rename(given)
    report = verify_path(path, trust.build(), keyless.KeylessPolicy(IDENTITY, trust_root=root), sigstore_bundle=given)
    assert problems_of(report) == []
    assert [(c.bundle, c.verified) for c in report.keyless] == [("release.sigstore.json", True)]


def test_without_a_trust_policy_no_sigstore_bundle_is_looked_for(
    archive: tuple[Path, Path, FakeSigstore], tmp_path: Path
) -> None:
    """Integrity only: neither a signature beside the archive, a given one, nor an asked-for identity counts."""
    path, root, _ = archive
    policy = keyless.KeylessPolicy(IDENTITY, trust_root=root)
    report = verify_path(path, None, policy, sigstore_bundle=tmp_path / "none.sigstore.json")
    assert problems_of(report) == [] and report.keyless == []
    assert report.notes == ["signatures not checked (integrity against SHA256SUMS only)"]


def test_an_identity_asked_for_with_no_signature_anywhere(archive: tuple[Path, Path, FakeSigstore]) -> None:
    path, root, _ = archive
    (path.parent / SIGNATURE).unlink()
    report = verify_path(
        path, trust.build(fingerprints=[FINGERPRINT]), keyless.KeylessPolicy(IDENTITY, trust_root=root)
    )
    assert problems_of(report) == [
        f"{SIGNATURE}: missing: --sigstore-identity asks for a Sigstore signature, and there is none (beside the "
        f"archive, as --sigstore-bundle FILE, or inside as {layout.SIGSTORE_BUNDLE})"
    ]
    assert report.keyless == []


def test_a_sigstore_bundle_for_a_folder_is_refused(published: Path, archive: tuple[Path, Path, FakeSigstore]) -> None:
    path, _, _ = archive
    with pytest.raises(ConfigError) as raised:
        verify_path(published, trust.build(), keyless.KeylessPolicy(), sigstore_bundle=path.parent / SIGNATURE)
    assert str(raised.value) == f"--sigstore-bundle: {published} is a folder; a Sigstore bundle signs an archive"


def test_the_archive_is_unpacked_within_the_limit_given(archive: tuple[Path, Path, FakeSigstore]) -> None:
    path, _, _ = archive
    with pytest.raises(VerificationFailed) as raised:
        verify_path(path, trust.build(fingerprints=[FINGERPRINT]), max_bytes=1000)
    assert str(raised.value) == (
        f"{path}: unpacks to more than 0 MiB (reached at upstream/REPRODUCE.md); refusing it. If the bundle is "
        "genuine, raise the limit with --max-unpacked-mib"
    )
