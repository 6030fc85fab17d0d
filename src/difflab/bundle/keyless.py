"""Keyless (Sigstore) signatures: made inside GitHub Actions, checked offline by ``difflab verify``.

Two kinds are met: ``attestations/run.sigstore.json`` (sealing signs the run statement when it runs
in GitHub Actions with an OIDC token) and ``<archive>.sigstore.json`` beside a packed bundle (the CI
workflow signs the tarball ``difflab pack`` wrote). The Ed25519 envelope is always written and is
what the rest of the bundle check rests on; a Sigstore signature adds who signed, from the
certificate's identity, and a transparency-log entry.

Verification is offline: sigstore-python checks the certificate chain, the embedded SCT, the
signature, the log entry's inclusion proof, signed checkpoint and signed entry timestamp against a
trust root on disk (sigstore-python's production root from its local cache, seeded from the copy it
ships; or ``--sigstore-trust-root``). Nothing is looked up online, and the report says so.
sigstore-python is an optional dependency (the ``sigstore`` extra), imported only here, only when used.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import datetime as dt
import hashlib
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from difflab.errors import ConfigError
from difflab.extras import MissingExtra, install_hint, require
from difflab.files.names import argument_path

INSTALL_HINT = install_hint("sigstore")
GITHUB_ISSUER = "https://token.actions.githubusercontent.com"
BUNDLE_SUFFIX = ".sigstore.json"
PURPOSE = "checking a Sigstore signature"
_OIDC_ISSUER_OIDS = ("1.3.6.1.4.1.57264.1.1", "1.3.6.1.4.1.57264.1.8")


@dataclass(frozen=True)
class BundledEnvelope:
    """The DSSE envelope inside a Sigstore bundle: what it claims to sign (its signature is not checked here)."""

    payload_type: str
    payload: bytes


def dsse_envelope(data: bytes) -> BundledEnvelope:
    """Read a Sigstore bundle's ``dsseEnvelope`` without sigstore-python; ValueError if there is none."""
    try:
        bundle = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"not JSON: {exc}") from None
    envelope = bundle.get("dsseEnvelope") if isinstance(bundle, dict) else None
    if not isinstance(envelope, dict):
        raise ValueError("no dsseEnvelope")
    payload_type, payload = envelope.get("payloadType"), envelope.get("payload")
    if not isinstance(payload_type, str) or not isinstance(payload, str):
        raise ValueError("dsseEnvelope without payloadType or payload")
    if not envelope.get("signatures"):
        raise ValueError("dsseEnvelope carries no signature")
    try:
        return BundledEnvelope(payload_type, base64.b64decode(payload, validate=True))
    except (binascii.Error, ValueError):
        raise ValueError("dsseEnvelope payload is not base64") from None


# -- signing ------------------------------------------------------------------------------------------
def available(environ: Mapping[str, str]) -> bool:
    """GitHub Actions with an OIDC token we may request (workflow has ``permissions: id-token: write``)."""
    return environ.get("GITHUB_ACTIONS") == "true" and bool(environ.get("ACTIONS_ID_TOKEN_REQUEST_URL"))


def _signing_context(signing_context: Any) -> Any:
    """Production Sigstore, across sigstore-python 3.x (``production()``) and 4.x (trust config)."""
    try:
        from sigstore.models import ClientTrustConfig
    except ImportError:
        return signing_context.production()
    return signing_context.from_trust_config(ClientTrustConfig.production())


def sign(payload: bytes, out: Path, echo: Callable[[str], None]) -> Path | None:
    """Sign the statement bytes with the ambient OIDC identity; write a Sigstore bundle or say why not."""
    try:
        from sigstore.dsse import Statement
        from sigstore.oidc import IdentityToken, detect_credential
        from sigstore.sign import SigningContext
    except ImportError:
        echo(f"sigstore is not installed; skipping the keyless signature ({INSTALL_HINT})")
        return None
    try:
        token = detect_credential()
        if not token:
            echo("no OIDC identity token available; skipping the keyless signature")
            return None
        with _signing_context(SigningContext).signer(IdentityToken(token)) as signer:
            result = signer.sign_dsse(Statement(payload))
    except Exception as exc:  # network or identity trouble must not lose the run; Ed25519 still signs it
        echo(f"keyless signing failed, keeping the Ed25519 signature only: {exc}")
        return None
    out.write_text(result.to_json(), encoding="utf-8")
    echo(f"keyless Sigstore signature written to {out.name}")
    return out


