"""Which public keys a verifier trusts. A key found in a bundle is never trusted for being there.

Trust comes from the verifier's side only:
- ``--key PUB``: that public key file;
- ``--fingerprint sha256:HEX``: the key carried in the bundle (``keys/*.pub``) whose fingerprint is this;
- ``--trusted-keys FILE``: a file of fingerprints, one per line (``#`` comments);
- ``--sigstore-identity URI`` (``difflab verify``): a Sigstore signature over the whole archive by that
  identity, verified, vouches for the keys that archive carries (see :mod:`difflab.bundle.keyless`).
With none of these, the per-user trusted-keys file is read (difflab adds your own key to it when it
generates it). Given any of them, only they count, so ``--key`` means exactly that key.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from difflab.bundle import keys
from difflab.errors import ConfigError
from difflab.files.names import argument_path


@dataclass(frozen=True)
class TrustPolicy:
    """Explicit keys plus pinned fingerprints; ``sources`` says where trust came from, for messages."""

    keys: Mapping[str, Ed25519PublicKey] = field(default_factory=dict)
    pinned: frozenset[str] = frozenset()
    sources: tuple[str, ...] = ()
    vouched_by: str | None = None  # the carried keys are trusted because this verified signature covers them

    def select(self, carried: Mapping[str, Ed25519PublicKey]) -> dict[str, Ed25519PublicKey]:
        """Trusted keys: the explicit ones, and carried ones whose fingerprint is pinned (or all, if vouched)."""
        chosen = dict(self.keys)
        chosen.update({fp: key for fp, key in carried.items() if fp in self.pinned or self.vouched_by})
        return chosen

    def vouch(self, by: str) -> TrustPolicy:
        """The same policy, also trusting the keys this one archive carries (its signer was pinned and checked)."""
        return replace(self, vouched_by=by, sources=(*self.sources, f"the keys inside, vouched for by {by}"))

    def describe(self) -> str:
        if not self.sources:
            return "nothing (no --key, --fingerprint or trusted-keys file)"
        return ", ".join(self.sources)


def read_trusted_keys(path: Path) -> set[str]:
    """Fingerprints from a trusted-keys file; a malformed line is an error naming the line."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read trusted keys ({exc.strerror})") from None
    found = set()
    for number, line in enumerate(text.splitlines(), start=1):
        entry = line.split("#", 1)[0].strip()
        if not entry:
            continue
        try:
            found.add(keys.normalise_fingerprint(entry.split()[0]))
        except ConfigError as exc:
            raise ConfigError(f"{path} line {number}: {exc}") from None
    return found


def build(
    key_files: Iterable[Path] = (),
    fingerprints: Iterable[str] = (),
    trusted_files: Iterable[Path] = (),
) -> TrustPolicy:
    """Trust from explicit options, falling back to the per-user trusted-keys file only when none is given."""
    key_files, fingerprints, trusted_files = list(key_files), list(fingerprints), list(trusted_files)
    sources: list[str] = []
    if not (key_files or fingerprints or trusted_files):
        default = keys.trusted_keys_path()
        if default.is_file():
            trusted_files = [default]
    explicit: dict[str, Ed25519PublicKey] = {}
    for path in key_files:
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read public key ({exc.strerror})") from None
        public = keys.load_public_key(data, str(path))
        explicit[keys.fingerprint(public)] = public
        sources.append(f"--key {path}")
    pinned = {keys.normalise_fingerprint(fp) for fp in fingerprints}
    sources.extend(f"--fingerprint {fp}" for fp in sorted(pinned))
    for path in trusted_files:
        pinned |= read_trusted_keys(path)
        sources.append(f"trusted-keys file {path}")
    return TrustPolicy(keys=explicit, pinned=frozenset(pinned), sources=tuple(sources))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The trust options shared by ``verify`` and ``reproduce``."""
    group = parser.add_argument_group("trust (a key inside the bundle is only used if you pin it)")
    group.add_argument(
        "--key",
        type=argument_path,
        action="append",
        default=[],
        metavar="PUB",
        help="trust this Ed25519 public key (PEM or ssh-ed25519); repeatable",
    )
    group.add_argument(
        "--fingerprint",
        action="append",
        default=[],
        metavar="sha256:HEX",
        help="trust the bundle's key with this fingerprint, obtained out of band; repeatable",
    )
    group.add_argument(
        "--trusted-keys",
        type=argument_path,
        action="append",
        default=[],
        metavar="FILE",
        help=f"file of trusted fingerprints (default when no option is given: {keys.trusted_keys_path()})",
    )


def from_args(args: argparse.Namespace) -> TrustPolicy:
    return build(args.key, args.fingerprint, args.trusted_keys)
