"""Optional keyless (Sigstore) signature of the run statement, made only inside GitHub Actions.

It is an extra: the Ed25519 envelope is always written and is what ``difflab verify`` checks.
sigstore-python is an optional dependency and is imported only here, only when asked for.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

INSTALL_HINT = "pip install 'sglang-difflab[sigstore]'"


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