# -- what a verifier asks for, and what it learns -------------------------------------------------------
@dataclass(frozen=True)
class KeylessPolicy:
    """Who must have signed (``identity``: the certificate's SAN, e.g. a workflow ref) and the trust root."""

    identity: str | None = None
    issuer: str = GITHUB_ISSUER
    trust_root: Path | None = None


@dataclass
class KeylessCheck:
    """One Sigstore bundle: verified or not, with exactly what was and was not established."""

    bundle: str
    verified: bool = False
    identity_pinned: bool = False
    signer: str | None = None
    checked: list[str] = field(default_factory=list)
    not_checked: list[str] = field(default_factory=list)
    failure: str | None = None  # verification ran and refused the bundle: a problem, not a note

    def lines(self) -> list[str]:
        if self.failure:
            return [f"sigstore {self.bundle}: does not verify: {self.failure}"]
        if not self.verified:
            return [f"sigstore {self.bundle}: not verified: {'; '.join(self.not_checked)}"]
        out = [f"sigstore {self.bundle}: verified offline"]
        out += [f"  checked: {c}" for c in self.checked]
        out += [f"  not checked: {c}" for c in self.not_checked]
        return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "keyless signature (Sigstore; checked offline with the sigstore extra: " + INSTALL_HINT + ")"
    )
    group.add_argument(
        "--sigstore-bundle",
        type=argument_path,
        metavar="FILE",
        help=f"Sigstore bundle over the archive (default: ARCHIVE{BUNDLE_SUFFIX} when it exists)",
    )
    group.add_argument(
        "--sigstore-identity",
        metavar="URI",
        help="the signer the certificate must name, e.g. "
        "https://github.com/OWNER/REPO/.github/workflows/difflab.yml@refs/heads/main; once it verifies, "
        "the Ed25519 key inside the archive is trusted for this archive",
    )
    group.add_argument(
        "--sigstore-issuer",
        default=GITHUB_ISSUER,
        metavar="URL",
        help="OIDC issuer the certificate must name (default: %(default)s)",
    )
    group.add_argument(
        "--sigstore-trust-root",
        type=argument_path,
        metavar="FILE",
        help="trusted_root.json to verify against (default: sigstore-python's production root, offline)",
    )


def policy_from_args(args: argparse.Namespace) -> KeylessPolicy:
    return KeylessPolicy(args.sigstore_identity, args.sigstore_issuer, args.sigstore_trust_root)


def artifact_bundle(archive: Path, explicit: Path | None) -> Path | None:
    """The bundle to check for ``archive``: the one given, else ``ARCHIVE.sigstore.json`` if present."""
    if explicit is not None:
        if not explicit.is_file():
            raise ConfigError(f"{explicit}: no such Sigstore bundle")
        return explicit
    sibling = archive.with_name(archive.name + BUNDLE_SUFFIX)
    return sibling if archive.is_file() and sibling.is_file() else None


# -- verifying ---------------------------------------------------------------------------------------------
class _Unavailable(Exception):
    """Verification cannot be attempted here; the message says why."""


