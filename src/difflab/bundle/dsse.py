"""DSSE v1 envelopes (secure-systems-lab/dsse) signed with Ed25519.

Kept to the spec: the signature covers PAE(payloadType, payload); the payload is only handed out
after a signature over it has verified with a trusted key.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from difflab.bundle import canonical

IN_TOTO_PAYLOAD = "application/vnd.in-toto+json"


class EnvelopeError(ValueError):
    """The envelope is malformed or no signature on it verifies with a trusted key."""


def pae(payload_type: str, payload: bytes) -> bytes:
    """Pre-Authentication Encoding: ``DSSEv1 SP LEN(type) SP type SP LEN(body) SP body`` (byte lengths)."""
    type_bytes = payload_type.encode("utf-8")
    return b"DSSEv1 %d %s %d %s" % (len(type_bytes), type_bytes, len(payload), payload)


def sign(payload: bytes, key: Ed25519PrivateKey, keyid: str, payload_type: str = IN_TOTO_PAYLOAD) -> dict:
    """A one-signature envelope; Ed25519 is deterministic, so the same input gives the same envelope."""
    signature = key.sign(pae(payload_type, payload))
    return {
        "payload": base64.b64encode(payload).decode("ascii"),
        "payloadType": payload_type,
        "signatures": [{"keyid": keyid, "sig": base64.b64encode(signature).decode("ascii")}],
    }


def serialise(envelope: Mapping[str, Any]) -> bytes:
    return canonical.dump_file(envelope)


@dataclass(frozen=True)
class Opened:
    """A verified payload and the fingerprint of the trusted key that signed it."""

    payload_type: str
    payload: bytes
    signer: str


def _b64(text: Any, what: str) -> bytes:
    """Standard or URL-safe base64, padded or not, as the DSSE spec allows."""
    if not isinstance(text, str):
        raise EnvelopeError(f"{what} is not a base64 string")
    text = text.strip().replace("-", "+").replace("_", "/")
    try:
        return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise EnvelopeError(f"{what} is not valid base64") from None


def open_envelope(data: bytes, trusted: Mapping[str, Ed25519PublicKey]) -> Opened:
    """Return the payload if at least one signature verifies with a trusted key, else raise."""
    try:
        envelope = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise EnvelopeError(f"not a JSON envelope ({exc})") from None
    if not isinstance(envelope, dict):
        raise EnvelopeError("not a DSSE envelope (want a JSON object)")
    payload_type = envelope.get("payloadType")
    if not isinstance(payload_type, str):
        raise EnvelopeError("envelope has no payloadType")
    payload = _b64(envelope.get("payload"), "payload")
    signatures = envelope.get("signatures")
    if not isinstance(signatures, list) or not signatures:
        raise EnvelopeError("envelope carries no signatures")
    if not trusted:
        keyids = ", ".join(str(s.get("keyid")) for s in signatures if isinstance(s, dict))
        raise EnvelopeError(f"signed by {keyids or 'an unnamed key'}, which is not a trusted key")
    message = pae(payload_type, payload)
    for entry in signatures:
        if not isinstance(entry, dict):
            raise EnvelopeError("signature entry is not an object")
        signature = _b64(entry.get("sig"), "signature")
        # keyid is an unauthenticated hint: try the named key first, then every other trusted key.
        hinted = entry.get("keyid")
        order = sorted(trusted, key=lambda fp: fp != hinted)
        for fp in order:
            try:
                trusted[fp].verify(signature, message)
            except InvalidSignature:
                continue
            return Opened(payload_type=payload_type, payload=payload, signer=fp)
    keyids = ", ".join(str(s.get("keyid")) for s in signatures)
    raise EnvelopeError(
        f"signature does not verify with any trusted key (envelope names {keyids}; "
        f"trusted: {', '.join(sorted(trusted))})"
    )
