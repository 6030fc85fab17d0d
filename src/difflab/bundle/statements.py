"""in-toto Statement v1 bodies: one per fix and side (probe results), one per run (SLSA Provenance v1).

Statements are plain dicts built from the run folder alone (plus CI metadata when present), so
sealing the same folder with the same key gives byte-identical attestations.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from difflab import __version__
from difflab.errors import ConfigError

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
SLSA_PROVENANCE = "https://slsa.dev/provenance/v1"
# Our own type URIs; documented in docs/bundle.md.
PROBE_RESULTS = "urn:sglang-difflab:probe-results:v1"
CHECKSUMS_LIST = "urn:sglang-difflab:checksums:v1"
RUN_BUILD_TYPE = "urn:sglang-difflab:run:v2"
BUNDLE_FORMATS = {"urn:sglang-difflab:run:v1": 1, RUN_BUILD_TYPE: 2}
"""The run statement's buildType says which bundle format it belongs to; being signed, it cannot be downgraded.
1: SHA256SUMS unsigned, nothing but it and the run envelope outside the run statement (the published
reference bundle). 2: SHA256SUMS signed last by the checksums statement, so files written after the
run statement (the Sigstore bundle) are covered too."""
LOCAL_BUILDER = "urn:sglang-difflab:builder:local"


def file_descriptor(name: str, sha256: str) -> dict[str, Any]:
    """A ResourceDescriptor for a file inside the bundle."""
    return {"name": name, "digest": {"sha256": sha256}}


def source_descriptor(identity: Mapping[str, Any]) -> dict[str, Any]:
    """The SGLang source a probe ran against: a release wheel by sha256, a git checkout by commit + tree."""
    kind = identity.get("kind")
    if kind == "release" or (kind != "git" and identity.get("sha256")):
        version = identity.get("version")
        descriptor = {
            "name": str(identity.get("file") or f"sglang-{version}"),
            "digest": {"sha256": str(identity.get("sha256", "")).lower()},
        }
        if version:
            descriptor["uri"] = f"pkg:pypi/sglang@{version}"
        return descriptor
    if kind == "git" or identity.get("commit"):
        repo = identity.get("repo") or "sglang"
        commit = str(identity.get("commit", "")).lower()
        digest = {"gitCommit": commit}
        if identity.get("tree"):
            digest["gitTree"] = str(identity["tree"]).lower()
        return {"name": f"{repo}@{commit}", "uri": f"git+{repo}@{commit}", "digest": digest}
    raise ValueError(f"source {dict(identity)} names neither a wheel sha256 nor a git commit")


def tree_descriptor(identity: Mapping[str, Any]) -> dict[str, Any] | None:
    """The unpacked ``sglang/`` of a release by its tree digest (see :mod:`difflab.source.tree`), if recorded."""
    tree = identity.get("tree_sha256")
    if identity.get("kind") != "release" or not tree:
        return None
    name = str(identity.get("file") or f"sglang-{identity.get('version')}")
    return {"name": f"{name}!/sglang/", "digest": {"sha256": str(tree).lower()}}


def source_subjects(identity: Mapping[str, Any]) -> list[dict[str, Any]]:
    """What a statement about a source names: the wheel or commit, and the tree that actually ran."""
    tree = tree_descriptor(identity)
    return [source_descriptor(identity), *([tree] if tree else [])]


def statement(subjects: Sequence[Mapping[str, Any]], predicate_type: str, predicate: Any) -> dict[str, Any]:
    """in-toto Statement v1; subjects sorted by name so their order never depends on the filesystem."""
    ordered = sorted(subjects, key=lambda s: (str(s.get("name")), json.dumps(s, sort_keys=True)))
    return {
        "_type": STATEMENT_TYPE,
        "subject": ordered,
        "predicateType": predicate_type,
        "predicate": predicate,
    }


def parse(payload: bytes) -> dict[str, Any]:
    """A verified payload as a Statement v1, checked for shape (not content)."""
    try:
        value = json.loads(payload)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"payload is not JSON ({exc})") from None
    if not isinstance(value, dict) or value.get("_type") != STATEMENT_TYPE:
        raise ValueError(f"payload is not an in-toto Statement v1 (_type {STATEMENT_TYPE})")
    subjects = value.get("subject")
    if not isinstance(subjects, list) or not subjects:
        raise ValueError("statement has no subjects")
    for subject in subjects:
        if not isinstance(subject, dict) or not isinstance(subject.get("digest"), dict):
            raise ValueError("statement subject without a digest")
    if not isinstance(value.get("predicateType"), str):
        raise ValueError("statement has no predicateType")
    return value


@dataclass(frozen=True)
class ProbeRecord:
    """One observation file (and its log) as attested for a fix and side."""

    probe: str
    observation: Mapping[str, Any]
    path: str
    sha256: str
    log_path: str | None
    log_sha256: str | None


def probe_results(
    fix: str,
    side: str,
    records: Sequence[ProbeRecord],
    verdict: str | None,
    labels: Mapping[str, str],
) -> dict[str, Any]:
    """Statement about the SGLang source(s) one side of a fix ran on, with what each probe observed.

    Subjects are the sources; a side that had no source (unavailable) has its observation files as
    subjects instead, so every statement still names what it is about.
    """
    probes, subjects = [], []
    for record in sorted(records, key=lambda r: r.probe):
        obs = record.observation
        source = obs.get("source") or None
        if source:
            try:
                descriptors = source_subjects(source)
            except ValueError as exc:
                raise ConfigError(f"{record.path}: {exc}") from None
            subjects += [d for d in descriptors if d not in subjects]
        probes.append(
            {
                "probe": record.probe,
                "status": obs.get("status"),
                "fields": obs.get("fields"),
                "error": obs.get("error"),
                "sglangVersion": obs.get("sglang_version"),
                "source": source,
                "sourceLabel": labels.get(json.dumps(source, sort_keys=True)) if source else None,
                "observation": file_descriptor(record.path, record.sha256),
                "log": None if record.log_path is None else file_descriptor(record.log_path, record.log_sha256 or ""),
            }
        )
    if not subjects:
        subjects = [file_descriptor(r.path, r.sha256) for r in records]
    predicate = {"fix": fix, "side": side, "verdict": verdict, "probes": probes}
    return statement(subjects, PROBE_RESULTS, predicate)


def checksums_list(sha256: str) -> dict[str, Any]:
    """The statement signed last: its subject is SHA256SUMS, which lists every other file of the bundle."""
    predicate = {"lists": "every file of the bundle but SHA256SUMS itself and this statement's envelope"}
    return statement([file_descriptor("SHA256SUMS", sha256)], CHECKSUMS_LIST, predicate)


def _image_dependency(image: str) -> dict[str, Any] | None:
    """``ref@sha256:hex`` → a ResourceDescriptor pinned by digest; unpinned refs are recorded by name only."""
    ref, sep, digest = image.partition("@")
    if sep and digest.startswith("sha256:"):
        return {"name": "runner-image", "uri": f"docker://{ref}", "digest": {"sha256": digest[7:].lower()}}
    return {"name": "runner-image", "uri": f"docker://{image}"}


def _ci_details(environ: Mapping[str, str]) -> tuple[str, dict[str, Any]]:
    """Builder id and invocation id: the GitHub workflow when run there, else a local builder."""
    if environ.get("GITHUB_ACTIONS") != "true":
        return LOCAL_BUILDER, {}
    server = environ.get("GITHUB_SERVER_URL", "https://github.com")
    workflow = environ.get("GITHUB_WORKFLOW_REF")
    builder = f"{server}/{workflow}" if workflow else LOCAL_BUILDER
    meta: dict[str, Any] = {}
    if environ.get("GITHUB_REPOSITORY") and environ.get("GITHUB_RUN_ID"):
        meta["invocationId"] = (
            f"{server}/{environ['GITHUB_REPOSITORY']}/actions/runs/{environ['GITHUB_RUN_ID']}"
            f"/attempts/{environ.get('GITHUB_RUN_ATTEMPT', '1')}"
        )
    return builder, meta


def run_provenance(
    run: Mapping[str, Any],
    environment: Mapping[str, Any] | None,
    subjects: Sequence[Mapping[str, Any]],
    environ: Mapping[str, str],
) -> dict[str, Any]:
    """SLSA Provenance v1 for the whole run: what was asked (matrix, fixes, pins), with what, and when."""
    runner = run.get("runner") or {}
    dependencies: list[dict[str, Any]] = []
    matrix = run.get("matrix") or {}
    if matrix.get("sha256"):
        dependencies.append({"name": "matrix", "uri": str(matrix.get("path")), "digest": {"sha256": matrix["sha256"]}})
    for label, identity in sorted((run.get("sources") or {}).items()):
        try:
            descriptors = source_subjects(identity)
        except ValueError as exc:
            raise ConfigError(f"run.json: sources.{label}: {exc}") from None
        for descriptor in descriptors:
            descriptor["annotations"] = {"label": label}
            dependencies.append(descriptor)
    if runner.get("image"):
        dependency = _image_dependency(str(runner["image"]))
        if dependency:
            dependencies.append(dependency)
    env = environment or {}
    builder_id, metadata = _ci_details(environ)
    for key, value in (("startedOn", run.get("started_at")), ("finishedOn", run.get("finished_at"))):
        if value:
            metadata[key] = value
    predicate = {
        "buildDefinition": {
            "buildType": RUN_BUILD_TYPE,
            "externalParameters": {
                "command": run.get("command"),
                "argv": run.get("argv"),
                "matrix": matrix,
                "fixes": run.get("fixes"),
                "sourceKind": run.get("source_kind"),
                "repo": run.get("repo"),
                "runner": runner.get("name"),
            },
            "internalParameters": {
                "pins": run.get("sources"),
                "runner": runner,
                "environment": {
                    "pythonVersion": env.get("python_version"),
                    "packages": env.get("packages"),
                    "digest": env.get("digest", run.get("environment_digest")),
                },
            },
            "resolvedDependencies": dependencies,
        },
        "runDetails": {
            "builder": {"id": builder_id, "version": {"sglang-difflab": __version__}},
            "metadata": metadata,
            "byproducts": [{"name": "exit_code", "annotations": {"value": run.get("exit_code")}}],
        },
    }
    return statement(subjects, SLSA_PROVENANCE, predicate)