def _verifier(policy: KeylessPolicy) -> tuple[Any, str, str | None]:
    """(sigstore Verifier, how its trust root is described, a caveat about that root or None)."""
    sigstore = require("sigstore", PURPOSE)
    from sigstore.models import ClientTrustConfig, TrustedRoot
    from sigstore.verify import Verifier

    logging.getLogger("sigstore").setLevel(logging.ERROR)  # its offline-mode warning is said below, in words
    if policy.trust_root is not None:
        try:
            data = policy.trust_root.read_bytes()
            root = TrustedRoot.from_file(str(policy.trust_root))
        except OSError as exc:
            raise ConfigError(f"{policy.trust_root}: cannot read the trust root ({exc.strerror})") from None
        except Exception as exc:  # sigstore raises pydantic and its own errors for a malformed root
            raise ConfigError(f"{policy.trust_root}: not a Sigstore trusted_root.json ({exc})") from None
        digest = hashlib.sha256(data).hexdigest()
        return Verifier(trusted_root=root), f"the trust root {policy.trust_root} (sha256 {digest[:16]}…)", None
    try:
        root = ClientTrustConfig.production(offline=True).trusted_root
    except Exception as exc:  # e.g. an unwritable cache folder or a corrupt cached root
        raise _Unavailable(f"sigstore-python's production trust root cannot be loaded offline ({exc})") from None
    described = f"sigstore-python {sigstore.__version__}'s production trust root"
    caveat = (
        f"trust-root freshness: {described} was used as cached or shipped, not refreshed over the network "
        "(a key rotated since would need `python -m sigstore` online once, or --sigstore-trust-root)"
    )
    return Verifier(trusted_root=root), described, caveat


def _policy(policy: KeylessPolicy) -> Any:
    from sigstore.verify import policy as sigstore_policy

    if policy.identity:
        return sigstore_policy.Identity(identity=policy.identity, issuer=policy.issuer)
    return sigstore_policy.UnsafeNoOp()  # the signature still verifies; the report says nobody was pinned


def _signer(cert: Any) -> tuple[str, str]:
    """(identities in the certificate's SAN, its OIDC issuer) as the certificate states them."""
    from cryptography import x509

    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        names = [str(v) for v in san.get_values_for_type(x509.UniformResourceIdentifier)]
        names += [str(v) for v in san.get_values_for_type(x509.RFC822Name)]
    except x509.ExtensionNotFound:
        names = []
    issuer = "unknown issuer"
    for oid in _OIDC_ISSUER_OIDS:
        try:
            raw = cert.extensions.get_extension_for_oid(x509.ObjectIdentifier(oid)).value.value
        except x509.ExtensionNotFound:
            continue
        issuer = raw[2:].decode(errors="replace") if raw[:1] == b"\x0c" else raw.decode(errors="replace")
        break
    return ", ".join(names) or "no identity", issuer


@dataclass(frozen=True)
class _Entry:
    """What the bundle's JSON says about its log entry and timestamps (verified by sigstore, described here)."""

    index: str = "?"
    log: str = "?"
    integrated: str | None = None  # Rekor v1: the log's integrated time, bound by the signed entry timestamp
    promise: bool = False
    timestamps: int = 0  # RFC 3161 timestamps (Rekor v2 bundles carry these instead)

    @classmethod
    def read(cls, raw: bytes) -> _Entry:
        try:
            material = json.loads(raw)["verificationMaterial"]
            entry = material["tlogEntries"][0]
            seconds = int(entry.get("integratedTime") or 0)
            stamps = (material.get("timestampVerificationData") or {}).get("rfc3161Timestamps") or []
            return cls(
                index=str(entry.get("logIndex", "?")),
                log=base64.b64decode(entry["logId"]["keyId"]).hex()[:16] + "…",
                integrated=dt.datetime.fromtimestamp(seconds, dt.UTC).isoformat() if seconds else None,
                promise=bool(entry.get("inclusionPromise")),
                timestamps=len(stamps),
            )
        except (KeyError, IndexError, TypeError, ValueError):
            return cls()

    def when(self) -> str:
        sources = []
        if self.integrated and self.promise:
            sources.append(f"the log's integrated time {self.integrated} (bound by its signed entry timestamp)")
        if self.timestamps:
            sources.append(
                f"{self.timestamps} RFC 3161 timestamp(s) signed by a timestamp authority of that trust root"
            )
        return " and ".join(sources) or "the bundle's verified time"

    def proof(self) -> str:
        promise = " and its signed entry timestamp" if self.promise else ""
        return (
            f"transparency log entry {self.index} of log {self.log}: Merkle inclusion proof against a checkpoint "
            f"signed by the log's key{promise}; the entry's body matches this signature and certificate"
        )


