"""Ed25519 signing keys: where the signing key comes from, and how keys are named (fingerprints).

Source order, first match wins: an explicit path (``--key`` / ``seal(key=...)``), then the
``DIFFLAB_SIGNING_KEY`` environment variable (a path, or the PEM text itself for CI secrets), then a
per-user key generated once under the user config directory. The private key never goes into a bundle.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from filelock import FileLock

from difflab.errors import ConfigError
from difflab.paths import config_root

ENV_SIGNING_KEY = "DIFFLAB_SIGNING_KEY"
USER_KEY_NAME = "signing-key.pem"
TRUSTED_KEYS_NAME = "trusted-keys"

_FINGERPRINT = re.compile(r"^(?:sha256:)?([0-9a-f]{64})$")


def config_dir() -> Path:
    """Per-user configuration folder (``$DIFFLAB_CONFIG``, else the user config dir); tests point this elsewhere."""
    return config_root()


def user_key_path() -> Path:
    return config_dir() / USER_KEY_NAME


def trusted_keys_path() -> Path:
    return config_dir() / TRUSTED_KEYS_NAME


def fingerprint(public: Ed25519PublicKey) -> str:
    """``sha256:`` + hex SHA-256 of the raw 32-byte public key; also used as the DSSE keyid."""
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return "sha256:" + hashlib.sha256(raw).hexdigest()


def normalise_fingerprint(text: str) -> str:
    """Accept ``sha256:HEX``, ``SHA256:HEX`` or bare ``HEX`` (full 64 digits: no prefixes)."""
    match = _FINGERPRINT.match(text.strip().lower())
    if not match:
        raise ConfigError(f"not a key fingerprint (want sha256:<64 hex digits>): {text!r}")
    return f"sha256:{match.group(1)}"


def public_pem(public: Ed25519PublicKey) -> bytes:
    return public.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def private_pem(private: Ed25519PrivateKey) -> bytes:
    return private.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def private_key_marks(private: Ed25519PrivateKey) -> list[bytes]:
    """Byte strings only a copy of ``private`` contains: its PEM body and its raw 32 bytes in hex."""
    body = b"".join(line for line in private_pem(private).splitlines() if not line.startswith(b"-----"))
    raw = private.private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )
    return [body, raw.hex().encode(), raw.hex().upper().encode()]


def load_private_key(data: bytes, where: str) -> Ed25519PrivateKey:
    """An unencrypted Ed25519 key in PKCS#8 PEM or OpenSSH format."""
    try:
        if b"OPENSSH PRIVATE KEY" in data:
            key = serialization.load_ssh_private_key(data, password=None)
        else:
            key = serialization.load_pem_private_key(data, password=None)
    except TypeError:
        raise ConfigError(f"{where}: encrypted private keys are not supported; export it unencrypted") from None
    except ValueError as exc:
        raise ConfigError(f"{where}: not a PEM or OpenSSH private key ({exc})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise ConfigError(f"{where}: not an Ed25519 key ({type(key).__name__})")
    return key


def load_public_key(data: bytes, where: str) -> Ed25519PublicKey:
    """An Ed25519 public key (PEM or ``ssh-ed25519 ...``); a private key file yields its public half."""
    if b"PRIVATE KEY" in data:
        return load_private_key(data, where).public_key()
    try:
        if data.lstrip().startswith(b"ssh-"):
            key = serialization.load_ssh_public_key(data.strip())
        else:
            key = serialization.load_pem_public_key(data)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"{where}: not a PEM or OpenSSH public key ({exc})") from None
    if not isinstance(key, Ed25519PublicKey):
        raise ConfigError(f"{where}: not an Ed25519 key ({type(key).__name__})")
    return key


@dataclass(frozen=True)
class SigningKey:
    """The key a run is signed with, and where it came from (printed, so the choice is never silent)."""

    private: Ed25519PrivateKey
    source: str  # "argument" | "environment" | "user"
    location: str
    generated: bool = False

    @property
    def public(self) -> Ed25519PublicKey:
        return self.private.public_key()

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.public)

    @property
    def path(self) -> Path | None:
        """The key file, when the key came from one (not inline PEM)."""
        return None if self.location.startswith("$") else Path(self.location)


def resolve_signing_key(explicit: Path | None = None, environ: Mapping[str, str] | None = None) -> SigningKey:
    """Argument > ``DIFFLAB_SIGNING_KEY`` > per-user key (generated on first use)."""
    environ = os.environ if environ is None else environ
    if explicit is not None:
        return SigningKey(_read_key_file(explicit), "argument", str(explicit))
    value = environ.get(ENV_SIGNING_KEY, "").strip()
    if value:
        if value.startswith("-----BEGIN"):
            where = f"${ENV_SIGNING_KEY}"
            return SigningKey(load_private_key(value.encode("utf-8") + b"\n", where), "environment", where)
        return SigningKey(_read_key_file(Path(value)), "environment", value)
    return user_signing_key()


def _read_key_file(path: Path) -> Ed25519PrivateKey:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read signing key ({exc.strerror})") from None
    return load_private_key(data, str(path))


def user_signing_key() -> SigningKey:
    """The per-user key; created once (mode 0600, folder 0700) under a lock so parallel runs agree."""
    path = user_key_path()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    with FileLock(str(path.with_name(path.name + ".lock"))):
        if path.exists():
            if os.name == "posix" and path.stat().st_mode & 0o077:
                raise ConfigError(f"{path}: permissions are too open for a private key; run chmod 600 {path}")
            return SigningKey(_read_key_file(path), "user", str(path))
        private = Ed25519PrivateKey.generate()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(private_pem(private))
        _pin_own_key(private.public_key(), path)
        return SigningKey(private, "user", str(path), generated=True)


def _pin_own_key(public: Ed25519PublicKey, key_path: Path) -> None:
    """Trust the freshly made key on this machine, visibly, in the trusted-keys file the user can edit."""
    trusted = trusted_keys_path()
    today = _dt.date.today().isoformat()
    with trusted.open("a", encoding="utf-8") as handle:
        handle.write(f"{fingerprint(public)}  # this machine's difflab key ({key_path}), made {today}\n")
