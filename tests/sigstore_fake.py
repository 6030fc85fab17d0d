"""A private Sigstore instance in a few keys: CA, CT log and transparency log, all made by the test.

It writes what the public instance would: a Fulcio-shaped leaf certificate (SAN, OIDC issuer
extensions, one embedded SCT over the precertificate), a hashedrekord (artifact) or dsse (statement)
log entry with its inclusion proof, signed checkpoint and signed entry timestamp, all in a v0.3
bundle, plus the ``trusted_root.json`` that names these keys. sigstore-python's own verifier then
checks them exactly as it checks production bundles; nothing is mocked.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
import struct
from dataclasses import dataclass, field
from pathlib import Path

import rfc8785
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID, ObjectIdentifier

ISSUER = "https://token.actions.githubusercontent.com"
IDENTITY = "https://github.com/acme/difflab/.github/workflows/difflab.yml@refs/heads/main"
_OIDC_ISSUER = ObjectIdentifier("1.3.6.1.4.1.57264.1.1")
_OIDC_ISSUER_V2 = ObjectIdentifier("1.3.6.1.4.1.57264.1.8")
_SCT_LIST = ObjectIdentifier("1.3.6.1.4.1.11129.2.4.2")


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _spki(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def _der_length(n: int) -> bytes:
    if n < 0x80:
        return bytes([n])
    body = n.to_bytes((n.bit_length() + 7) // 8, "big")
    return bytes([0x80 | len(body)]) + body


def _octet_string(data: bytes) -> bytes:
    return b"\x04" + _der_length(len(data)) + data


def _utf8_string(text: str) -> bytes:
    data = text.encode()
    return b"\x0c" + _der_length(len(data)) + data


def _u24(n: int) -> bytes:
    return struct.pack("!I", n)[1:]


@dataclass
class FakeSigstore:
    """One CA, one CT log, one transparency log; ``now`` is the signing time of every bundle."""

    now: dt.datetime = field(default_factory=lambda: dt.datetime.now(dt.UTC).replace(microsecond=0))
    ca_key: ec.EllipticCurvePrivateKey = field(default_factory=lambda: ec.generate_private_key(ec.SECP256R1()))
    ct_key: ec.EllipticCurvePrivateKey = field(default_factory=lambda: ec.generate_private_key(ec.SECP256R1()))
    log_key: ec.EllipticCurvePrivateKey = field(default_factory=lambda: ec.generate_private_key(ec.SECP256R1()))

    def __post_init__(self) -> None:
        name = x509.Name(
            [
                x509.NameAttribute(NameOID.ORGANIZATION_NAME, "difflab test"),
                x509.NameAttribute(NameOID.COMMON_NAME, "difflab test CA"),
            ]
        )
        public = self.ca_key.public_key()
        self.ca = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(public)
            .serial_number(x509.random_serial_number())
            .not_valid_before(self.now - dt.timedelta(days=30))
            .not_valid_after(self.now + dt.timedelta(days=3650))
            .add_extension(x509.BasicConstraints(ca=True, path_length=1), critical=True)
            .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
            .sign(self.ca_key, hashes.SHA256())
        )

    # -- the trust root a verifier is given --------------------------------------------------------
    def trusted_root(self) -> dict:
        start = {"start": (self.now - dt.timedelta(days=30)).strftime("%Y-%m-%dT%H:%M:%SZ")}

        def key(k: ec.EllipticCurvePrivateKey) -> dict:
            return {"rawBytes": _b64(_spki(k)), "keyDetails": "PKIX_ECDSA_P256_SHA_256", "validFor": start}

        return {
            "mediaType": "application/vnd.dev.sigstore.trustedroot+json;version=0.1",
            "tlogs": [
                {
                    "baseUrl": "https://rekor.difflab.test",
                    "hashAlgorithm": "SHA2_256",
                    "publicKey": key(self.log_key),
                    "logId": {"keyId": _b64(hashlib.sha256(_spki(self.log_key)).digest())},
                }
            ],
            "certificateAuthorities": [
                {
                    "subject": {"organization": "difflab test", "commonName": "difflab test CA"},
                    "uri": "https://fulcio.difflab.test",
                    "certChain": {
                        "certificates": [{"rawBytes": _b64(self.ca.public_bytes(serialization.Encoding.DER))}]
                    },
                    "validFor": start,
                }
            ],
            "ctlogs": [
                {
                    "baseUrl": "https://ctfe.difflab.test",
                    "hashAlgorithm": "SHA2_256",
                    "publicKey": key(self.ct_key),
                    "logId": {"keyId": _b64(hashlib.sha256(_spki(self.ct_key)).digest())},
                }
            ],
            "timestampAuthorities": [],
        }

    def write_trusted_root(self, path: Path) -> Path:
        path.write_text(json.dumps(self.trusted_root()), encoding="utf-8")
        return path

    # -- a signing certificate as Fulcio issues it -------------------------------------------------
    def _leaf(self, key: ec.EllipticCurvePrivateKey, identity: str, issuer: str) -> x509.Certificate:
        public = key.public_key()
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([]))
            .issuer_name(self.ca.subject)
            .public_key(public)
            .serial_number(x509.random_serial_number())
            .not_valid_before(self.now - dt.timedelta(minutes=1))
            .not_valid_after(self.now + dt.timedelta(minutes=10))
            .add_extension(x509.KeyUsage(True, False, False, False, False, False, False, False, False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CODE_SIGNING]), critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self.ca_key.public_key()), critical=False)
            .add_extension(x509.SubjectAlternativeName([x509.UniformResourceIdentifier(identity)]), critical=True)
            .add_extension(x509.UnrecognizedExtension(_OIDC_ISSUER, issuer.encode()), critical=False)
            .add_extension(x509.UnrecognizedExtension(_OIDC_ISSUER_V2, _utf8_string(issuer)), critical=False)
        )
        precert = builder.sign(self.ca_key, hashes.SHA256())
        issuer_key_hash = hashlib.sha256(_spki(self.ca_key)).digest()
        millis = int(self.now.timestamp() * 1000)
        tbs = precert.tbs_certificate_bytes  # equals the final certificate's TBS without the SCT list
        signed = struct.pack("!BBQH", 0, 0, millis, 1) + issuer_key_hash + _u24(len(tbs)) + tbs + b"\x00\x00"
        sig = self.ct_key.sign(signed, ec.ECDSA(hashes.SHA256()))
        log_id = hashlib.sha256(_spki(self.ct_key)).digest()
        sct = (
            b"\x00" + log_id + struct.pack("!Q", millis) + b"\x00\x00" + b"\x04\x03" + struct.pack("!H", len(sig)) + sig
        )
        sct_list = struct.pack("!H", len(sct) + 2) + struct.pack("!H", len(sct)) + sct
        final = builder.add_extension(x509.UnrecognizedExtension(_SCT_LIST, _octet_string(sct_list)), critical=False)
        return final.sign(self.ca_key, hashes.SHA256())

    # -- the transparency log entry ----------------------------------------------------------------
    def _tlog_entry(self, body: dict, kind: str) -> dict:
        canonical = rfc8785.dumps(body)
        log_id = hashlib.sha256(_spki(self.log_key)).digest()
        integrated = int(self.now.timestamp())
        leaf = hashlib.sha256(b"\x00" + canonical).digest()  # a log of one entry: its root is the leaf hash
        origin = "rekor.difflab.test - 1"
        note = f"{origin}\n1\n{_b64(leaf)}\n"
        note_sig = self.log_key.sign(note.encode(), ec.ECDSA(hashes.SHA256()))
        checkpoint = f"{note}\n\u2014 rekor.difflab.test {_b64(log_id[:4] + note_sig)}\n"
        promise = rfc8785.dumps(
            {"body": _b64(canonical), "integratedTime": integrated, "logID": log_id.hex(), "logIndex": 0}
        )
        return {
            "logIndex": "0",
            "logId": {"keyId": _b64(log_id)},
            "kindVersion": {"kind": kind, "version": "0.0.1"},
            "integratedTime": str(integrated),
            "inclusionPromise": {"signedEntryTimestamp": _b64(self.log_key.sign(promise, ec.ECDSA(hashes.SHA256())))},
            "inclusionProof": {
                "logIndex": "0",
                "rootHash": _b64(leaf),
                "treeSize": "1",
                "hashes": [],
                "checkpoint": {"envelope": checkpoint},
            },
            "canonicalizedBody": _b64(canonical),
        }

    def sign_artifact(self, data: bytes, identity: str = IDENTITY, issuer: str = ISSUER) -> str:
        """A v0.3 bundle over ``data`` (as ``sigstore sign FILE`` writes ``FILE.sigstore.json``)."""
        key = ec.generate_private_key(ec.SECP256R1())
        cert = self._leaf(key, identity, issuer)
        digest = hashlib.sha256(data).digest()
        signature = key.sign(data, ec.ECDSA(hashes.SHA256()))
        pem = cert.public_bytes(serialization.Encoding.PEM)
        body = {
            "apiVersion": "0.0.1",
            "kind": "hashedrekord",
            "spec": {
                "data": {"hash": {"algorithm": "sha256", "value": digest.hex()}},
                "signature": {"content": _b64(signature), "publicKey": {"content": _b64(pem)}},
            },
        }
        return json.dumps(
            {
                "mediaType": "application/vnd.dev.sigstore.bundle.v0.3+json",
                "verificationMaterial": {
                    "certificate": {"rawBytes": _b64(cert.public_bytes(serialization.Encoding.DER))},
                    "tlogEntries": [self._tlog_entry(body, "hashedrekord")],
                },
                "messageSignature": {
                    "messageDigest": {"algorithm": "SHA2_256", "digest": _b64(digest)},
                    "signature": _b64(signature),
                },
            }
        )

    def sign_statement(self, payload: bytes, identity: str = IDENTITY, issuer: str = ISSUER) -> str:
        """A v0.3 bundle holding a DSSE envelope over an in-toto statement (as sealing writes it)."""
        key = ec.generate_private_key(ec.SECP256R1())
        cert = self._leaf(key, identity, issuer)
        payload_type = "application/vnd.in-toto+json"
        pae = b"DSSEv1 %d %b %d %b" % (len(payload_type), payload_type.encode(), len(payload), payload)
        signature = key.sign(pae, ec.ECDSA(hashes.SHA256()))
        envelope = {"payload": _b64(payload), "payloadType": payload_type, "signatures": [{"sig": _b64(signature)}]}
        pem = cert.public_bytes(serialization.Encoding.PEM)
        body = {
            "apiVersion": "0.0.1",
            "kind": "dsse",
            "spec": {
                "envelopeHash": {
                    "algorithm": "sha256",
                    "value": hashlib.sha256(json.dumps(envelope).encode()).hexdigest(),
                },
                "payloadHash": {"algorithm": "sha256", "value": hashlib.sha256(payload).hexdigest()},
                "signatures": [{"signature": _b64(signature), "verifier": _b64(pem)}],
            },
        }
        return json.dumps(
            {
                "mediaType": "application/vnd.dev.sigstore.bundle.v0.3+json",
                "verificationMaterial": {
                    "certificate": {"rawBytes": _b64(cert.public_bytes(serialization.Encoding.DER))},
                    "tlogEntries": [self._tlog_entry(body, "dsse")],
                },
                "dsseEnvelope": envelope,
            }
        )