def _not_installed(name: str, policy: KeylessPolicy) -> KeylessCheck:
    if policy.identity:  # asked for by name: the run cannot do what it was told
        raise MissingExtra("sigstore", f"--sigstore-identity ({PURPOSE})")
    return KeylessCheck(name, not_checked=[f"sigstore-python is not installed ({INSTALL_HINT})"])


def _run(
    name: str, raw: bytes, policy: KeylessPolicy, what: str, verify: Callable[[Any, Any, Any], list[str]]
) -> KeylessCheck:
    """Shared frame: load, verify with ``verify(verifier, bundle, policy)``, then describe the result."""
    try:
        verifier, described, caveat = _verifier(policy)
    except MissingExtra:
        return _not_installed(name, policy)
    except _Unavailable as exc:
        return KeylessCheck(name, not_checked=[str(exc)])
    from sigstore.errors import Error as SigstoreError
    from sigstore.models import Bundle

    check = KeylessCheck(name, identity_pinned=bool(policy.identity))
    try:
        bundle = Bundle.from_json(raw)
    except (SigstoreError, ValueError) as exc:
        check.failure = f"not a Sigstore bundle ({exc})"
        return check
    try:
        extra = verify(verifier, bundle, _policy(policy))
    except SigstoreError as exc:
        check.failure = str(exc) or type(exc).__name__
        return check
    signer, issuer = _signer(bundle.signing_certificate)
    entry = _Entry.read(raw)
    check.verified, check.signer = True, signer
    check.checked = [
        f"the signing certificate chains to a Fulcio CA of {described} and was valid at {entry.when()}",
        "its embedded certificate timestamp (SCT) is signed by a CT log of that trust root",
        f"signer {signer} (OIDC issuer {issuer})"
        + (" is the identity you pinned" if policy.identity else ", as the certificate states it"),
        what,
        *extra,
        entry.proof(),
    ]
    if not policy.identity:
        check.not_checked.append(
            "who signed: no identity pinned (pass --sigstore-identity URI), so any Sigstore identity passes"
        )
    check.not_checked.append(
        "the live log: offline, the entry is proven by the bundle's own inclusion proof and signed checkpoint, "
        "not looked up (whether today's log still holds it is not checked)"
    )
    if caveat:
        check.not_checked.append(caveat)
    return check


def verify_artifact(archive: Path, bundle_path: Path, policy: KeylessPolicy) -> KeylessCheck:
    """Check ``bundle_path`` as a signature over the bytes of ``archive`` (``sigstore sign ARCHIVE``)."""
    data = archive.read_bytes()
    digest = hashlib.sha256(data).hexdigest()

    def verify(verifier: Any, bundle: Any, pol: Any) -> list[str]:
        verifier.verify_artifact(data, bundle, pol)
        return []

    what = f"the signature is over {archive.name} as it is here (sha256 {digest})"
    return _run(bundle_path.name, bundle_path.read_bytes(), policy, what, verify)


def verify_statement(bundle_path: Path, name: str, statement: bytes | None, policy: KeylessPolicy) -> KeylessCheck:
    """Check a DSSE bundle over the run statement; ``statement`` is the Ed25519-verified payload, if any."""

    def verify(verifier: Any, bundle: Any, pol: Any) -> list[str]:
        from sigstore.errors import VerificationError

        payload_type, payload = verifier.verify_dsse(bundle, pol)
        if payload_type != "application/vnd.in-toto+json":
            raise VerificationError(f"payloadType {payload_type!r} is not an in-toto statement")
        if statement is None:
            return []
        if payload != statement:
            raise VerificationError("its statement is not the run statement signed with Ed25519")
        return ["its statement is byte for byte the run statement of the Ed25519 envelope"]

    check = _run(name, bundle_path.read_bytes(), policy, "the DSSE envelope's signature over its statement", verify)
    if check.verified and statement is None:
        check.not_checked.append("that its statement is the run statement: that envelope's key is not trusted")
    return check
