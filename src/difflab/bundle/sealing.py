"""Turn a finished run folder into a bundle: keys/, REPRODUCE.md, signed statements, SHA256SUMS.

Order matters: per-fix statements are signed first, the run statement then lists every file
(including those envelopes), the optional Sigstore bundle signs the run statement, SHA256SUMS
lists everything so far, and the checksums statement, signed last, names SHA256SUMS by digest:
every file of the bundle is covered by a signature (docs/bundle.md, bundle format 2).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from difflab.bundle import canonical, checksums, dsse, instructions, keyless, keys, layout, statements
from difflab.errors import ConfigError
from difflab.files.names import has_controls, printable


@dataclass(frozen=True)
class SealInfo:
    """What sealing produced, and with which key (so the pipeline can report it)."""

    run_dir: Path
    fingerprint: str
    key_source: str
    key_location: str
    key_generated: bool
    public_key: Path
    checksums: Path
    attestations: tuple[Path, ...]
    sigstore_bundle: Path | None
    files: int

    def __str__(self) -> str:
        return (
            f"{self.files} files, {len(self.attestations)} signed statements, key {self.fingerprint} "
            f"({self.key_source}: {self.key_location})"
        )


def _stderr(message: str) -> None:
    print(f"difflab: {message}", file=sys.stderr)


def read_json(root: Path, rel: str, *, required: bool = True) -> Any:
    path = root / rel
    if not path.is_file():
        if required:
            raise ConfigError(f"{path}: missing; not a run folder")
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: not valid JSON ({exc})") from None


def seal(
    run_dir: Path,
    key: Path | None = None,
    *,
    sigstore: bool | None = None,
    echo: Callable[[str], None] = _stderr,
    environ: Mapping[str, str] | None = None,
) -> SealInfo:
    """Seal ``run_dir`` in place. Key: ``key`` argument > $DIFFLAB_SIGNING_KEY > per-user key.

    ``sigstore=None`` adds a keyless signature when running in GitHub Actions with an OIDC token.
    """
    environ = os.environ if environ is None else environ
    signing = keys.resolve_signing_key(key, environ)
    if signing.generated:
        echo(
            f"generated your signing key {signing.location} ({signing.fingerprint}); "
            f"it is trusted on this machine via {keys.trusted_keys_path()}; publish the fingerprint so "
            "others can pin it"
        )
    return seal_with(run_dir, signing, sigstore=sigstore, echo=echo, environ=environ)


def seal_with(
    run_dir: Path,
    signing: keys.SigningKey,
    *,
    sigstore: bool | None = None,
    echo: Callable[[str], None] = _stderr,
    environ: Mapping[str, str] | None = None,
) -> SealInfo:
    """Seal with a resolved key; deterministic for a given folder, key and CI environment."""
    environ = os.environ if environ is None else environ
    if not run_dir.is_dir():
        raise ConfigError(f"{run_dir}: not a folder")
    _refuse_key_inside(run_dir, signing)
    _refuse_key_text(run_dir, signing)
    run = read_json(run_dir, layout.RUN_JSON)
    environment = read_json(run_dir, layout.ENVIRONMENT_JSON, required=False)
    _clear_previous(run_dir)
    listing = layout.scan(run_dir)
    if listing.odd:
        raise ConfigError(f"{run_dir}: links or special files cannot be sealed: {', '.join(listing.odd)}")
    controls = [printable(rel) for rel in listing.files if has_controls(rel)]
    if controls:
        raise ConfigError(f"{run_dir}: file names with control characters cannot be sealed: {', '.join(controls)}")

    (run_dir / layout.KEYS).mkdir()
    public_key = run_dir / layout.PUBLIC_KEY
    public_key.write_bytes(keys.public_pem(signing.public))
    (run_dir / layout.FINGERPRINT).write_text(signing.fingerprint + "\n", encoding="utf-8")
    (run_dir / layout.REPRODUCE).write_text(
        instructions.render(run, environment, signing.fingerprint), encoding="utf-8"
    )
    envelopes = write_fix_statements(run_dir, run, signing)
    payload = write_run_statement(run_dir, signing, environ)
    envelopes.append(run_dir / layout.RUN_ENVELOPE)

    bundle = None
    if sigstore or (sigstore is None and keyless.available(environ)):
        bundle = keyless.sign(payload, run_dir / layout.SIGSTORE_BUNDLE, echo)
    sums = seal_checksums(run_dir, signing)
    envelopes.append(run_dir / layout.CHECKSUMS_ENVELOPE)
    count = len(layout.scan(run_dir).files)
    info = SealInfo(
        run_dir=run_dir,
        fingerprint=signing.fingerprint,
        key_source=signing.source,
        key_location=signing.location,
        key_generated=signing.generated,
        public_key=public_key,
        checksums=sums,
        attestations=tuple(envelopes),
        sigstore_bundle=bundle,
        files=count,
    )
    echo(f"sealed: {info}; public key in {layout.PUBLIC_KEY}")
    return info


def _refuse_key_inside(run_dir: Path, signing: keys.SigningKey) -> None:
    """A private key inside the folder would be listed, packed and published."""
    path = signing.path
    if path is not None and path.resolve().is_relative_to(run_dir.resolve()):
        raise ConfigError(f"{path}: the signing key lies inside the run folder and would be published")


def _refuse_key_text(run_dir: Path, signing: keys.SigningKey) -> None:
    """A file that holds the private key's text (a probe printed it, say) would publish the key."""
    marks = keys.private_key_marks(signing.private)
    if signing.path is not None:  # the key file as written (an OpenSSH key's text is not its PEM)
        with contextlib.suppress(OSError):
            body = [ln for ln in signing.path.read_bytes().splitlines() if ln.strip() and not ln.startswith(b"-----")]
            marks += [ln.strip() for ln in body[:1] if len(ln.strip()) >= 40]
    for rel in layout.scan(run_dir).files:
        path = run_dir / rel
        try:
            data = path.read_bytes()
        except OSError:
            continue
        if any(mark in data for mark in marks):
            raise ConfigError(
                f"{path}: holds the text of the signing key {signing.fingerprint}; refusing to seal a folder "
                "that would publish it (remove the file, and replace the key: it has been seen)"
            )


