"""Offline verification of a bundle: files against SHA256SUMS, envelopes against trusted keys,
statements against the files. Reads and hashes only; nothing from the bundle is imported or run.

Every problem found is reported (not just the first), each naming the file it concerns.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from difflab.bundle import checksums, dsse, keyless, keys, layout, pack, statements
from difflab.bundle.problems import Problem
from difflab.bundle.trust import TrustPolicy
from difflab.errors import ConfigError
from difflab.files.names import has_controls


@dataclass
class VerifyReport:
    """Outcome of one verification; ``ok`` only when no problem was found."""

    target: Path
    files: int = 0
    envelopes: list[str] = field(default_factory=list)
    signers: set[str] = field(default_factory=set)
    problems: list[Problem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    keyless: list[keyless.KeylessCheck] = field(default_factory=list)
    trust: TrustPolicy | None = None

    @property
    def ok(self) -> bool:
        return not self.problems

    def failure_message(self) -> str:
        lines = [f"{self.target} does not verify ({len(self.problems)} problem(s)):"]
        lines += [f"  {problem}" for problem in self.problems]
        return "\n".join(lines)


def verify_path(
    path: Path,
    trust: TrustPolicy | None,
    sigstore: keyless.KeylessPolicy | None = None,
    sigstore_bundle: Path | None = None,
    max_bytes: int = pack.DEFAULT_MAX_UNPACKED,
) -> VerifyReport:
    """Verify a run folder or a packed archive (unpacked safely into a temporary folder).

    ``trust=None`` checks files against SHA256SUMS only; it is for ``reproduce --skip-signatures``.
    A Sigstore bundle over the archive (``sigstore_bundle``, else ``ARCHIVE.sigstore.json``) is checked
    first; verified against a pinned identity, it vouches for the keys the archive carries.
    """
    sigstore = sigstore or keyless.KeylessPolicy()
    checks: list[keyless.KeylessCheck] = []
    problems: list[Problem] = []
    if sigstore_bundle is not None and path.is_dir():
        raise ConfigError(f"--sigstore-bundle: {path} is a folder; a Sigstore bundle signs an archive")
    bundle = keyless.artifact_bundle(path, sigstore_bundle) if trust is not None else None
    if bundle is not None and trust is not None:
        check = keyless.verify_artifact(path, bundle, sigstore)
        checks.append(check)
        if check.failure:
            problems.append(Problem(bundle.name, f"Sigstore signature does not verify: {check.failure}"))
        elif check.verified and check.identity_pinned:
            trust = trust.vouch(f"the Sigstore signature of {path.name} by {sigstore.identity}")
    with pack.opened(path, max_bytes) as root:
        report = verify_folder(root, trust, sigstore)
    report.target = path
    report.keyless[:0] = checks
    if sigstore.identity and trust is not None and not report.keyless:
        problems.append(
            Problem(
                f"{path.name}{keyless.BUNDLE_SUFFIX}",
                f"missing: --sigstore-identity asks for a Sigstore signature, and there is none (beside the "
                f"archive, as --sigstore-bundle FILE, or inside as {layout.SIGSTORE_BUNDLE})",
            )
        )
    report.problems = sorted(set(report.problems) | set(problems))
    return report


@dataclass(frozen=True)
class _Folder:
    """A bundle folder as read: its files, the digests SHA256SUMS lists and those the files have."""

    root: Path
    files: list[str]
    listed: dict[str, str]
    actual: dict[str, str]


def verify_folder(root: Path, trust: TrustPolicy | None, sigstore: keyless.KeylessPolicy | None = None) -> VerifyReport:
    report = VerifyReport(target=root, trust=trust)
    problems = report.problems
    listing = layout.scan(root)
    problems += [Problem(rel, "is a link or special file; bundles hold plain files") for rel in listing.odd]
    problems += [
        Problem(rel, "file name holds control characters; a bundle never does (shown escaped)")
        for rel in listing.files
        if has_controls(rel)
    ]
    report.files = len(listing.files)
    if layout.CHECKSUMS not in listing.files:
        problems.append(Problem(layout.CHECKSUMS, "missing: this is not a sealed bundle"))
        return report
    try:
        sums_text = (root / layout.CHECKSUMS).read_text(encoding="utf-8")
    except UnicodeDecodeError:
        problems.append(Problem(layout.CHECKSUMS, "is not UTF-8 text"))
        return report
    listed, parse_problems = checksums.parse(sums_text)
    problems += parse_problems
    actual = checksums.digests(root, [f for f in listing.files if f != layout.CHECKSUMS])
    folder = _Folder(root, listing.files, listed, actual)
    carried, key_problems = _carried_keys(root, listing.files)
    problems += key_problems
    if trust is None:
        report.notes.append("signatures not checked (integrity against SHA256SUMS only)")
        report.envelopes = [rel for rel in listing.files if _is_envelope(rel)]
        problems += checksums.compare(listed, _listable(actual, 2 if layout.CHECKSUMS_ENVELOPE in actual else 1))
    else:
        problems += _signed_problems(folder, trust, carried, report, sigstore)
    report.problems = sorted(set(problems))
    return report


def _signed_problems(
    folder: _Folder,
    trust: TrustPolicy,
    carried: Mapping[str, Ed25519PublicKey],
    report: VerifyReport,
    sigstore: keyless.KeylessPolicy | None,
) -> list[Problem]:
    """What the signatures say: the envelopes the trusted keys open, the run and checksum statements, Sigstore."""
    root, files, actual = folder.root, folder.files, folder.actual
    problems: list[Problem] = []
    payloads: dict[str, bytes] = {}
    trusted = trust.select(carried)
    if trusted:
        verified = _open_envelopes(root, files, trusted, report, payloads)
    else:
        problems.append(_no_trust_problem(carried, trust))
        report.envelopes = [rel for rel in files if _is_envelope(rel)]
        verified = {}
    if layout.RUN_ENVELOPE not in files:
        problems.append(Problem(layout.RUN_ENVELOPE, "missing: the bundle has no signed run statement"))
    fmt = _bundle_format(verified.get(layout.RUN_ENVELOPE), actual)
    problems += checksums.compare(folder.listed, _listable(actual, fmt))
    if layout.RUN_ENVELOPE in verified:
        problems += _check_run_statement(verified[layout.RUN_ENVELOPE], actual, fmt)
    if fmt >= 2:
        problems += _check_checksums_statement(root, verified, files)
    problems += _check_fix_statements(root, files, verified, actual)
    if layout.SIGSTORE_BUNDLE in actual and fmt >= 2:
        problems += _sigstore_problems(root, payloads.get(layout.RUN_ENVELOPE), report, sigstore)
    return problems


def _sigstore_problems(
    root: Path, run_payload: bytes | None, report: VerifyReport, sigstore: keyless.KeylessPolicy | None
) -> list[Problem]:
    """A carried Sigstore bundle: bound to the signed run statement, and its signer verified (or said not to be)."""
    binding = _check_sigstore(root, run_payload)
    if binding:
        return binding
    check = keyless.verify_statement(
        root / layout.SIGSTORE_BUNDLE, layout.SIGSTORE_BUNDLE, run_payload, sigstore or keyless.KeylessPolicy()
    )
    report.keyless.append(check)
    if check.failure:
        return [Problem(layout.SIGSTORE_BUNDLE, f"Sigstore signature does not verify: {check.failure}")]
    if not check.verified:
        report.notes.append(
            f"{layout.SIGSTORE_BUNDLE}: Sigstore bundle bound to the signed run statement, but its signer "
            "was NOT verified (" + "; ".join(check.not_checked) + ")"
        )
    return []


def _listable(actual: Mapping[str, str], fmt: int) -> dict[str, str]:
    """The files SHA256SUMS must list: all but itself, and (format 2) the statement that signs it."""
    return {rel: d for rel, d in actual.items() if fmt < 2 or rel not in layout.OUTSIDE_CHECKSUMS}


def _bundle_format(run_statement: Mapping[str, Any] | None, actual: Mapping[str, str]) -> int:
    """The format the signed run statement declares; unverified, assume the newest (its checks still fail)."""
    if run_statement is None:
        return 2 if layout.CHECKSUMS_ENVELOPE in actual else 1
    build_type = ((run_statement.get("predicate") or {}).get("buildDefinition") or {}).get("buildType")
    return statements.BUNDLE_FORMATS.get(str(build_type), 2)


def _check_checksums_statement(root: Path, verified: Mapping[str, dict[str, Any]], files: list[str]) -> list[Problem]:
    """Format 2: SHA256SUMS is itself signed, by the statement written last."""
    rel_env = layout.CHECKSUMS_ENVELOPE
    if rel_env not in files:
        return [Problem(rel_env, f"missing: {layout.CHECKSUMS} is not signed (the run statement says it must be)")]
    statement = verified.get(rel_env)
    if statement is None:
        return []  # its signature failed: already a problem
    if statement.get("predicateType") != statements.CHECKSUMS_LIST:
        return [Problem(rel_env, f"predicateType is not {statements.CHECKSUMS_LIST}")]
    subjects = {s.get("name"): (s.get("digest") or {}).get("sha256") for s in statement["subject"]}
    if set(subjects) != {layout.CHECKSUMS}:
        return [Problem(rel_env, f"names {sorted(map(str, subjects))}, not just {layout.CHECKSUMS}")]
    if checksums.sha256_file(root / layout.CHECKSUMS) != subjects[layout.CHECKSUMS]:
        return [Problem(layout.CHECKSUMS, f"sha256 does not match the signed checksums statement ({rel_env})")]
    return []


def _check_sigstore(root: Path, run_payload: bytes | None) -> list[Problem]:
    """The Sigstore bundle must sign exactly the run statement (its signer is checked by :mod:`keyless`)."""
    rel = layout.SIGSTORE_BUNDLE
    try:
        envelope = keyless.dsse_envelope((root / rel).read_bytes())
    except ValueError as exc:
        return [Problem(rel, f"not a Sigstore bundle over a DSSE envelope ({exc}); unbound, so not accepted")]
    if run_payload is None:
        return [Problem(rel, f"cannot be bound: {layout.RUN_ENVELOPE} did not verify")]
    if envelope.payload_type != dsse.IN_TOTO_PAYLOAD or envelope.payload != run_payload:
        return [Problem(rel, f"signs something other than the run statement in {layout.RUN_ENVELOPE}; unbound")]
    return []


def _is_envelope(rel: str) -> bool:
    return rel.startswith(f"{layout.ATTESTATIONS}/") and rel.endswith(layout.ENVELOPE_SUFFIX)


def _carried_keys(root: Path, files: list[str]) -> tuple[dict[str, Ed25519PublicKey], list[Problem]]:
    """Public keys shipped in ``keys/``: material only, used if (and only if) the user pinned them."""
    found: dict[str, Ed25519PublicKey] = {}
    problems = []
    for rel in files:
        if rel.startswith(f"{layout.KEYS}/") and rel.endswith(".pub"):
            try:
                public = keys.load_public_key((root / rel).read_bytes(), rel)
            except ConfigError as exc:
                problems.append(Problem(rel, str(exc).removeprefix(f"{rel}: ")))
                continue
            found[keys.fingerprint(public)] = public
    return found, problems


def _no_trust_problem(carried: Mapping[str, Ed25519PublicKey], trust: TrustPolicy) -> Problem:
    if carried:
        fps = ", ".join(sorted(carried))
        return Problem(
            layout.PUBLIC_KEY,
            f"signed with a key you have not trusted (trust: {trust.describe()}). The bundle names its key "
            f"as (untrusted: {fps}): anyone who can change the bundle can change that too. Get the "
            "fingerprint the publisher published through another channel and pass that with --fingerprint, "
            "or pass --key with their public key",
        )
    return Problem(layout.KEYS, f"no trusted key to check signatures with (trust: {trust.describe()})")


def _open_envelopes(
    root: Path,
    files: list[str],
    trusted: Mapping[str, Ed25519PublicKey],
    report: VerifyReport,
    payloads: dict[str, bytes],
) -> dict[str, dict[str, Any]]:
    """Verified statements by envelope path; failures become problems naming the envelope."""
    verified: dict[str, dict[str, Any]] = {}
    for rel in files:
        if not _is_envelope(rel):
            continue
        report.envelopes.append(rel)
        try:
            opened = dsse.open_envelope((root / rel).read_bytes(), trusted)
        except dsse.EnvelopeError as exc:
            report.problems.append(Problem(rel, str(exc)))
            continue
        if opened.payload_type != dsse.IN_TOTO_PAYLOAD:
            message = f"payloadType {opened.payload_type!r} is not {dsse.IN_TOTO_PAYLOAD}"
            report.problems.append(Problem(rel, message))
            continue
        try:
            verified[rel] = statements.parse(opened.payload)
        except ValueError as exc:
            report.problems.append(Problem(rel, str(exc)))
            continue
        payloads[rel] = opened.payload
        report.signers.add(opened.signer)
    return verified


def _check_run_statement(statement: Mapping[str, Any], actual: Mapping[str, str], fmt: int) -> list[Problem]:
    """Every subject matches its file, and every file (bar those written after signing) is a subject."""
    rel_env = layout.RUN_ENVELOPE
    problems = []
    if statement.get("predicateType") != statements.SLSA_PROVENANCE:
        problems.append(Problem(rel_env, f"predicateType is not {statements.SLSA_PROVENANCE}"))
    build_type = ((statement.get("predicate") or {}).get("buildDefinition") or {}).get("buildType")
    if build_type not in statements.BUNDLE_FORMATS:
        known = ", ".join(sorted(statements.BUNDLE_FORMATS))
        problems.append(
            Problem(rel_env, f"buildType {build_type!r} is not a bundle format this verifier knows ({known})")
        )
    outside = layout.OUTSIDE_RUN_STATEMENT if fmt >= 2 else layout.OUTSIDE_RUN_STATEMENT_V1
    subjects: dict[str, str] = {}
    for subject in statement["subject"]:
        name, digest = subject.get("name"), subject["digest"].get("sha256")
        if not isinstance(name, str) or not layout.safe_relpath(name):
            problems.append(Problem(rel_env, f"subject with unsafe name {name!r}"))
            continue
        subjects[name] = str(digest)
        if name not in actual:
            problems.append(Problem(name, f"named in the signed run statement ({rel_env}) but missing"))
        elif actual[name] != digest:
            problems.append(Problem(name, f"sha256 does not match its subject in {rel_env} ({digest})"))
    for rel in actual:
        if rel in subjects or rel in outside:
            continue
        if fmt < 2 and rel in layout.OUTSIDE_RUN_STATEMENT:
            message = f"not covered by any signature: bundle format 1 ({rel_env}) signs nothing written after it"
            problems.append(Problem(rel, message))
        else:
            problems.append(Problem(rel, f"not covered by the signed run statement ({rel_env})"))
    return problems


def _load_object(root: Path, rel: str) -> dict[str, Any] | None:
    try:
        value = json.loads((root / rel).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _check_fix_statements(
    root: Path,
    files: list[str],
    verified: Mapping[str, dict[str, Any]],
    actual: Mapping[str, str],
) -> list[Problem]:
    problems = []
    run = _load_object(root, layout.RUN_JSON) or {}
    sources = list((run.get("sources") or {}).values())
    groups = layout.observation_groups(files)
    for (fix, side), obs_files in groups.items():
        rel_env = layout.fix_envelope(fix, side)
        if rel_env not in files:
            folder = f"{layout.OBSERVATIONS}/{fix}/{side}"
            problems.append(Problem(folder, f"no signed statement ({rel_env} missing)"))
        elif rel_env in verified:
            problems += _check_probe_statement(root, rel_env, verified[rel_env], obs_files, actual, sources)
    expected = {layout.fix_envelope(fix, side) for fix, side in groups}
    for rel_env in verified:
        if rel_env not in (layout.RUN_ENVELOPE, layout.CHECKSUMS_ENVELOPE) and rel_env not in expected:
            problems.append(Problem(rel_env, "attests observations that are not in the bundle"))
    return problems


def _check_probe_statement(
    root: Path,
    rel_env: str,
    statement: Mapping[str, Any],
    obs_files: list[str],
    actual: Mapping[str, str],
    sources: list[Any],
) -> list[Problem]:
    """Each probe entry matches its observation and log files by digest and content, and the
    statement's subjects match the sources those observations record."""
    if statement.get("predicateType") != statements.PROBE_RESULTS:
        return [Problem(rel_env, f"predicateType is not {statements.PROBE_RESULTS}")]
    predicate = statement.get("predicate") if isinstance(statement.get("predicate"), dict) else {}
    probes = [p for p in predicate.get("probes") or [] if isinstance(p, dict)]
    entries = {(p.get("observation") or {}).get("name"): p for p in probes}
    problems = [Problem(rel, f"not attested by {rel_env}") for rel in obs_files if rel not in entries]
    subject_digests = [s.get("digest") for s in statement["subject"]]
    for name, entry in entries.items():
        if not isinstance(name, str) or not layout.safe_relpath(name):
            problems.append(Problem(rel_env, f"probe entry with unsafe observation name {name!r}"))
            continue
        for descriptor in (entry.get("observation"), entry.get("log")):
            if isinstance(descriptor, dict):
                problems += _check_descriptor(rel_env, descriptor, actual)
        observation = _load_object(root, name) if name in actual else None
        if observation is not None:
            problems += _check_observation(rel_env, name, entry, observation, subject_digests, actual, sources)
    return problems


