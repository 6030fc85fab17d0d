"""Shared helpers for the git-source tests: local repositories built from the real release trees.

Holds no tests; test_git_* and test_backport* import from it.

``upstream``: one commit per release (0.5.19 - 0.5.22; the fork corpus adds 0.5.23) on ``main``, each the
whole unpacked ``sglang/`` of the hash-pinned wheel under ``python/sglang``,
with squash-merge subjects ending ``(#N)``: 0.5.20 is #36988's merge, 0.5.21
#38935's, 0.5.22 #43719's (#41404 has none: it stays unresolved). 0.5.21 adds
the lab's own test files in SGLang's style (``upstream_fixtures``: each marked as a
difflab fixture in its first line and named ``test_difflab_fixture_*``; not SGLang's).

``fork`` (a clone of upstream, as an operator's private fork would be), branches:
- ``acme/cherry``: 0.5.20, a fork-only commit, then #38935 cherry-picked (``-x``);
- ``acme/revert``: 0.5.21 with the prefill-door guard of #38935 reverted (decode door kept);
- tag ``acme-v0.5.21``: 0.5.20 code whose version string says 0.5.21.

Built once and cached under ``$DIFFLAB_CACHE/test-repos/<key>`` (key: the
release sha256s and this builder's version), under a file lock so xdist
workers build it once. Commits carry fixed dates, so SHAs are reproducible.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock

import upstream_fixtures
from difflab.matrix import load_matrix
from difflab.paths import cache_root, default_matrix
from difflab.source.release import ReleaseSource

BUILDER_VERSION = "4"
RELEASES = ("0.5.19", "0.5.20", "0.5.21", "0.5.22")
DATES = {
    "0.5.19": "2026-09-04",
    "0.5.20": "2026-09-18",
    "0.5.21": "2026-10-01",
    "0.5.22": "2026-10-15",
    "0.5.23": "2026-10-30",
}
SUBJECTS = {
    "0.5.19": "[Release] Bump version to 0.5.19 (#35102)",
    "0.5.20": "[VLM] Retire aborted disaggregated prefill results (#36988)",
    "0.5.21": "[PD] Do not admit intake-rejected requests to a PD handoff (#38935)",
    "0.5.22": "[PD] A failed Mooncake send never acks the drain (#43719)",
    "0.5.23": "[Release] Bump version to 0.5.23 (#44810)",
}
PREFILL = "python/sglang/srt/disaggregation/prefill.py"
PREFILL_GUARD = """        if is_unadmitted_reject(req):
            self.scheduler.retire_unadmitted_request(req)
            return
        if not self.create_sender(req, num_kv_heads):"""
PREFILL_UNGUARDED = """        if not self.create_sender(req, num_kv_heads):"""


@dataclass(frozen=True)
class ReleaseRepos:
    """Paths and commit SHAs of the built repositories."""

    root: Path
    upstream: Path
    fork: Path
    commits: dict[str, str]  # release version -> upstream commit on main
    fork_refs: dict[str, str]  # name -> ref in the fork (cherry, revert, version)
    fork_commits: dict[str, str]  # name -> commit SHA


def git(cwd: Path, *args: str, date: str | None = None) -> str:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "SGLang Maintainers",
        "GIT_AUTHOR_EMAIL": "maintainers@example.invalid",
        "GIT_COMMITTER_NAME": "SGLang Maintainers",
        "GIT_COMMITTER_EMAIL": "maintainers@example.invalid",
    }
    if date:
        env["GIT_AUTHOR_DATE"] = env["GIT_COMMITTER_DATE"] = f"{date}T12:00:00Z"
    proc = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed in {cwd}: {proc.stderr.strip()}")
    return proc.stdout.strip()


def release_trees(versions: tuple[str, ...] = RELEASES) -> dict[str, Path]:
    """The unpacked ``sglang/`` of each pinned release (downloaded and sha256-checked by ReleaseSource)."""
    matrix = load_matrix(default_matrix())
    source = ReleaseSource(matrix.releases)
    return {v: source.release(v).root / "sglang" for v in versions}


def repos_key() -> str:
    matrix = load_matrix(default_matrix())
    h = hashlib.sha256(BUILDER_VERSION.encode())
    for v in RELEASES:
        h.update(matrix.releases[v].sha256.encode())
    for rel, text in sorted(upstream_fixtures.FILES.items()):
        h.update(rel.encode() + b"\0" + text.encode())
    return h.hexdigest()[:16]


def _commit_tree(repo: Path, tree: Path, subject: str, date: str, extra: dict[str, str] | None = None) -> str:
    target = repo / "python" / "sglang"
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(tree, target, ignore=shutil.ignore_patterns("__pycache__"))
    for folder, _dirs, files in os.walk(target):  # the cached release tree is read-only; the repository is not
        os.chmod(folder, 0o755)
        for name in files:
            os.chmod(os.path.join(folder, name), 0o644)
    for rel, text in (extra or {}).items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    git(repo, "add", "-A")
    git(repo, "commit", "--quiet", "-m", subject, date=date)
    return git(repo, "rev-parse", "HEAD")


def _serve(repo: Path) -> None:
    """Let clients fetch by SHA and with --filter, as GitHub does."""
    for key in ("uploadpack.allowFilter", "uploadpack.allowAnySHA1InWant"):
        git(repo, "config", key, "true")


def build_upstream(dest: Path, trees: dict[str, Path], releases: tuple[str, ...] = RELEASES) -> dict[str, str]:
    """``main`` with one squash-merge-style commit per release of ``releases`` (in order)."""
    dest.mkdir(parents=True)
    git(dest, "init", "--quiet", "--initial-branch=main")
    (dest / "README.md").write_text("# sglang (difflab test repository built from release wheels)\n")
    commits = {}
    for v in releases:
        extra = dict(upstream_fixtures.FILES) if v >= "0.5.21" else None
        commits[v] = _commit_tree(dest, trees[v], SUBJECTS[v], DATES[v], extra)
    git(dest, "repack", "-adq")
    _serve(dest)
    return commits


def build_fork(upstream: Path, dest: Path, commits: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    git(dest.parent, "clone", "--quiet", "--no-checkout", str(upstream), dest.name)
    refs, shas = {}, {}

    git(dest, "checkout", "--quiet", "-b", "acme/cherry", commits["0.5.20"])
    notes = dest / "python" / "sglang" / "srt" / "acme_router_notes.py"
    notes.write_text('"""ACME: routing notes kept in the fork."""\nROUTER = "acme-lb"\n')
    git(dest, "add", "-A")
    git(dest, "commit", "--quiet", "-m", "[ACME] Keep router notes in the fork", date="2026-10-02")
    git(dest, "cherry-pick", "-x", commits["0.5.21"], date="2026-10-03")
    refs["cherry"], shas["cherry"] = "acme/cherry", git(dest, "rev-parse", "HEAD")

    git(dest, "checkout", "--quiet", "-b", "acme/revert", commits["0.5.21"])
    prefill = dest / PREFILL
    text = prefill.read_text()
    assert text.count(PREFILL_GUARD) == 1, "prefill-door guard not found in 0.5.21"
    prefill.write_text(text.replace(PREFILL_GUARD, PREFILL_UNGUARDED))
    git(
        dest,
        "commit",
        "--quiet",
        "-am",
        "[ACME] Revert the prefill-door intake check (router retries it)",
        date="2026-10-04",
    )
    refs["revert"], shas["revert"] = "acme/revert", git(dest, "rev-parse", "HEAD")

    git(dest, "checkout", "--quiet", "-b", "acme/version", commits["0.5.20"])
    version = dest / "python" / "sglang" / "_version.py"
    version.write_text(version.read_text().replace("'0.5.20'", "'0.5.21'").replace("(0, 5, 20)", "(0, 5, 21)"))
    git(dest, "commit", "--quiet", "-am", "[ACME] Release 0.5.21 (includes #38935)", date="2026-10-05")
    git(dest, "tag", "acme-v0.5.21")
    refs["version"], shas["version"] = "acme-v0.5.21", git(dest, "rev-parse", "HEAD")

    git(dest, "checkout", "--quiet", "--detach")
    git(dest, "repack", "-adq")
    _serve(dest)
    return refs, shas


def release_repos() -> ReleaseRepos:
    """Build (once, under a lock) or reuse the cached repositories."""
    root = cache_root() / "test-repos" / repos_key()
    root.parent.mkdir(parents=True, exist_ok=True)
    done = root / "done.txt"
    with FileLock(str(root) + ".lock"):
        if not done.exists():
            trees = release_trees()
            tmp = Path(tempfile.mkdtemp(dir=root.parent, prefix=f".{root.name}-"))
            try:
                commits = build_upstream(tmp / "upstream", trees)
                refs, shas = build_fork(tmp / "upstream", tmp / "fork", commits)
                lines = [f"commit {v} {c}" for v, c in commits.items()]
                lines += [f"fork {n} {refs[n]} {shas[n]}" for n in refs]
                (tmp / "done.txt").write_text("\n".join(lines) + "\n")
                shutil.rmtree(root, ignore_errors=True)
                os.replace(tmp, root)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
    commits, refs, shas = {}, {}, {}
    for line in done.read_text().splitlines():
        kind, *rest = line.split()
        if kind == "commit":
            commits[rest[0]] = rest[1]
        else:
            refs[rest[0]], shas[rest[0]] = rest[1], rest[2]
    return ReleaseRepos(root, root / "upstream", root / "fork", commits, refs, shas)


def tiny_repo(dest: Path, prs: list[int]) -> list[str]:
    """A small repository (an importable stub ``sglang``) with one squash-merge commit per PR."""
    dest.mkdir(parents=True)
    git(dest, "init", "--quiet", "--initial-branch=main")
    shas = []
    for i, pr in enumerate(prs):
        pkg = dest / "python" / "sglang"
        pkg.mkdir(parents=True, exist_ok=True)
        (pkg / "__init__.py").write_text(f'__version__ = "0.0.{i}"\n')
        (dest / "test").mkdir(exist_ok=True)
        (dest / "test" / f"test_{i}.py").write_text("")
        (dest / "docs.md").write_text(f"rev {i}\n")
        git(dest, "add", "-A")
        git(dest, "commit", "--quiet", "-m", f"Change number {i} (#{pr})", date=f"2026-01-{i + 1:02d}")
        shas.append(git(dest, "rev-parse", "HEAD"))
    _serve(dest)
    return shas


def matrix_copy(dest: Path, commits_38935: tuple[str, str] | None = None) -> Path:
    """The default matrix copied into ``dest`` (a lock file then lands next to it, not in the repo).

    Its ``commits`` tables quote upstream's real SHAs, which the test repositories do not have,
    so they are dropped; ``commits_38935`` = (base, head) puts one back for #38935, whose
    ``upstream_tests`` name the lab's fixture files (the ones the repositories hold).
    """
    dest.mkdir(parents=True, exist_ok=True)
    text = upstream_fixtures.with_fixture_tests(default_matrix().read_text())
    text = re.sub(r"^commits = .*\n", "", text, flags=re.M)
    if commits_38935:
        base, head = commits_38935
        anchor = 'id = "38935"\n'
        assert anchor in text
        text = text.replace(
            anchor,
            anchor
            + (
                f'commits = {{ base = {{ sha = "{base}", confirmed = false }}, '
                f'head = {{ sha = "{head}", confirmed = false }} }}\n'
            ),
        )
    path = dest / "upstream.toml"
    path.write_text(text)
    load_matrix(path)
    return path