def _clear_previous(run_dir: Path) -> None:
    for name in layout.SEAL_OUTPUTS:
        target = run_dir / name
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        elif target.exists() or target.is_symlink():
            target.unlink()


def _write_envelope(path: Path, payload: bytes, signing: keys.SigningKey) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(dsse.serialise(dsse.sign(payload, signing.private, signing.fingerprint)))


def _verdicts(diff: Any) -> dict[str, str]:
    found: dict[str, str] = {}
    for fix in (diff or {}).get("fixes") or []:
        if isinstance(fix, dict):
            found[str(fix.get("id", fix.get("fix")))] = fix.get("verdict")
    return found


def write_fix_statements(run_dir: Path, run: Mapping[str, Any], signing: keys.SigningKey) -> list[Path]:
    """One signed probe-results statement per ``observations/<fix>/<side>/``."""
    verdicts = _verdicts(read_json(run_dir, layout.DIFF_JSON, required=False))
    labels = {json.dumps(ident, sort_keys=True): label for label, ident in (run.get("sources") or {}).items()}
    written = []
    for (fix, side), files in layout.observation_groups(layout.scan(run_dir).files).items():
        records = []
        for rel in files:
            observation = read_json(run_dir, rel)
            if not isinstance(observation, dict):
                raise ConfigError(f"{run_dir / rel}: not an observation object")
            log_rel = rel[: -len(".json")] + ".log"
            has_log = (run_dir / log_rel).is_file()
            records.append(
                statements.ProbeRecord(
                    probe=str(observation.get("probe") or Path(rel).stem),
                    observation=observation,
                    path=rel,
                    sha256=checksums.sha256_file(run_dir / rel),
                    log_path=log_rel if has_log else None,
                    log_sha256=checksums.sha256_file(run_dir / log_rel) if has_log else None,
                )
            )
        body = statements.probe_results(fix, side, records, verdicts.get(fix), labels)
        out = run_dir / layout.fix_envelope(fix, side)
        try:
            payload = canonical.dumps(body)
        except ValueError as exc:
            raise ConfigError(f"{run_dir}/observations/{fix}/{side}: cannot serialise ({exc})") from None
        _write_envelope(out, payload, signing)
        written.append(out)
    return written


def write_run_statement(run_dir: Path, signing: keys.SigningKey, environ: Mapping[str, str]) -> bytes:
    """Sign the SLSA provenance whose subjects are every file present now; returns the payload."""
    run = read_json(run_dir, layout.RUN_JSON)
    environment = read_json(run_dir, layout.ENVIRONMENT_JSON, required=False)
    files = [f for f in layout.scan(run_dir).files if f not in layout.OUTSIDE_RUN_STATEMENT]
    digests = checksums.digests(run_dir, files)
    subjects = [statements.file_descriptor(rel, digest) for rel, digest in digests.items()]
    try:
        payload = canonical.dumps(statements.run_provenance(run, environment, subjects, environ))
    except ValueError as exc:
        raise ConfigError(f"{run_dir}: cannot serialise the run statement ({exc})") from None
    _write_envelope(run_dir / layout.RUN_ENVELOPE, payload, signing)
    return payload


def write_checksums(run_dir: Path) -> Path:
    """SHA256SUMS over every file but itself and the checksums statement (which signs it)."""
    files = [f for f in layout.scan(run_dir).files if f not in layout.OUTSIDE_CHECKSUMS]
    return checksums.write(run_dir, files)


def seal_checksums(run_dir: Path, signing: keys.SigningKey) -> Path:
    """Write SHA256SUMS, then sign it: the last step of sealing."""
    sums = write_checksums(run_dir)
    payload = canonical.dumps(statements.checksums_list(checksums.sha256_file(sums)))
    _write_envelope(run_dir / layout.CHECKSUMS_ENVELOPE, payload, signing)
    return sums