def _check_descriptor(rel_env: str, descriptor: Mapping[str, Any], actual: Mapping[str, str]) -> list[Problem]:
    target, digest = str(descriptor.get("name")), (descriptor.get("digest") or {}).get("sha256")
    if target not in actual:
        return [Problem(target, f"attested by {rel_env} but missing")]
    if actual[target] != digest:
        return [Problem(target, f"sha256 does not match the digest attested in {rel_env}")]
    return []


def _check_observation(
    rel_env: str,
    name: str,
    entry: Mapping[str, Any],
    observation: Mapping[str, Any],
    subject_digests: list[Any],
    actual: Mapping[str, str],
    sources: list[Any],
) -> list[Problem]:
    """The observation's recorded source is a subject (by digest) and its results are what is attested."""
    problems = []
    source = observation.get("source") or None
    attested = {"status": observation.get("status"), "fields": observation.get("fields"), "source": source}
    problems += [
        Problem(name, f"{key} differs from what {rel_env} attests")
        for key, value in attested.items()
        if entry.get(key) != value
    ]
    if source is None:
        if {"sha256": actual[name]} not in subject_digests:
            problems.append(Problem(rel_env, f"records no source for {name} and does not name it as subject"))
        return problems
    try:
        expected = statements.source_subjects(source)
    except ValueError as exc:
        return [*problems, Problem(name, f"source: {exc}")]
    for descriptor in expected:
        if descriptor["digest"] not in subject_digests:
            got = "; ".join(json.dumps(d, sort_keys=True) for d in subject_digests)
            problems.append(
                Problem(
                    rel_env,
                    f"subject digest {got} does not match the source recorded in {name} "
                    f"({json.dumps(descriptor['digest'], sort_keys=True)})",
                )
            )
    if sources and source not in sources:
        problems.append(Problem(name, f"source is not one of the sources recorded in {layout.RUN_JSON}"))
    return problems
