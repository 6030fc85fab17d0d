"""A corpus of hand-made SGLang fork branches, each with the ``difflab backport`` verdict its code deserves.

Holds no tests; ``test_fork_corpus.py`` runs them. Nothing here is SGLang
code: each fork is a *recipe* -- a release (the hash-pinned wheel's
``sglang/``) plus exact text edits -- and the branches are built at test time
into a cache folder, never into this repository.

Expected verdicts come from what each fork's code does, judged by the fix's
paths (every behavioural hunk of the fix's base -> head diff, as the matrix's
``[[fixes.hunks]]`` list them): ``present`` = every path behaves like
the fix's head under the build's own defaults, ``absent`` = every path like
the base, ``partial`` = some of each. They are NOT what the probes output
today: a path no probe drives yet makes its forks fail until a scenario for it
lands, which is the point of the corpus. Each spec's ``why`` says which class
it belongs to and why its verdict follows from its code.

Builder: :func:`corpus_repos` makes one upstream repository (one squash-style
commit per release 0.5.19 - 0.5.23, built from the release trees by
``test_git_support.build_upstream``) and one fork repository (a bare clone of
it) holding a branch ``corpus/<name>`` per spec. Commits carry fixed dates and
identities, so SHAs are reproducible; each branch adds ``DIFFLAB-FIXTURE.md``
at the repository root saying it is a lab fixture, not SGLang's work. Cached
under ``$DIFFLAB_CACHE/test-repos/corpus-<key>`` (key: this builder's version,
the release sha256s and every spec's content), built once under a file lock
so xdist workers share it.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

BUILDER_VERSION = "2"
CORPUS_RELEASES = ("0.5.19", "0.5.20", "0.5.21", "0.5.22", "0.5.23")
FIXES = ("36988", "38935", "41404", "43719a", "43719b")
VERDICTS = ("present", "absent", "partial")
MARKER = "DIFFLAB-FIXTURE.md"
BRANCH_PREFIX = "corpus/"

# The classes every corpus must cover (``ForkSpec.cls``), with what each is for.
CLASSES: dict[str, str] = {
    "unmodified": "a release as shipped: the known release map",
    "version-lie": "a version string that claims a release the code is not",
    "partial-path": "a fix ported to one of its code paths and not another",
    "partial-door": "#38935 at one admission door only",
    "partial-hunk": "one hunk of a fix dropped (or only one kept)",
    "reordered": "a fix's check moved relative to the work it guards",
    "flag-init-off": "the fix behind the fork's own flag, set in an __init__, default off",
    "flag-init-on": "the fix behind the fork's own flag, set in an __init__, default on",
    "flag-environ-off": "the fix behind a new EnvBool read where it is used, default off",
    "flag-environ-on": "the fix behind a new EnvBool read where it is used, default on",
    "flag-serverargs-off": "the fix behind a new ServerArgs field, default off",
    "flag-serverargs-on": "the fix behind a new ServerArgs field, default on",
    "refactor": "a harmless rename or inlining near the fix",
    "hand-port": "a correct re-implementation with its own names and state onto the base release",
    "deferred-default-off": "SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE off by default (probes force it on)",
}

DEFERRED_OFF_NOTE = r"off by default in this build.*SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE"
"""What a verdict's ``forced`` notes must say where the build ships deferred release off."""


@dataclass(frozen=True)
class Edit:
    """Replace ``find`` by ``replace`` in ``file`` (a path inside ``python/``, e.g. ``sglang/srt/...``).

    ``find`` must occur exactly ``count`` times in the file as it stands when the edit is applied
    (edits of one spec apply in order); every occurrence is replaced.
    """

    file: str
    find: str
    replace: str
    count: int = 1


@dataclass(frozen=True)
class ForkSpec:
    """One fork branch: a release plus edits, and the verdict per fix its code deserves."""

    name: str
    cls: str
    base_release: str
    edits: tuple[Edit, ...]
    expect: Mapping[str, str]
    why: str
    forced_note: Mapping[str, str] = field(default_factory=dict)
    """fix id -> regex that one of that fix's ``forced`` notes must match."""

    @property
    def branch(self) -> str:
        return BRANCH_PREFIX + self.name

    def content(self) -> dict[str, object]:
        """What the branch's tree depends on (the cache key); expectations and prose do not."""
        return {
            "name": self.name,
            "base": self.base_release,
            "edits": [[e.file, e.find, e.replace, e.count] for e in self.edits],
        }


class CorpusError(Exception):
    """A spec does not apply to its release tree: the message names the fork, the file and the text."""


# --- applying edits ------------------------------------------------------------------------
def apply_edits(spec: ForkSpec, read: Callable[[str], str | None]) -> dict[str, str]:
    """The new text of every file ``spec`` edits; ``read(path)`` gives the release's text (None: no such file)."""
    texts: dict[str, str] = {}
    for n, edit in enumerate(spec.edits, 1):
        if edit.file not in texts:
            original = read(edit.file)
            if original is None and edit.find == "" and edit.count == 0:
                texts[edit.file] = edit.replace  # a module the fork adds (see new_module)
                continue
            if original is None:
                raise CorpusError(f"fork {spec.name!r}: edit {n}: {edit.file} does not exist in {spec.base_release}")
            texts[edit.file] = original
        if not edit.find:
            raise CorpusError(f"fork {spec.name!r}: edit {n}: an empty find only creates a new file ({edit.file})")
        found = texts[edit.file].count(edit.find) if edit.find else 0
        if found != edit.count:
            raise CorpusError(
                f"fork {spec.name!r}: edit {n}: {edit.file} of {spec.base_release} holds the text "
                f"{found} time(s), expected {edit.count}:\n{edit.find}"
            )
        texts[edit.file] = texts[edit.file].replace(edit.find, edit.replace)
    for path, text in texts.items():
        if path.endswith(".py"):
            try:
                ast.parse(text, filename=path)
            except SyntaxError as exc:
                raise CorpusError(f"fork {spec.name!r}: {path} no longer parses after its edits: {exc}") from None
    return texts


def materialise(spec: ForkSpec, release_tree: Path, dest: Path) -> Path:
    """The fork's ``sglang/`` as a plain folder (hard links to the release, edited files rewritten): for debugging.

    ``release_tree`` is the release's unpacked ``sglang/``; returns ``dest`` (which then holds ``sglang/``).
    """
    root = release_tree.parent
    texts = apply_edits(spec, lambda p: (root / p).read_text() if (root / p).is_file() else None)
    target = dest / "sglang"
    shutil.copytree(release_tree, target, copy_function=os.link, ignore=shutil.ignore_patterns("__pycache__"))
    for path, text in texts.items():
        (dest / path).unlink(missing_ok=True)
        (dest / path).write_text(text)
    return dest


def fixture_note(spec: ForkSpec, release_sha256: str) -> str:
    edits = "\n".join(f"- `{e.file}` ({e.count} replacement{'s' if e.count != 1 else ''})" for e in spec.edits)
    return (
        f"# difflab test fixture `{spec.branch}`\n\n"
        "This branch was generated by sglang-difflab's test suite (`tests/fork_corpus.py`) to check\n"
        "`difflab backport` verdicts. It is a lab fixture, not SGLang's work and not a real fork: the\n"
        f"SGLang code is the unmodified {spec.base_release} release wheel (sha256 {release_sha256}),\n"
        "and the edits below are the lab's, made to model one kind of private fork.\n\n"
        f"- class: {spec.cls}\n- why: {spec.why}\n- expected: "
        + ", ".join(f"#{fix} {verdict}" for fix, verdict in spec.expect.items())
        + f"\n\nEdits:\n{edits or '- none'}\n"
    )


# --- the repositories --------------------------------------------------------------------
@dataclass(frozen=True)
class Corpus:
    """The built repositories: ``upstream`` (releases on main) and ``repo`` (bare, one branch per spec)."""

    root: Path
    upstream: Path
    repo: Path
    commits: dict[str, str]  # release -> upstream commit
    branches: dict[str, str]  # spec name -> commit


def _git(cwd: Path, *args: str, stdin: str | None = None, env: dict[str, str] | None = None, date: str = "") -> str:
    full = {
        **os.environ,
        "GIT_AUTHOR_NAME": "ACME Inference",
        "GIT_AUTHOR_EMAIL": "inference@acme.invalid",
        "GIT_COMMITTER_NAME": "ACME Inference",
        "GIT_COMMITTER_EMAIL": "inference@acme.invalid",
        **(env or {}),
    }
    if date:
        full["GIT_AUTHOR_DATE"] = full["GIT_COMMITTER_DATE"] = f"{date}T12:00:00Z"
    proc = subprocess.run(["git", *args], cwd=cwd, env=full, input=stdin, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"git {' '.join(args[:3])} failed in {cwd}: {proc.stderr.strip()}")
    return proc.stdout.strip()


def corpus_key(specs: tuple[ForkSpec, ...], release_hashes: Mapping[str, str]) -> str:
    h = hashlib.sha256(f"corpus-builder {BUILDER_VERSION}\n".encode())
    for version in CORPUS_RELEASES:
        h.update(f"{version} {release_hashes[version]}\n".encode())
    h.update(json.dumps([s.content() for s in specs], sort_keys=True).encode())
    return h.hexdigest()[:16]


def _read_text_exact(repo: Path, rev: str) -> str:
    """A blob's text byte for byte (``_git`` strips output, which would eat a file's last newline)."""
    proc = subprocess.run(["git", "cat-file", "blob", rev], cwd=repo, capture_output=True)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr.decode().strip())
    return proc.stdout.decode()


def build(dest: Path, specs: tuple[ForkSpec, ...], trees: dict[str, Path], hashes: Mapping[str, str]) -> Corpus:
    """Build upstream and the fork repository under ``dest`` (which must not exist)."""
    from test_git_support import _serve, build_upstream

    dest.mkdir(parents=True)
    work = dest / "upstream-work"
    commits = build_upstream(work, trees, CORPUS_RELEASES)
    _git(dest, "clone", "--quiet", "--bare", str(work), "upstream.git")
    shutil.rmtree(work)  # only its history is needed, not ~130 MB of checked-out files
    upstream = dest / "upstream.git"
    _serve(upstream)
    repo = dest / "forks.git"
    _git(dest, "clone", "--quiet", "--bare", str(upstream), repo.name)
    index = dest / "scratch.index"
    branches = {}
    for spec in specs:
        branches[spec.name] = _branch(repo, spec, commits[spec.base_release], hashes[spec.base_release], index)
    index.unlink(missing_ok=True)
    _git(repo, "repack", "-adq")
    _serve(repo)
    return Corpus(dest, upstream, repo, commits, branches)


def _branch(repo: Path, spec: ForkSpec, base: str, release_sha256: str, index: Path) -> str:
    """Commit ``spec``'s edits (read byte-exactly from ``base``) and the fixture note as branch ``corpus/<name>``."""

    def read(path: str) -> str | None:
        try:
            return _read_text_exact(repo, f"{base}:python/{path}")
        except RuntimeError:
            return None

    texts = apply_edits(spec, read)
    env = {"GIT_INDEX_FILE": str(index)}
    _git(repo, "read-tree", base, env=env)
    files = {f"python/{p}": t for p, t in texts.items()}
    files[MARKER] = fixture_note(spec, release_sha256)
    for path, text in files.items():
        listed = _git(repo, "ls-tree", base, "--", path)
        mode = listed.split(" ", 1)[0] if listed else "100644"
        blob = _hash_blob(repo, text)
        _git(repo, "update-index", "--add", "--cacheinfo", f"{mode},{blob},{path}", env=env)
    tree = _git(repo, "write-tree", env=env)
    message = f"[ACME] {spec.name} (difflab corpus fixture)\n\n{spec.why}\n"
    commit = _git(repo, "commit-tree", tree, "-p", base, stdin=message, date="2026-11-20")
    _git(repo, "update-ref", f"refs/heads/{spec.branch}", commit)
    return commit


def _hash_blob(repo: Path, text: str) -> str:
    proc = subprocess.run(
        ["git", "hash-object", "-w", "--stdin"], cwd=repo, input=text.encode(), capture_output=True, check=True
    )
    return proc.stdout.decode().strip()


def corpus_repos(specs: tuple[ForkSpec, ...] | None = None) -> Corpus:
    """Build (once, under a lock) or reuse the cached corpus of ``specs`` (default: :data:`CORPUS`)."""
    from filelock import FileLock

    from difflab.matrix import load_matrix
    from difflab.paths import cache_root, default_matrix
    from test_git_support import release_trees

    specs = CORPUS if specs is None else specs
    releases = load_matrix(default_matrix()).releases
    hashes = {v: releases[v].sha256 for v in CORPUS_RELEASES}
    root = cache_root() / "test-repos" / f"corpus-{corpus_key(specs, hashes)}"
    root.parent.mkdir(parents=True, exist_ok=True)
    done = root / "done.json"
    with FileLock(str(root) + ".lock"):
        if not done.exists():
            tmp = Path(tempfile.mkdtemp(dir=root.parent, prefix=f".{root.name}-"))
            try:
                built = build(tmp / "c", specs, release_trees(CORPUS_RELEASES), hashes)
                (tmp / "c" / "done.json").write_text(
                    json.dumps({"commits": built.commits, "branches": built.branches}, indent=1) + "\n"
                )
                shutil.rmtree(root, ignore_errors=True)
                os.replace(tmp / "c", root)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    doc = json.loads(done.read_text())
    return Corpus(root, root / "upstream.git", root / "forks.git", doc["commits"], doc["branches"])


# =============================================================================================
# The specs. Paths inside python/.
# =============================================================================================
PREFILL = "sglang/srt/disaggregation/prefill.py"
DECODE = "sglang/srt/disaggregation/decode.py"
UTILS = "sglang/srt/disaggregation/utils.py"
SCHEDULER = "sglang/srt/managers/scheduler.py"
PP_MIXIN = "sglang/srt/managers/scheduler_pp_mixin.py"
COMMON = "sglang/srt/disaggregation/common/conn.py"
MOONCAKE = "sglang/srt/disaggregation/mooncake/conn.py"
ENVIRON = "sglang/srt/environ.py"
DISAGG_FIELDS = "sglang/srt/arg_groups/fields/disagg.py"
VERSION_FILE = "sglang/_version.py"

ALL_ABSENT = dict.fromkeys(FIXES, "absent")
RELEASE_MAP: dict[str, dict[str, str]] = {
    "0.5.19": dict(ALL_ABSENT),
    "0.5.20": {**ALL_ABSENT, "36988": "present"},
    "0.5.21": {**ALL_ABSENT, "36988": "present", "38935": "present", "41404": "present"},
    "0.5.22": {**ALL_ABSENT, "36988": "present", "38935": "present", "41404": "present", "43719a": "present"},
    "0.5.23": {**ALL_ABSENT, "36988": "present", "38935": "present", "41404": "present", "43719a": "present"},
}
"""What each unmodified release carries (#43719(b) is in none)."""


def version_claim(release: str, claim: str) -> Edit:
    """``sglang/_version.py`` of ``release`` rewritten to say ``claim``."""
    old = tuple(int(p) for p in release.split("."))
    new = tuple(int(p) for p in claim.split("."))
    return Edit(
        VERSION_FILE,
        f"__version__ = version = '{release}'\n__version_tuple__ = version_tuple = {old}\n",
        f"__version__ = version = '{claim}'\n__version_tuple__ = version_tuple = {new}\n",
    )


def new_module(path: str, text: str) -> Edit:
    """A module the fork adds (``path`` inside ``python/``, absent from the release)."""
    return Edit(path, "", text, count=0)


def new_env_flag(name: str, default: bool, what: str) -> Edit:
    """A fork's own ``EnvBool`` in ``environ.py``, next to the deferred-release switches (every release has them)."""
    anchor = "    SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT = EnvFloat(30.0)\n"
    return Edit(ENVIRON, anchor, f"{anchor}    # ACME: {what}\n    {name} = EnvBool({default})\n")


# --- #36988 (0.5.20 text) ---------------------------------------------------------------------
FINAL_RETIRE_20 = """                if is_aborted(req):
                    if self._retire_aborted_prefill_result(req):
                        req.time_stats.set_completion_time()
                        aborted_reqs.append(req)
                    advance_logprob_pt(i, req)
                    continue

                # Test hook: exercise the release/requeue retry path.
"""
GRAMMAR_CHECK_20 = """                    req.grammar.finished = req.finished()
                    if is_aborted(req):
"""
MIDDLE_HEAD_20 = """                # Abort is terminal. Do not requeue an aborted optimistic
                # request merely because bootstrap is still pending.
                if is_aborted(req):
                    if not still_chunking and self._retire_aborted_prefill_result(req):
                        req.time_stats.set_completion_time()
                        aborted_reqs.append(req)
                    advance_logprob_pt(i, req)
                    req.time_stats.set_last_chunked_prefill_finish_time()
                    continue

                if req.pending_bootstrap and not still_chunking:
                    self.optimistic_release_and_requeue(req)
                    advance_logprob_pt(i, req)
                    req.time_stats.set_last_chunked_prefill_finish_time()
                    continue
"""
MIDDLE_BASE_ON_20 = """                if req.pending_bootstrap and not still_chunking:
                    self.optimistic_release_and_requeue(req)
                    advance_logprob_pt(i, req)
                    req.time_stats.set_last_chunked_prefill_finish_time()
                    continue

                # Optimistic bootstrap can fail while this overlapped chunk is
                # already running. Drop aborted chunks instead of sending KV.
                if is_aborted(req):
                    self.clear_pending_chunk_send(req)
                    advance_logprob_pt(i, req)
                    req.time_stats.set_last_chunked_prefill_finish_time()
                    continue
"""
SEND_LAST_20 = """                if not req.pending_bootstrap:
                    self.send_kv_chunk(req, last_chunk=True)
                req.time_stats.set_prefill_transfer_queue_entry_time()
"""
STREAM_ABORTED_20 = """        if aborted_reqs:
            self.output_streamer.stream_output(
                aborted_reqs,
                any(req.return_logprob for req in aborted_reqs),
            )

"""


def _retire_aborted_gated(flag: str, default: bool) -> tuple[Edit, ...]:
    """#36988 behind ``envs.<flag>`` read at each use; off = exactly 0.5.19's handling of aborted results."""
    on = f"envs.{flag}.get()"
    return (
        new_env_flag(flag, default, "retire aborted prefill results (upstream #36988) once the rollout is done"),
        Edit(PREFILL, FINAL_RETIRE_20, FINAL_RETIRE_20.replace("if is_aborted(req):", f"if {on} and is_aborted(req):")),
        Edit(
            PREFILL, GRAMMAR_CHECK_20, GRAMMAR_CHECK_20.replace("if is_aborted(req):", f"if {on} and is_aborted(req):")
        ),
        Edit(
            PREFILL,
            MIDDLE_HEAD_20,
            MIDDLE_HEAD_20.replace(
                "                if is_aborted(req):\n", f"                if {on} and is_aborted(req):\n"
            )
            + """
                # ACME: the pre-#36988 handling while the switch is off.
                if is_aborted(req):
                    self.clear_pending_chunk_send(req)
                    advance_logprob_pt(i, req)
                    req.time_stats.set_last_chunked_prefill_finish_time()
                    continue
""",
        ),
    )


# --- #38935 (0.5.21 text) ---------------------------------------------------------------------
PREFILL_DOOR_21 = """        if is_unadmitted_reject(req):
            self.scheduler.retire_unadmitted_request(req)
            return
        if not self.create_sender(req, num_kv_heads):
            return
        self.queue.append(req)
"""
DECODE_DOOR_21 = """        if not is_retracted and not is_rebootstrap and is_unadmitted_reject(req):
            self.scheduler.retire_unadmitted_request(req)
            return
"""
DECODE_RECEIVER_21 = """            decode_req = self._create_receiver_and_enqueue(
                req, is_rebootstrap=is_rebootstrap
            )
"""
PREFILL_QUEUE_INIT_21 = """        self.transfer_backend = transfer_backend
        if envs.SGLANG_DISAGG_STAGING_BUFFER.get():
"""
DECODE_QUEUE_INIT_21 = """        self.transfer_backend = transfer_backend
        # Queue for requests pending pre-allocation
"""
SCHEDULER_INIT_21 = "        self.enable_hicache_storage = get_memory().hicache_storage_backend is not None\n"
KV_MANAGER_INIT_21 = """        self.disaggregation_mode = disaggregation_mode
        self.server_args = server_args
"""
KV_MANAGER_FLAG = """        try:
            self.acme_pd_intake_check = envs.SGLANG_ACME_PD_INTAKE_CHECK.get()
        except AttributeError:  # an environment module without the flag
            self.acme_pd_intake_check = True
"""


def _doors_gated(attr_owner: str) -> tuple[Edit, ...]:
    """Both #38935 doors asking ``<attr_owner>.acme_pd_intake_check`` first."""
    return (
        Edit(
            PREFILL,
            "        if is_unadmitted_reject(req):\n",
            f"        if {attr_owner}.acme_pd_intake_check and is_unadmitted_reject(req):\n",
        ),
        Edit(
            DECODE,
            "        if not is_retracted and not is_rebootstrap and is_unadmitted_reject(req):\n",
            "        if (\n"
            f"            {attr_owner}.acme_pd_intake_check\n"
            "            and not is_retracted\n"
            "            and not is_rebootstrap\n"
            "            and is_unadmitted_reject(req)\n"
            "        ):\n",
        ),
    )


# --- #41404 (0.5.21 text) ---------------------------------------------------------------------
NOTIFY_21 = "                if deferrable and not decode_req.kv_receiver.abort_notified:\n"
HOLD_BLOCK_21 = """                if deferrable and not decode_req.kv_receiver.abort_notified:
                    # A failure decode did not initiate (prefill fault, transport
                    # error, hicache restore failure) can still have sibling-rank
                    # writes in flight toward these pages. force_arm: a partial
                    # send_metadata leaves init_time None though earlier ranks
                    # already hold destinations; this path always reaches
                    # _do_release, which clears the tracker.
                    decode_req.kv_receiver.ensure_abort_notified(force_arm=True)
                if requires_host_drain or (
                    deferrable and decode_req.kv_receiver.abort_notified
                ):
"""
TRANSFER_QUEUE_INIT_21 = """        self.deferred_kv_release_timeout = (
            envs.SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT.get()
        )
"""
DEFERRED_DEFAULT_ON = "    SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE = EnvBool(True)\n"

# --- #43719(a) (0.5.22 text) ------------------------------------------------------------------
KV_POISON_22 = """                            self._poison_unsettled_send(kv_chunk.room)
                            self.conclude_failure(
                                bootstrap_room=kv_chunk.room,
                                failure_reason=(
                                    f"Failed to send kv chunk of {kv_chunk.room} to "
                                    f"{NetworkAddress(req.endpoint, req.dst_port).to_host_port_str()}"
                                ),
                            )
                            break
"""
STATE_POISON_22 = """                                if state_rc != 0:
                                    self._poison_unsettled_send(kv_chunk.room)
"""
STATE_BREAK_22 = """                                if (
                                    self.request_status.get(
                                        kv_chunk.room, KVPoll.Failed
                                    )
                                    == KVPoll.Failed
                                ):
                                    break
"""
AUX_POISON_22 = """                            if ret != 0:
                                # The aux write targets decode's metadata
                                # slot, which the deferred release also frees.
                                self._poison_unsettled_send(req.room)
"""
POISON_GATE_22 = """        if self.enable_deferred_decode_kv_release:
            self.poison_deferred_ack_room(room)
"""
WORKER_EXCEPTION_POISON_22 = """                if kv_chunk is not None:
                    self.poison_deferred_ack_room(kv_chunk.room)
"""
HOST_RECEIVE_FIELD_22 = """No built-in backend currently supports this.",
    ] = 1.0
"""


def _poison_flag_field(default: bool) -> Edit:
    return Edit(
        DISAGG_FIELDS,
        HOST_RECEIVE_FIELD_22,
        HOST_RECEIVE_FIELD_22
        + "    disaggregation_acme_poison_failed_sends: A[\n"
        + "        bool,\n"
        + '        "ACME: withhold the drain ack of a room whose Mooncake send failed (upstream #43719).",\n'
        + f"    ] = {default}\n",
    )


def _poison_gated(read: str) -> tuple[Edit, ...]:
    """#43719(a)'s poison and its abort-during-state-write break, both asking ``read`` first."""
    return (
        Edit(MOONCAKE, POISON_GATE_22, POISON_GATE_22.replace(":\n", f" and {read}:\n", 1)),
        Edit(MOONCAKE, STATE_BREAK_22, STATE_BREAK_22.replace("if (\n", f"if {read} and (\n", 1)),
        Edit(
            MOONCAKE,
            WORKER_EXCEPTION_POISON_22,
            WORKER_EXCEPTION_POISON_22.replace("is not None:", f"is not None and {read}:"),
        ),
    )


# --- #43719(b) (0.5.22 text; no release carries it) ----------------------------------------------
FAILED_ROOM_RELEASE_22 = """        # unlock the tree
        release_kv_cache(req, self.tree_cache, checkpoint=True)
        self._release_aborted_request(req)
"""


def _quarantine_release(keep: str) -> Edit:
    """handle_inflight_transfer_failure keeping the failed room's KV as a prefix only when ``keep``."""
    return Edit(
        PREFILL,
        FAILED_ROOM_RELEASE_22,
        "        # ACME (#43719(b)): a timed-out transfer may still read a failed room's KV; never reuse it.\n"
        f"        release_kv_cache(req, self.tree_cache, checkpoint={keep})\n"
        "        self._release_aborted_request(req)\n",
    )


# --- hand-ports -------------------------------------------------------------------------------
HANDPORT_38935_ONTO_20: tuple[Edit, ...] = (
    Edit(
        UTILS,
        "def is_aborted(req: Req) -> bool:\n",
        '''def acme_rejected_at_intake(req: Req) -> bool:
    """ACME port of upstream #38935: rejected at intake and holding nothing a queue must release.

    A request that already ran (retracted, preempted, or still owning KV, mamba state, a
    metadata slot or a host backup) may carry a pending abort too; its queue releases it.
    """
    if not is_aborted(req):
        return False
    kv = req.kv
    still_owns = kv.holds_kv or kv.holds_mamba or kv.retraction_backup is not None
    return not (req.is_retracted or still_owns or req.metadata_buffer_index >= 0)


def is_aborted(req: Req) -> bool:
''',
    ),
    Edit(
        SCHEDULER,
        '''    def _release_aborted_request(self, req: Req) -> None:
        """Drop the cache-side state an aborted request left behind."""
''',
        '''    def acme_retire_at_door(self, req: Req) -> None:
        """ACME port of upstream #38935: end a request a PD door refused, before it acquired anything."""
        session = req.session
        if session is not None and session.streaming:
            # The session marked itself in flight when the request was created.
            session.abort_req()
            req.session = None
        # The beam coordinator counted the request's group in at intake.
        self.beam_coordinator.retire_group(req)
        self._release_aborted_request(req)
        verdict = req.finished_reason or req.to_finish
        req.time_stats.trace_ctx.abort(abort_info={"reason": verdict.message})
        req.update_finish_state()
        self.output_streamer.stream_output([req], req.return_logprob)

    def _release_aborted_request(self, req: Req) -> None:
        """Drop the cache-side state an aborted request left behind."""
''',
    ),
    Edit(
        PREFILL,
        "from sglang.srt.environ import envs\n",
        "from sglang.srt.disaggregation.utils import acme_rejected_at_intake\nfrom sglang.srt.environ import envs\n",
    ),
    Edit(
        PREFILL,
        """    def add(self, req: Req, num_kv_heads: int) -> None:
        if not self.create_sender(req, num_kv_heads):
""",
        """    def add(self, req: Req, num_kv_heads: int) -> None:
        # ACME: never bootstrap a request intake already rejected.
        if acme_rejected_at_intake(req):
            self.scheduler.acme_retire_at_door(req)
            return
        if not self.create_sender(req, num_kv_heads):
""",
    ),
    Edit(
        DECODE,
        "from sglang.srt.environ import envs\n",
        "from sglang.srt.disaggregation.utils import acme_rejected_at_intake\nfrom sglang.srt.environ import envs\n",
    ),
    Edit(
        DECODE,
        """        ``pop_preallocated``).
        \"\"\"
        if self._check_if_req_exceed_kv_capacity(req):
            return
""",
        """        ``pop_preallocated``).
        \"\"\"
        # ACME: the caller says whether the request re-enters; only a fresh one is checked.
        if not (is_retracted or is_rebootstrap) and acme_rejected_at_intake(req):
            self.scheduler.acme_retire_at_door(req)
            return
        if self._check_if_req_exceed_kv_capacity(req):
            return
""",
    ),
)

GRAMMAR_TAIL_19 = """                req.time_stats.set_prefill_transfer_queue_entry_time()

                if req.grammar is not None:
                    try:
                        req.grammar.accept_token(next_token_id)
                    except ValueError as e:
                        error_message = f"Grammar accept_token failed for req {req.rid} with token {next_token_id}: {e}"
                        prepare_abort(
                            req,
                            error_message,
                            status_code=HTTPStatus.INTERNAL_SERVER_ERROR,
                        )
                    req.grammar.finished = req.finished()
            else:
"""

HANDPORT_36988_ONTO_19: tuple[Edit, ...] = (
    Edit(
        PREFILL,
        "        logprob_pt = 0\n        assert batch.spec_info is result.next_draft_input\n",
        "        logprob_pt = 0\n"
        "        acme_retired: List[Req] = []  # ACME: aborted requests retired below, told once at the end\n"
        "        assert batch.spec_info is result.next_draft_input\n",
    ),
    Edit(
        PREFILL,
        "                # Test hook: exercise the release/requeue retry path.\n",
        """                if is_aborted(req):
                    # ACME port of upstream #36988: an aborted request's result retires it.
                    if self._acme_retire_aborted(req):
                        req.time_stats.set_completion_time()
                        acme_retired.append(req)
                    advance_logprob_pt(i, req)
                    continue

                # Test hook: exercise the release/requeue retry path.
""",
    ),
    Edit(
        PREFILL,
        "                req.output_ids.append(next_token_id)\n"
        "                maybe_cache_unfinished_req(req, self.tree_cache)\n",
        """                req.output_ids.append(next_token_id)
                if req.grammar is not None:
                    # ACME: the grammar verdict comes before the KV is cached or sent.
                    try:
                        req.grammar.accept_token(next_token_id)
                    except ValueError as e:
                        error_message = f"Grammar accept_token failed for req {req.rid} with token {next_token_id}: {e}"
                        prepare_abort(
                            req,
                            error_message,
                            status_code=HTTPStatus.INTERNAL_SERVER_ERROR,
                        )
                    req.grammar.finished = req.finished()
                    if is_aborted(req):
                        if self._acme_retire_aborted(req):
                            req.time_stats.set_completion_time()
                            acme_retired.append(req)
                        advance_logprob_pt(i, req)
                        continue
                maybe_cache_unfinished_req(req, self.tree_cache)
""",
    ),
    Edit(
        PREFILL,
        GRAMMAR_TAIL_19,
        "                req.time_stats.set_prefill_transfer_queue_entry_time()\n            else:\n",
    ),
    Edit(
        PREFILL,
        MIDDLE_BASE_ON_20,
        """                if is_aborted(req):
                    # ACME: abort is terminal; retire once no chunk of it is still running.
                    if not still_chunking and self._acme_retire_aborted(req):
                        req.time_stats.set_completion_time()
                        acme_retired.append(req)
                    advance_logprob_pt(i, req)
                    req.time_stats.set_last_chunked_prefill_finish_time()
                    continue

                if req.pending_bootstrap and not still_chunking:
                    self.optimistic_release_and_requeue(req)
                    advance_logprob_pt(i, req)
                    req.time_stats.set_last_chunked_prefill_finish_time()
                    continue
""",
    ),
    Edit(
        PREFILL,
        "        can_run_cuda_graph = result.can_run_cuda_graph\n        self.metrics_reporter.report_prefill_stats(\n",
        """        if acme_retired:
            self.output_streamer.stream_output(
                acme_retired, any(req.return_logprob for req in acme_retired)
            )

        can_run_cuda_graph = result.can_run_cuda_graph
        self.metrics_reporter.report_prefill_stats(
""",
    ),
    Edit(
        PREFILL,
        "    def clear_pending_chunk_send(self: Scheduler, req: Req) -> None:\n",
        """    def _acme_retire_aborted(self: Scheduler, req: Req) -> bool:
        \"\"\"ACME: free an aborted request's prefill resources once; False if already retired.\"\"\"
        self.clear_pending_chunk_send(req)
        holds_pages = req.kv.holds_kv or req.kv.holds_mamba
        if not holds_pages and req.metadata_buffer_index < 0:
            return False
        if req.disagg_kv_sender is not None:
            try:
                req.disagg_kv_sender.abort()
            except Exception:
                # Telling the transport is best effort; the local release must still happen.
                logger.exception("ACME: KV sender abort failed for %s", req.rid)
        if req.to_finish is not None and not req.finished():
            req.update_finish_state()
        maybe_release_metadata_buffer(req, self.req_to_metadata_buffer_idx_allocator)
        req.pending_bootstrap = False
        if self.enable_hicache_storage:
            self.tree_cache.release_aborted_request(req.rid)
        if holds_pages:
            release_kv_cache(req, self.tree_cache, is_insert=False)
        return True

    def clear_pending_chunk_send(self: Scheduler, req: Req) -> None:
""",
    ),
)

HANDPORT_41404_ONTO_20: tuple[Edit, ...] = (
    Edit(
        DECODE,
        """                if (
                    self.enable_deferred_kv_release
                    and decode_req.kv_receiver.kv_mgr.enable_deferred_decode_kv_release
                    and decode_req.kv_receiver.abort_notified
                ):
""",
        """                pages_can_wait = (
                    self.enable_deferred_kv_release
                    and decode_req.kv_receiver.kv_mgr.enable_deferred_decode_kv_release
                )
                if pages_can_wait and not decode_req.kv_receiver.abort_notified:
                    # ACME port of the "defer every failure kind" fix: a failure decode did not
                    # start may still have sibling prefill ranks writing these pages.
                    decode_req.kv_receiver.acme_notify_prefill_of_failure()
                if pages_can_wait and decode_req.kv_receiver.abort_notified:
""",
    ),
    Edit(
        COMMON,
        """    def _send_abort_notification(self):
        for bootstrap_info in self.bootstrap_infos:
""",
        """    def acme_notify_prefill_of_failure(self) -> None:
        \"\"\"ACME: tell every prefill rank about a failure decode did not initiate, once.

        The drain-ack tracker is armed even when metadata was only partly published.\"\"\"
        if (
            not self.abort_notified
            and hasattr(self, "bootstrap_infos")
            and self.bootstrap_infos is not None
        ):
            self._send_abort_notification(arm_unpublished=True)
            self.abort_notified = True

    def _send_abort_notification(self, arm_unpublished: bool = False):
        # ACME: arm drain-ack accounting before the ABORT leaves, so a fast ack is counted.
        if self.kv_mgr.enable_deferred_decode_kv_release and (
            arm_unpublished or self.init_time is not None
        ):
            self.kv_mgr.register_deferred_abort_room(self.bootstrap_room)
        for bootstrap_info in self.bootstrap_infos:
""",
    ),
    Edit(
        SCHEDULER,
        """                    receiver.abort()
                    # Arm drain-ack accounting once the ABORT is sent, so acks
                    # arriving before this req is deferred (e.g. during the next
                    # forward step) are captured. A fresh set also drops stale acks
                    # from a prior request that reused this bootstrap_room. A
                    # redundant abort only re-wipes -- holds longer, never releases
                    # early -- so no transition guard is needed.
                    if (
                        receiver.kv_mgr.enable_deferred_decode_kv_release
                        and receiver.abort_notified
                    ):
                        receiver.kv_mgr.register_deferred_abort_room(
                            decode_req.req.bootstrap_room
                        )
""",
        """                    # ACME: the receiver arms drain-ack accounting before it sends the ABORT.
                    receiver.abort()
""",
    ),
)

HANDPORT_43719A_ONTO_21: tuple[Edit, ...] = (
    Edit(
        COMMON,
        "        self.request_status: Dict[int, KVPoll] = {}\n",
        "        self.request_status: Dict[int, KVPoll] = {}\n"
        "        # ACME port of upstream #43719(a): rooms whose submitted send failed; a failed\n"
        "        # send may still be writing decode's pages, so their drain is never acked.\n"
        "        self._acme_unsettled_rooms: Set[int] = set()\n",
    ),
    Edit(
        COMMON,
        """            if status in (KVPoll.Bootstrapping, KVPoll.WaitingForInput):
                self.request_status[bootstrap_room] = status
            return
""",
        """            if status in (KVPoll.Bootstrapping, KVPoll.WaitingForInput):
                # ACME: a new lifecycle of the room starts settled.
                self._acme_unsettled_rooms.discard(bootstrap_room)
                self.request_status[bootstrap_room] = status
            return
""",
    ),
    Edit(
        COMMON,
        """        if self._staging_outstanding.get(room, 0) > 0:
            return
        target = self._deferred_ack_targets.pop(room, None)
""",
        """        if self._staging_outstanding.get(room, 0) > 0:
            return
        if room in self._acme_unsettled_rooms:
            self._deferred_ack_targets.pop(room, None)
            self._deferred_ack_fanout_snapshots.pop(room, None)
            return
        target = self._deferred_ack_targets.pop(room, None)
""",
    ),
    Edit(
        COMMON,
        "        self._deferred_ack_fanout_snapshots[room] = self._abort_ack_fanout_targets(room)\n",
        "        if room in self._acme_unsettled_rooms:\n"
        "            return\n"
        "        self._deferred_ack_fanout_snapshots[room] = self._abort_ack_fanout_targets(room)\n",
    ),
    Edit(
        COMMON,
        """    def get_kv_replica_factor(self) -> int:
""",
        """    def acme_mark_unsettled(self, room: int) -> None:
        \"\"\"ACME: a send for ``room`` failed and may still be writing: never ack its drain.\"\"\"
        if self.enable_deferred_decode_kv_release:
            self._deferred_ack_targets.pop(room, None)
            self._deferred_ack_fanout_snapshots.pop(room, None)
            self._acme_unsettled_rooms.add(room)

    def get_kv_replica_factor(self) -> int:
""",
    ),
    Edit(
        MOONCAKE,
        """                                    logger.error(
                                        f"Session {req.mooncake_session_id} failed."
                                    )
                            self.conclude_failure(
""",
        """                                    logger.error(
                                        f"Session {req.mooncake_session_id} failed."
                                    )
                            self.acme_mark_unsettled(kv_chunk.room)
                            self.conclude_failure(
""",
    ),
    Edit(
        MOONCAKE,
        """                                    target_rank_registration_info,
                                )
                                if state_rc != 0:
""",
        """                                    target_rank_registration_info,
                                )
                                if state_rc != 0:
                                    self.acme_mark_unsettled(kv_chunk.room)
                                if (
                                    self.request_status.get(kv_chunk.room, KVPoll.Failed)
                                    == KVPoll.Failed
                                ):
                                    # ACME: decode aborted during the state write: stop here.
                                    break
                                if state_rc != 0:
""",
    ),
    Edit(
        MOONCAKE,
        "                            polls.append(True if ret == 0 else False)\n",
        "                            if ret != 0:\n"
        "                                self.acme_mark_unsettled(req.room)\n"
        "                            polls.append(True if ret == 0 else False)\n",
    ),
    Edit(
        MOONCAKE,
        """                        else:
                            # Concluded/unknown AND quiescent (the branch above
""",
        """                        elif room_to_be_aborted not in self._acme_unsettled_rooms:
                            # Concluded/unknown AND quiescent (the branch above
""",
    ),
    Edit(
        MOONCAKE,
        """        while True:
            try:
                kv_chunk: TransferKVChunk = queue.get()
""",
        """        while True:
            kv_chunk: Optional[TransferKVChunk] = None
            try:
                kv_chunk = queue.get()
""",
    ),
    Edit(
        MOONCAKE,
        """            except Exception as e:
                # NOTE(shangming): Remove this when we make sure the transfer thread is bug-free
                raise RuntimeError(
                    f"Transfer thread failed""",
        """            except Exception as e:
                # NOTE(shangming): Remove this when we make sure the transfer thread is bug-free
                if kv_chunk is not None:
                    self.acme_mark_unsettled(kv_chunk.room)
                raise RuntimeError(
                    f"Transfer thread failed""",
    ),
)


def _release(version: str) -> ForkSpec:
    return ForkSpec(
        name=f"release-{version}",
        cls="unmodified",
        base_release=version,
        edits=(),
        expect=RELEASE_MAP[version],
        why=f"unmodified: SGLang {version} as released; the known map (#43719(b) is in no release)",
        forced_note={"41404": DEFERRED_OFF_NOTE} if version in ("0.5.19", "0.5.20") else {},
    )


CORPUS: tuple[ForkSpec, ...] = (
    # -- unmodified releases ------------------------------------------------------------------
    *(_release(v) for v in CORPUS_RELEASES),
    # -- version strings that lie -------------------------------------------------------------
    ForkSpec(
        name="lie-0.5.20-says-0.5.21",
        cls="version-lie",
        base_release="0.5.20",
        edits=(version_claim("0.5.20", "0.5.21"),),
        expect=RELEASE_MAP["0.5.20"],
        why="version-lie: 0.5.20 code claiming 0.5.21; behaviour is 0.5.20's (#36988 only), whatever the string says",
    ),
    ForkSpec(
        name="lie-0.5.22-says-0.5.19",
        cls="version-lie",
        base_release="0.5.22",
        edits=(version_claim("0.5.22", "0.5.19"),),
        expect=RELEASE_MAP["0.5.22"],
        why="version-lie: 0.5.22 code claiming 0.5.19; it carries every released fix, the string notwithstanding",
    ),
    # -- the deferred-release default flipped off --------------------------------------------
    ForkSpec(
        name="deferred-off-0.5.21",
        cls="deferred-default-off",
        base_release="0.5.21",
        edits=(Edit(ENVIRON, DEFERRED_DEFAULT_ON, DEFERRED_DEFAULT_ON.replace("True", "False")),),
        expect={"41404": "present", "43719a": "absent"},
        forced_note={"41404": DEFERRED_OFF_NOTE},
        why="deferred-default-off: 0.5.21 shipping deferred release off; #41404's code is the head's (present, "
        "judged with the switch forced on) and the note must say the fix is inactive unless the switch is set",
    ),
    ForkSpec(
        name="deferred-off-0.5.23",
        cls="deferred-default-off",
        base_release="0.5.23",
        edits=(Edit(ENVIRON, DEFERRED_DEFAULT_ON, DEFERRED_DEFAULT_ON.replace("True", "False")),),
        expect={"41404": "present", "43719a": "present"},
        forced_note={"41404": DEFERRED_OFF_NOTE, "43719a": DEFERRED_OFF_NOTE},
        why="deferred-default-off: 0.5.23 shipping deferred release off; both deferred-release fixes' code is the "
        "head's (present under the forced switch) and both verdicts must say it is off by default",
    ),
    # -- #36988 -----------------------------------------------------------------------------------
    ForkSpec(
        name="36988-final-result-only",
        cls="partial-path",
        base_release="0.5.20",
        edits=(Edit(PREFILL, MIDDLE_HEAD_20, MIDDLE_BASE_ON_20),),
        expect={"36988": "partial"},
        why="partial-path: the final-result retire is ported but the middle-chunk branch is 0.5.19's (an aborted "
        "middle chunk leaks its KV/slot/sender, a pending-bootstrap one is requeued): final head-like, middle base",
    ),
    ForkSpec(
        name="36988-middle-chunk-only",
        cls="partial-path",
        base_release="0.5.20",
        edits=(
            Edit(PREFILL, FINAL_RETIRE_20, "                # Test hook: exercise the release/requeue retry path.\n"),
        ),
        expect={"36988": "partial"},
        why="partial-path: the middle-chunk retire is ported but an aborted final result is cached, queued and sent "
        "as on 0.5.19: middle head-like, final base-like",
    ),
    ForkSpec(
        name="36988-retire-after-send",
        cls="reordered",
        base_release="0.5.20",
        edits=(
            Edit(PREFILL, FINAL_RETIRE_20, "                # Test hook: exercise the release/requeue retry path.\n"),
            Edit(
                PREFILL,
                SEND_LAST_20,
                """                if not req.pending_bootstrap:
                    self.send_kv_chunk(req, last_chunk=True)
                if is_aborted(req):
                    if self._retire_aborted_prefill_result(req):
                        req.time_stats.set_completion_time()
                        aborted_reqs.append(req)
                    continue
                req.time_stats.set_prefill_transfer_queue_entry_time()
""",
            ),
        ),
        expect={"36988": "partial"},
        why="reordered: the final-result retire runs after the token append, radix insert, inflight enqueue and "
        "last-chunk send (the KV still goes to decode); the release/stream half is head-like: the path is mixed",
    ),
    ForkSpec(
        name="36988-abort-not-streamed",
        cls="partial-hunk",
        base_release="0.5.20",
        edits=(Edit(PREFILL, STREAM_ABORTED_20, ""),),
        expect={"36988": "partial"},
        why="partial-hunk: retirement ported without streaming the abort to the client (stream-once dropped): "
        "resources head-like, the client hears nothing as on the base",
    ),
    ForkSpec(
        name="36988-release-inserts",
        cls="partial-hunk",
        base_release="0.5.20",
        edits=(
            Edit(
                PREFILL,
                "release_kv_cache(req, self.tree_cache, is_insert=False)\n        return True\n",
                "release_kv_cache(req, self.tree_cache, is_insert=True)\n        return True\n",
            ),
        ),
        expect={"36988": "partial"},
        why="partial-hunk: the retire releases the aborted request's KV with insert, so its pages still enter the "
        "radix tree as on the base; every other effect of the retire is the head's",
    ),
    ForkSpec(
        name="36988-gated-environ-off",
        cls="flag-environ-off",
        base_release="0.5.20",
        edits=_retire_aborted_gated("SGLANG_ACME_RETIRE_ABORTED_PREFILL", False),
        expect={"36988": "absent"},
        why="flag-environ-off: every #36988 path behind a new EnvBool(False) read where it is used; off restores "
        "0.5.19's handling exactly, so under the build's defaults every path is base-like",
    ),
    ForkSpec(
        name="36988-gated-environ-on",
        cls="flag-environ-on",
        base_release="0.5.20",
        edits=_retire_aborted_gated("SGLANG_ACME_RETIRE_ABORTED_PREFILL", True),
        expect={"36988": "present"},
        why="flag-environ-on: the same gate with EnvBool(True): under the build's defaults it is 0.5.20's code",
    ),
    ForkSpec(
        name="36988-helper-renamed",
        cls="refactor",
        base_release="0.5.20",
        edits=(Edit(PREFILL, "_retire_aborted_prefill_result", "_retire_aborted_result", count=5),),
        expect={"36988": "present"},
        why="refactor: _retire_aborted_prefill_result renamed _retire_aborted_result (definition and 4 callers)",
    ),
    ForkSpec(
        name="36988-locals-renamed",
        cls="refactor",
        base_release="0.5.20",
        edits=(
            Edit(PREFILL, "owns_resources", "still_owns_something", count=2),
            Edit(PREFILL, "still_chunking", "next_chunk_launched", count=3),
        ),
        expect={"36988": "present"},
        why="refactor: the helper's owns_resources and the middle branch's still_chunking locals renamed",
    ),
    ForkSpec(
        name="36988-handport-onto-0.5.19",
        cls="hand-port",
        base_release="0.5.19",
        edits=HANDPORT_36988_ONTO_19,
        expect={"36988": "present"},
        why="hand-port: #36988 onto 0.5.19 with its own helper _acme_retire_aborted and list: the final result, a "
        "grammar rejection (now judged before caching) and a middle chunk with none still running retire the "
        "request once (sender told best-effort, slot, cache, KV without insert), streamed once; nothing requeued",
    ),
    # -- #38935 -----------------------------------------------------------------------------------
    ForkSpec(
        name="38935-prefill-door-only",
        cls="partial-door",
        base_release="0.5.21",
        edits=(Edit(DECODE, DECODE_DOOR_21, ""),),
        expect={"38935": "partial"},
        why="partial-door: the decode door's intake check removed; the prefill door retires, decode admits",
    ),
    ForkSpec(
        name="38935-decode-door-only",
        cls="partial-door",
        base_release="0.5.21",
        edits=(Edit(PREFILL, PREFILL_DOOR_21, PREFILL_DOOR_21.split("\n", 3)[3]),),
        expect={"38935": "partial"},
        why="partial-door: the prefill door's intake check removed; the decode door retires, prefill bootstraps",
    ),
    ForkSpec(
        name="38935-no-group-retire",
        cls="partial-hunk",
        base_release="0.5.21",
        edits=(
            Edit(
                SCHEDULER,
                "        self.beam_coordinator.retire_group(req)\n        # PREFILL runs",
                "        # PREFILL runs",
            ),
        ),
        expect={"38935": "partial"},
        why="partial-hunk: both doors retire, but retire_unadmitted_request no longer retires the request's beam "
        "group, which stays counted live as on the base",
    ),
    ForkSpec(
        name="38935-no-session-detach",
        cls="partial-hunk",
        base_release="0.5.21",
        edits=(
            Edit(
                SCHEDULER,
                "        # while scheduling; a session left in-flight rejects every later request.\n"
                "        if req.session is not None and req.session.streaming:\n"
                "            req.session.abort_req()\n"
                "            req.session = None\n",
                "        # while scheduling; a session left in-flight rejects every later request.\n",
            ),
        ),
        expect={"38935": "partial"},
        why="partial-hunk: retirement at the doors without aborting/detaching the request's streaming session, "
        "which stays in flight as on the base",
    ),
    ForkSpec(
        name="38935-no-cache-finish",
        cls="partial-hunk",
        base_release="0.5.21",
        edits=(
            Edit(
                SCHEDULER,
                "        # that, and a retired request reaches neither.\n        self._release_aborted_request(req)\n",
                "        # that, and a retired request reaches neither.\n",
            ),
        ),
        expect={"38935": "partial"},
        why="partial-hunk: the retire never tells the tree cache the request ended aborted (its paced-retry entry "
        "stays armed as on the base); door, finish state and stream are the head's",
    ),
    ForkSpec(
        name="38935-check-after-sender",
        cls="reordered",
        base_release="0.5.21",
        edits=(
            Edit(
                PREFILL,
                PREFILL_DOOR_21,
                """        if not self.create_sender(req, num_kv_heads):
            return
        if is_unadmitted_reject(req):
            self.scheduler.retire_unadmitted_request(req)
            return
        self.queue.append(req)
""",
            ),
        ),
        expect={"38935": "partial"},
        why="reordered: the prefill door checks only after create_sender, so a rejected request still gets a KV "
        "sender (bootstrap handshake, never aborted) though it is then retired; the decode door is the head's",
    ),
    ForkSpec(
        name="38935-check-after-receiver",
        cls="reordered",
        base_release="0.5.21",
        edits=(
            Edit(DECODE, DECODE_DOOR_21, ""),
            Edit(
                DECODE,
                DECODE_RECEIVER_21,
                DECODE_RECEIVER_21
                + """            if not is_rebootstrap and is_unadmitted_reject(req):
                self.scheduler.retire_unadmitted_request(req)
                return
""",
            ),
        ),
        expect={"38935": "partial"},
        why="reordered: the decode door checks only after _create_receiver_and_enqueue, so a rejected request "
        "gets a KV receiver and a prealloc-queue entry before it is retired; the prefill door is the head's",
    ),
    ForkSpec(
        name="38935-gated-scheduler-init-off",
        cls="flag-init-off",
        base_release="0.5.21",
        edits=(
            new_env_flag("SGLANG_ACME_PD_INTAKE_CHECK", False, "upstream #38935's intake check at the PD doors"),
            Edit(
                SCHEDULER,
                SCHEDULER_INIT_21,
                SCHEDULER_INIT_21 + "        self.acme_pd_intake_check = envs.SGLANG_ACME_PD_INTAKE_CHECK.get()\n",
            ),
            *_doors_gated("self.scheduler"),
        ),
        expect={"38935": "absent"},
        why="flag-init-off: both doors ask a flag Scheduler.__init__ sets from a new EnvBool(False): by default "
        "neither door checks, exactly 0.5.20's admission",
    ),
    ForkSpec(
        name="38935-gated-queue-init-on",
        cls="flag-init-on",
        base_release="0.5.21",
        edits=(
            new_env_flag("SGLANG_ACME_PD_INTAKE_CHECK", True, "upstream #38935's intake check at the PD doors"),
            Edit(
                PREFILL,
                PREFILL_QUEUE_INIT_21,
                PREFILL_QUEUE_INIT_21.replace(
                    "        if envs.",
                    "        self.acme_pd_intake_check = envs.SGLANG_ACME_PD_INTAKE_CHECK.get()\n        if envs.",
                ),
            ),
            Edit(
                DECODE,
                DECODE_QUEUE_INIT_21,
                DECODE_QUEUE_INIT_21.replace(
                    "        # Queue",
                    "        self.acme_pd_intake_check = envs.SGLANG_ACME_PD_INTAKE_CHECK.get()\n        # Queue",
                ),
            ),
            *_doors_gated("self"),
        ),
        expect={"38935": "present"},
        why="flag-init-on: each queue's __init__ sets the flag from a new EnvBool(True): by default both doors "
        "check, exactly 0.5.21's admission",
    ),
    ForkSpec(
        name="38935-gated-kv-manager-init-off",
        cls="flag-init-off",
        base_release="0.5.21",
        edits=(
            new_env_flag("SGLANG_ACME_PD_INTAKE_CHECK", False, "upstream #38935's intake check at the PD doors"),
            Edit(COMMON, KV_MANAGER_INIT_21, KV_MANAGER_INIT_21 + KV_MANAGER_FLAG),
            *_doors_gated("self.kv_manager"),
        ),
        expect={"38935": "absent"},
        why="flag-init-off: both doors ask a flag every transfer back end's KV manager constructor "
        "(CommonKVManager.__init__) sets inside a try from a new EnvBool(False), which only running the "
        "constructor answers: by default neither door checks, exactly 0.5.20's admission",
    ),
    ForkSpec(
        name="38935-gated-kv-manager-init-on",
        cls="flag-init-on",
        base_release="0.5.21",
        edits=(
            new_env_flag("SGLANG_ACME_PD_INTAKE_CHECK", True, "upstream #38935's intake check at the PD doors"),
            Edit(COMMON, KV_MANAGER_INIT_21, KV_MANAGER_INIT_21 + KV_MANAGER_FLAG),
            *_doors_gated("self.kv_manager"),
        ),
        expect={"38935": "present"},
        why="flag-init-on: both doors ask a flag every transfer back end's KV manager constructor "
        "(CommonKVManager.__init__) sets inside a try from a new EnvBool(True), which only running the "
        "constructor answers: by default both doors check, exactly 0.5.21's admission",
    ),
    ForkSpec(
        name="38935-predicate-inlined",
        cls="refactor",
        base_release="0.5.21",
        edits=(
            Edit(
                PREFILL,
                "        if is_unadmitted_reject(req):\n",
                """        if is_aborted(req) and not (
            req.is_retracted
            or req.kv.holds_kv
            or req.kv.holds_mamba
            or req.metadata_buffer_index >= 0
            or req.kv.retraction_backup is not None
        ):
""",
            ),
        ),
        expect={"38935": "present"},
        why="refactor: the prefill door inlines is_unadmitted_reject's expression; same behaviour at both doors",
    ),
    ForkSpec(
        name="38935-retire-renamed",
        cls="refactor",
        base_release="0.5.21",
        edits=(
            Edit(SCHEDULER, "def retire_unadmitted_request(", "def retire_rejected_at_door("),
            Edit(
                PREFILL, "self.scheduler.retire_unadmitted_request(req)", "self.scheduler.retire_rejected_at_door(req)"
            ),
            Edit(
                DECODE, "self.scheduler.retire_unadmitted_request(req)", "self.scheduler.retire_rejected_at_door(req)"
            ),
            Edit(
                SCHEDULER,
                "        reason = req.finished_reason or req.to_finish\n",
                "        why = req.finished_reason or req.to_finish\n",
            ),
            Edit(
                SCHEDULER,
                'abort_info={"reason": reason.message})\n        req.update_finish_state()',
                'abort_info={"reason": why.message})\n        req.update_finish_state()',
            ),
        ),
        expect={"38935": "present"},
        why="refactor: Scheduler.retire_unadmitted_request renamed retire_rejected_at_door at its definition and "
        "both doors, and its local reason renamed why",
    ),
    ForkSpec(
        name="38935-handport-onto-0.5.20",
        cls="hand-port",
        base_release="0.5.20",
        edits=HANDPORT_38935_ONTO_20,
        expect={"38935": "present"},
        why="hand-port: #38935 onto 0.5.20 with its own predicate (acme_rejected_at_intake, same five clauses "
        "written differently), its own Scheduler.acme_retire_at_door (session, beam group, cache, finish state, "
        "stream) and both door checks before any sender/receiver",
    ),
    # -- #41404 -----------------------------------------------------------------------------------
    ForkSpec(
        name="41404-notify-without-hold",
        cls="partial-hunk",
        base_release="0.5.21",
        edits=(
            Edit(
                DECODE,
                HOLD_BLOCK_21,
                "                was_notified = decode_req.kv_receiver.abort_notified\n"
                + HOLD_BLOCK_21.replace(
                    "if deferrable and not decode_req.kv_receiver.abort_notified:",
                    "if deferrable and not was_notified:",
                ).replace("deferrable and decode_req.kv_receiver.abort_notified\n", "deferrable and was_notified\n"),
            ),
        ),
        expect={"41404": "partial"},
        why="partial-hunk: a failure decode did not initiate now sends ABORT to the prefill ranks (head-like) but "
        "the hold decision reads the notified flag from before the notify, so the pages are freed at once (base)",
    ),
    ForkSpec(
        name="41404-gated-init-off",
        cls="flag-init-off",
        base_release="0.5.21",
        edits=(
            new_env_flag("SGLANG_ACME_DEFER_EVERY_FAILURE", False, "hold pages on every transfer-failure kind"),
            Edit(
                DECODE,
                TRANSFER_QUEUE_INIT_21,
                TRANSFER_QUEUE_INIT_21
                + "        self.acme_defer_every_failure = envs.SGLANG_ACME_DEFER_EVERY_FAILURE.get()\n",
            ),
            Edit(
                DECODE,
                NOTIFY_21,
                "                if (\n"
                "                    deferrable\n"
                "                    and self.acme_defer_every_failure\n"
                "                    and not decode_req.kv_receiver.abort_notified\n"
                "                ):\n",
            ),
        ),
        expect={"41404": "partial"},
        why="flag-init-off: the notify-and-hold for failures decode did not initiate behind a flag "
        "DecodeTransferQueue.__init__ sets from a new EnvBool(False): by default such failures release at once "
        "(base-like), while the fork keeps the fix's other path, the receiver arming its drain tracker before it "
        "sends ABORT (head-like): partial, not absent",
    ),
    ForkSpec(
        name="41404-gated-environ-on",
        cls="flag-environ-on",
        base_release="0.5.21",
        edits=(
            new_env_flag("SGLANG_ACME_DEFER_EVERY_FAILURE", True, "hold pages on every transfer-failure kind"),
            Edit(
                DECODE,
                NOTIFY_21,
                "                if (\n"
                "                    deferrable\n"
                "                    and envs.SGLANG_ACME_DEFER_EVERY_FAILURE.get()\n"
                "                    and not decode_req.kv_receiver.abort_notified\n"
                "                ):\n",
            ),
        ),
        expect={"41404": "present"},
        why="flag-environ-on: the same notify behind a new EnvBool(True) read in pop_transferred: by default it "
        "is 0.5.21's behaviour",
    ),
    ForkSpec(
        name="41404-held-releases",
        cls="refactor",
        base_release="0.5.21",
        edits=(Edit(DECODE, "self._deferred_releases", "self._held_releases", count=8),),
        expect={"41404": "present"},
        why="refactor: the transfer queue's fix state self._deferred_releases renamed self._held_releases at all "
        "8 uses (its methods keep their names)",
    ),
    ForkSpec(
        name="41404-deferrable-helper",
        cls="refactor",
        base_release="0.5.21",
        edits=(
            Edit(
                DECODE,
                """                deferrable = (
                    self.enable_deferred_kv_release
                    and decode_req.kv_receiver.kv_mgr.enable_deferred_decode_kv_release
                )
""",
                "",
            ),
            Edit(DECODE, NOTIFY_21, NOTIFY_21.replace("if deferrable and", "if self._pages_may_wait(decode_req) and")),
            Edit(
                DECODE,
                "                    deferrable and decode_req.kv_receiver.abort_notified\n",
                "                    self._pages_may_wait(decode_req)\n"
                "                    and decode_req.kv_receiver.abort_notified\n",
            ),
            Edit(
                DECODE,
                "    def pop_transferred(self, rids_to_check: Optional[List[str]] = None) -> List[Req]:\n",
                """    def _pages_may_wait(self, decode_req: DecodeRequest) -> bool:
        \"\"\"Both sides agree to hold an aborted request's pages until prefill drains.\"\"\"
        return (
            self.enable_deferred_kv_release
            and decode_req.kv_receiver.kv_mgr.enable_deferred_decode_kv_release
        )

    def pop_transferred(self, rids_to_check: Optional[List[str]] = None) -> List[Req]:
""",
            ),
        ),
        expect={"41404": "present"},
        why="refactor: pop_transferred's deferrable local replaced by a _pages_may_wait(decode_req) method",
    ),
    ForkSpec(
        name="41404-handport-onto-0.5.20",
        cls="hand-port",
        base_release="0.5.20",
        edits=HANDPORT_41404_ONTO_20,
        expect={"41404": "present"},
        why="hand-port: #41404 onto 0.5.20 with its own receiver method acme_notify_prefill_of_failure (arms the "
        "tracker even before metadata is published, notifies once) called for failures decode did not initiate, "
        "the hold decided after it, and arming moved before the ABORT as on the head",
    ),
    # -- #43719(b): no release has it, forks may ----------------------------------------------
    ForkSpec(
        name="43719b-handport-onto-0.5.22",
        cls="hand-port",
        base_release="0.5.22",
        edits=(_quarantine_release("False"),),
        expect={"43719b": "present", "43719a": "present"},
        why="hand-port: #43719(b), which no release carries, onto 0.5.22: handle_inflight_transfer_failure "
        "releases a failed room's KV without checkpointing it into the radix tree",
    ),
    ForkSpec(
        name="43719b-gated-quarantine-off",
        cls="flag-init-off",
        base_release="0.5.22",
        edits=(
            new_env_flag("SGLANG_ACME_QUARANTINE_FAILED_ROOMS", False, "keep failed rooms' KV out of the radix tree"),
            Edit(
                SCHEDULER,
                SCHEDULER_INIT_21,
                SCHEDULER_INIT_21
                + "        self.enable_failed_room_quarantine = envs.SGLANG_ACME_QUARANTINE_FAILED_ROOMS.get()\n",
            ),
            _quarantine_release("not self.enable_failed_room_quarantine"),
        ),
        expect={"43719b": "absent"},
        why="flag-init-off: #43719(b) behind a quarantine-named flag Scheduler.__init__ sets from a new "
        "EnvBool(False): by default the failed room's KV is still inserted, as on every release",
    ),
    ForkSpec(
        name="43719b-gated-environ-on",
        cls="flag-environ-on",
        base_release="0.5.22",
        edits=(
            new_env_flag("SGLANG_ACME_QUARANTINE_FAILED_ROOMS", True, "keep failed rooms' KV out of the radix tree"),
            _quarantine_release("not envs.SGLANG_ACME_QUARANTINE_FAILED_ROOMS.get()"),
        ),
        expect={"43719b": "present"},
        why="flag-environ-on: #43719(b) behind a new EnvBool(True) read where the KV is released: by default the "
        "failed room's KV is not inserted",
    ),
    # -- #43719(a) --------------------------------------------------------------------------------
    ForkSpec(
        name="43719a-kv-send-only",
        cls="partial-hunk",
        base_release="0.5.22",
        edits=(
            Edit(
                MOONCAKE,
                STATE_POISON_22,
                "                                if state_rc != 0:\n                                    pass\n",
            ),
            Edit(MOONCAKE, AUX_POISON_22, ""),
        ),
        expect={"43719a": "partial"},
        why="partial-hunk: a failed KV chunk send poisons the room but a failed state write or aux write still "
        "acks the drain as on 0.5.21",
    ),
    ForkSpec(
        name="43719a-no-kv-send-poison",
        cls="partial-hunk",
        base_release="0.5.22",
        edits=(Edit(MOONCAKE, KV_POISON_22, KV_POISON_22.split("\n", 1)[1]),),
        expect={"43719a": "partial"},
        why="partial-hunk: the state and aux write failures poison the room, a failed KV chunk send does not "
        "(acks as on 0.5.21)",
    ),
    ForkSpec(
        name="43719a-no-state-abort-break",
        cls="partial-hunk",
        base_release="0.5.22",
        edits=(Edit(MOONCAKE, STATE_BREAK_22, ""),),
        expect={"43719a": "partial"},
        why="partial-hunk: every poison kept, but an ABORT during the state write no longer stops the aux write "
        "and session failure (0.5.21's flow on that path)",
    ),
    ForkSpec(
        name="43719a-poison-after-conclude",
        cls="reordered",
        base_release="0.5.22",
        edits=(
            Edit(
                MOONCAKE,
                KV_POISON_22,
                KV_POISON_22.split("\n", 1)[1].replace(
                    "                            break\n",
                    "                            self._poison_unsettled_send(kv_chunk.room)\n"
                    "                            break\n",
                ),
            ),
        ),
        expect={"43719a": "present"},
        why="reordered, harmless: the KV-send poison moved after conclude_failure, which sends no ack; the room "
        "is poisoned before the worker's drain check, so no path changes",
    ),
    ForkSpec(
        name="43719a-gated-serverargs-off",
        cls="flag-serverargs-off",
        base_release="0.5.22",
        edits=(
            _poison_flag_field(False),
            Edit(
                MOONCAKE,
                "        self.enable_trace = get_observability().enable_trace\n",
                "        self.enable_trace = get_observability().enable_trace\n"
                "        self.acme_poison_failed_sends = server_args.disaggregation_acme_poison_failed_sends\n",
            ),
            *_poison_gated("self.acme_poison_failed_sends"),
        ),
        expect={"43719a": "partial"},
        why="flag-serverargs-off: the poison and the abort-during-state-write break behind a new ServerArgs field "
        "(default False) that MooncakeKVManager.__init__ reads: by default every failed send acks as on 0.5.21 on "
        "Mooncake (absent there); NIXL's worker is 0.5.22's and poisons the unsettled room (present there)",
    ),
    ForkSpec(
        name="43719a-gated-serverargs-on",
        cls="flag-serverargs-on",
        base_release="0.5.22",
        edits=(
            _poison_flag_field(True),
            Edit(
                MOONCAKE,
                "from sglang.srt.runtime_context import (\n    get_memory,\n",
                "from sglang.srt.runtime_context import (\n    get_disagg,\n    get_memory,\n",
            ),
            *_poison_gated("get_disagg().disaggregation_acme_poison_failed_sends"),
        ),
        expect={"43719a": "present"},
        why="flag-serverargs-on: the same gate on a new ServerArgs field (default True) read at use through "
        "get_disagg(): by default it is 0.5.22's behaviour",
    ),
    ForkSpec(
        name="43719a-rooms-without-ack",
        cls="refactor",
        base_release="0.5.22",
        edits=(Edit(COMMON, "_deferred_ack_poisoned_rooms", "_rooms_without_ack", count=5),),
        expect={"43719a": "present"},
        why="refactor: the fix state _deferred_ack_poisoned_rooms renamed _rooms_without_ack everywhere",
    ),
    ForkSpec(
        name="43719a-poison-helper-renamed",
        cls="refactor",
        base_release="0.5.22",
        edits=(Edit(MOONCAKE, "_poison_unsettled_send", "_withhold_drain_ack", count=4),),
        expect={"43719a": "present"},
        why="refactor: MooncakeKVManager._poison_unsettled_send renamed _withhold_drain_ack (definition, 3 callers)",
    ),
    ForkSpec(
        name="43719a-handport-onto-0.5.21",
        cls="hand-port",
        base_release="0.5.21",
        edits=HANDPORT_43719A_ONTO_21,
        expect={"43719a": "partial"},
        why="hand-port: #43719(a) onto 0.5.21 keeping its own set of unsettled rooms (initialised in "
        "CommonKVManager.__init__): marked on a failed KV, state or aux write and on a worker crash, never acked "
        "(drain check, registration, the quiescent-room reply), cleared on a new lifecycle; an ABORT during the "
        "state write stops the room (present on Mooncake); the port leaves NIXL's transfer worker as 0.5.21's, "
        "whose next skip of an unsettled room still acks the drain (absent on NIXL)",
    ),
)


# =============================================================================================
# Transport back ends, build values, tolerance and the failed-transfer handler (0.5.22 text)
# =============================================================================================
CLASSES.update(
    {
        "backend-revert": "a fix reverted on one transport back end only (Mooncake, NIXL or Mori)",
        "timeout-default": "the deferred-release timeout's default changed (0 s: held pages freed on the next pass)",
        "moved-helper": "a helper moved to a new module that imports release_kv_cache itself (harmless)",
        "duplicate-ack": "every drain ack sent twice; decode keeps acks in a per-rank set (harmless)",
        "handler-not-called": "the fixed failure handler no longer called by its only caller (an old copy is)",
        "fix-in-failure-caller": "the fix placed in the inflight-queue poll, before an unchanged handler",
    }
)
NIXL = "sglang/srt/disaggregation/nixl/conn.py"
MORI = "sglang/srt/disaggregation/mori/conn.py"
RECEIVER_CLASS_22 = {
    MOONCAKE: "class MooncakeKVReceiver(MooncakeFailureExceptionMixin, CommonKVReceiver):\n",
    NIXL: "class NixlKVReceiver(CommonKVReceiver):\n",
    MORI: "class MoriKVReceiver(CommonKVReceiver):\n",
}
RELEASE_REQUEST_22 = """                return
        release_kv_cache(decode_req.req, self.tree_cache, checkpoint=False)
"""
ACK_SEND_22 = """            self._send_multipart_locked(
                na.to_tcp(),
                AbortAck(room, self._prefill_unique_rank(), target.generation).to_zmq(),
                is_ipv6=na.is_ipv6,
            )
"""
INFLIGHT_FAILED_22 = """            elif poll == KVPoll.Failed:
                self.handle_inflight_transfer_failure(req)
"""
HANDLER_DEF_22 = """    def handle_inflight_transfer_failure(
        self: Scheduler, req: Req
    ) -> Optional[Exception]:
"""


def _receiver_skips_forced_notify(conn: str) -> Edit:
    """The back end's receiver ignores ``ensure_abort_notified(force_arm=True)``: #41404's call, on it alone."""
    anchor = RECEIVER_CLASS_22[conn]
    return Edit(
        conn,
        anchor,
        anchor + "    def ensure_abort_notified(self, *, force_arm: bool = False) -> None:\n"
        "        # ACME: a failure decode did not initiate is not notified on this transport\n"
        "        if force_arm:\n"
        "            return\n"
        "        super().ensure_abort_notified(force_arm=force_arm)\n\n",
    )


def _backend_revert(backend: str, conn: str) -> ForkSpec:
    return ForkSpec(
        name=f"41404-reverted-on-{backend}",
        cls="backend-revert",
        base_release="0.5.22",
        edits=(_receiver_skips_forced_notify(conn),),
        expect={"41404": "partial"},
        why=f"backend-revert: the {backend} receiver ignores #41404's ensure_abort_notified(force_arm=True), so on "
        f"{backend} alone a failure decode did not initiate (a partial publish too) is released at once with no "
        "ABORT; a client abort still notifies (its call is not forced); the other back ends keep the fix",
    )


TRANSPORT_CORPUS: tuple[ForkSpec, ...] = (
    _backend_revert("mooncake", MOONCAKE),
    _backend_revert("nixl", NIXL),
    _backend_revert("mori", MORI),
    ForkSpec(
        name="41404-release-timeout-zero",
        cls="timeout-default",
        base_release="0.5.22",
        edits=(
            Edit(
                ENVIRON,
                "    SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT = EnvFloat(30.0)\n",
                "    SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT = EnvFloat(0.0)\n",
            ),
        ),
        expect={"41404": "partial"},
        why="timeout-default: the deferred-release timeout defaults to 0 s: a failure still sends every prefill "
        "rank its ABORT and is held by pop_transferred, but the event loop's next pass frees the pages before "
        "any drain ack, as on the base; the timeout scenario's forced value is reported with this 0.0",
        forced_note={"41404": r"release timeout is 0\.0 by default in this build"},
    ),
    ForkSpec(
        name="41404-release-helper-moved",
        cls="moved-helper",
        base_release="0.5.22",
        edits=(
            new_module(
                "sglang/srt/disaggregation/decode_release.py",
                '"""ACME: how decode gives a request\'s KV back (moved out of decode.py)."""\n\n'
                "from sglang.srt.mem_cache.common import release_kv_cache\n\n\n"
                "def release_decode_kv(req, tree_cache):\n"
                "    release_kv_cache(req, tree_cache, checkpoint=False)\n",
            ),
            Edit(
                DECODE,
                "    restore_kv_cache,\n)\n",
                "    restore_kv_cache,\n)\nfrom sglang.srt.disaggregation.decode_release import release_decode_kv\n",
            ),
            Edit(
                DECODE,
                RELEASE_REQUEST_22,
                "                return\n        release_decode_kv(decode_req.req, self.tree_cache)\n",
            ),
        ),
        expect={"41404": "present", "43719a": "present"},
        why="moved-helper: DecodeTransferQueue._release_request calls a helper in a new module that imports "
        "release_kv_cache itself; the same call, so the same behaviour as 0.5.22",
    ),
    ForkSpec(
        name="43719a-duplicate-drain-ack",
        cls="duplicate-ack",
        base_release="0.5.22",
        edits=(
            Edit(
                COMMON,
                ACK_SEND_22,
                "            for _ in range(2):  # ACME: a lost ack costs a release timeout; send it twice\n"
                + "".join("    " + line + "\n" for line in ACK_SEND_22.splitlines()),
            ),
        ),
        expect={"43719a": "present", "41404": "present"},
        why="duplicate-ack: every drain ack goes out twice; decode keeps acks in a per-rank set, so a repeat "
        "changes nothing and 0.5.22's behaviour stands",
    ),
    ForkSpec(
        name="43719b-fixed-handler-not-called",
        cls="handler-not-called",
        base_release="0.5.22",
        edits=(
            Edit(
                PREFILL,
                HANDLER_DEF_22,
                "    def _conclude_failed_transfer(self: Scheduler, req: Req) -> None:\n"
                "        # ACME: the old conclusion, kept for the inflight queue\n"
                "        if req.finished_reason is None:\n"
                "            req.finished_reason = FINISH_LENGTH(length=0)\n"
                "        release_kv_cache(req, self.tree_cache, checkpoint=True)\n"
                "        self._release_aborted_request(req)\n"
                "        if not isinstance(req.finished_reason, FINISH_ABORT):\n"
                "            prepare_abort(\n"
                '                req, "Prefill transfer failed", status_code=HTTPStatus.INTERNAL_SERVER_ERROR\n'
                "            )\n\n" + HANDLER_DEF_22,
            ),
            _quarantine_release("False"),
            Edit(
                PREFILL,
                INFLIGHT_FAILED_22,
                "            elif poll == KVPoll.Failed:\n                self._conclude_failed_transfer(req)\n",
            ),
        ),
        expect={"43719b": "absent"},
        why="handler-not-called: handle_inflight_transfer_failure carries the quarantine, but its only caller, "
        "the inflight-queue poll, now calls a copy of the old conclusion (radix insert on): the server inserts",
    ),
    ForkSpec(
        name="43719b-fix-in-inflight-poll",
        cls="fix-in-failure-caller",
        base_release="0.5.22",
        edits=(
            Edit(
                PREFILL,
                INFLIGHT_FAILED_22,
                "            elif poll == KVPoll.Failed:\n"
                "                # ACME (#43719(b)): a failed room's KV may still be read; never reuse it\n"
                "                req.skip_radix_cache_insert = True\n"
                "                self.handle_inflight_transfer_failure(req)\n",
            ),
        ),
        expect={"43719b": "present"},
        why="fix-in-failure-caller: the inflight-queue poll sets skip_radix_cache_insert before the unchanged "
        "handle_inflight_transfer_failure, and release_kv_cache honours it: the failed room is not inserted",
    ),
)
CORPUS = (*CORPUS, *TRANSPORT_CORPUS)

# ---------------------------------------------------------------------------------------------
# The wired server: where the build's start-up and dispatch put the live path (classes below).
# ---------------------------------------------------------------------------------------------
PLUGINS = "sglang/srt/plugins/__init__.py"

CLASSES.update(
    {
        "queue-subclass": "the scheduler's set-up builds its own subclass of a door's queue; its add() lacks the check",
        "startup-revert": "run_scheduler_process, next to load_plugins(), rebinds what the fix's doors call",
        "plugin-patch": "a hook installed while the build loads its plugins reverts one door",
        "harmless-metrics": "a counter gated the way SGLang gates its own (metrics_reporter.enable_metrics)",
        "class-order-override": "a mixin earlier in Scheduler's bases overrides a fixed method with the old behaviour",
    }
)

_ACME_QUEUE = '''class AcmePrefillBootstrapQueue(PrefillBootstrapQueue):
    """ACME: the bootstrap queue our prefill nodes run, with admission accounting of our own."""

    def add(self, req: Req, num_kv_heads: int) -> None:
        self.acme_admitted = getattr(self, "acme_admitted", 0) + 1
        if not self.create_sender(req, num_kv_heads):
            return
        self.queue.append(req)


class SchedulerDisaggregationPrefillMixin'''

_ACME_RESULT_MIXIN = '''class AcmePrefillResultMixin:
    """ACME: an aborted request's final prefill result is handed to decode like any other; decode reports it."""

    def process_batch_result_disagg_prefill(self, batch, result):
        final = [req for req in batch.reqs if req.inflight_middle_chunks <= 0]
        hidden = [(req, req.to_finish) for req in final if req.to_finish is not None]
        for req, _ in hidden:
            req.to_finish = None
        try:
            return super().process_batch_result_disagg_prefill(batch, result)
        finally:
            for req, verdict in hidden:
                if req.to_finish is None and not req.finished():
                    req.to_finish = verdict


class Scheduler(
    AcmePrefillResultMixin,
    SchedulerDisaggregationDecodeMixin,
'''

WIRED_CORPUS: tuple[ForkSpec, ...] = (
    ForkSpec(
        name="36988-mixin-hides-aborts",
        cls="class-order-override",
        base_release="0.5.20",
        edits=(Edit(SCHEDULER, "class Scheduler(\n    SchedulerDisaggregationDecodeMixin,\n", _ACME_RESULT_MIXIN),),
        expect={"36988": "partial"},
        why="class-order-override: a mixin first in Scheduler's bases wraps the result step and hides a running "
        "request's abort from it on a final result, so an aborted final result is cached, queued and sent as on "
        "0.5.19; middle chunks and an abort the step itself finds (the grammar rejecting the sampled token) are "
        "retired as on 0.5.20",
    ),
    ForkSpec(
        name="38935-prefill-queue-subclass",
        cls="queue-subclass",
        base_release="0.5.21",
        edits=(
            Edit(PREFILL, "class SchedulerDisaggregationPrefillMixin", _ACME_QUEUE),
            Edit(
                SCHEDULER,
                "    PrefillBootstrapQueue,\n",
                "    AcmePrefillBootstrapQueue,\n    PrefillBootstrapQueue,\n",
            ),
            Edit(
                SCHEDULER,
                "self.disagg_prefill_bootstrap_queue = PrefillBootstrapQueue(",
                "self.disagg_prefill_bootstrap_queue = AcmePrefillBootstrapQueue(",
            ),
        ),
        expect={"38935": "partial"},
        why="queue-subclass: init_disaggregation builds AcmePrefillBootstrapQueue, whose add() creates a sender "
        "and enqueues without the check (the prefill door is 0.5.20's); the decode door is 0.5.21's",
    ),
    ForkSpec(
        name="38935-startup-revert",
        cls="startup-revert",
        base_release="0.5.21",
        edits=(
            Edit(
                SCHEDULER,
                "    load_plugins()\n",
                "    load_plugins()\n"
                "    # ACME: admission is decided by our router; the PD queues admit whatever reaches them.\n"
                "    from sglang.srt.disaggregation import decode as _acme_decode\n"
                "    from sglang.srt.disaggregation import prefill as _acme_prefill\n\n"
                "    _acme_decode.is_unadmitted_reject = _acme_prefill.is_unadmitted_reject = lambda req: False\n",
            ),
        ),
        expect={"38935": "absent"},
        why="startup-revert: run_scheduler_process rebinds is_unadmitted_reject in both door modules to a "
        "predicate that never fires: both doors admit the rejected stub as on 0.5.20",
    ),
    ForkSpec(
        name="38935-plugin-reverts-decode-door",
        cls="plugin-patch",
        base_release="0.5.21",
        edits=(
            Edit(
                PLUGINS,
                "    _plugins_loaded = True\n",
                "    _plugins_loaded = True\n"
                "    # ACME: vendor hook loaded with the plugins; decode waits for prefill's verdict.\n"
                "    from sglang.srt.disaggregation import decode as _acme_decode\n\n"
                "    _acme_decode.is_unadmitted_reject = lambda req: False\n",
            ),
        ),
        expect={"38935": "partial"},
        why="plugin-patch: load_plugins() rebinds the decode module's is_unadmitted_reject to never fire: the "
        "decode door is 0.5.20's, the prefill door 0.5.21's",
    ),
    ForkSpec(
        name="38935-metrics-counter",
        cls="harmless-metrics",
        base_release="0.5.21",
        edits=(
            Edit(
                SCHEDULER,
                '        """Finish a request the disaggregation queues rejected at their door."""\n',
                '        """Finish a request the disaggregation queues rejected at their door."""\n'
                "        if self.metrics_reporter.enable_metrics:\n"
                "            reporter = self.metrics_reporter\n"
                '            reporter.acme_unadmitted_total = getattr(reporter, "acme_unadmitted_total", 0) + 1\n',
            ),
        ),
        expect={"38935": "present"},
        why="harmless-metrics: a counter in retire_unadmitted_request gated on the reporter's enable_metrics "
        "(off by default): the fix's behaviour is 0.5.21's",
    ),
)
CORPUS = CORPUS + WIRED_CORPUS


# =============================================================================================
# The decode side as the server wires it: a receiver class the build resolves, the decode loop
# =============================================================================================
CLASSES.update(
    {
        "receiver-subclass": "get_kv_class hands one back end's prealloc queue a receiver subclass that reverts a fix",
        "decode-loop-override": "a mixin first in Scheduler's bases overrides the decode loop's queue step",
    }
)

_MOONCAKE_LAST_CLASS = "class MooncakeKVBootstrapServer(CommonKVBootstrapServer):\n    pass\n"
_SCHEDULER_BASES = "class Scheduler(\n    SchedulerDisaggregationDecodeMixin,\n"
_ACME_MOONCAKE_RECEIVER = '''class MooncakeKVBootstrapServer(CommonKVBootstrapServer):
    pass


class AcmeMooncakeKVReceiver(MooncakeKVReceiver):
    """ACME: our Mooncake receiver; a failure prefill reported is final there, so nobody is told."""

    def ensure_abort_notified(self, *, force_arm: bool = False) -> None:
        if force_arm:
            return
        super().ensure_abort_notified(force_arm=force_arm)
'''

_ACME_DECODE_LOOP_MIXIN = '''class AcmeDecodeLoopMixin:
    """ACME: held decode pages go back on the loop's next pass (our prefill stops writing when it fails)."""

    def process_decode_queue(self):
        self.disagg_decode_transfer_queue.deferred_kv_release_timeout = 0.0
        return super().process_decode_queue()


class Scheduler(
    AcmeDecodeLoopMixin,
    SchedulerDisaggregationDecodeMixin,
'''

DECODE_WIRED_CORPUS: tuple[ForkSpec, ...] = (
    ForkSpec(
        name="41404-mooncake-receiver-subclass",
        cls="receiver-subclass",
        base_release="0.5.22",
        edits=(
            Edit(MOONCAKE, _MOONCAKE_LAST_CLASS, _ACME_MOONCAKE_RECEIVER),
            Edit(
                UTILS,
                "            MooncakeKVReceiver,\n            MooncakeKVSender,\n        )\n",
                "            MooncakeKVReceiver,\n            MooncakeKVSender,\n        )\n"
                "        from sglang.srt.disaggregation.mooncake.conn import AcmeMooncakeKVReceiver\n",
            ),
            Edit(
                UTILS,
                "            KVClassType.RECEIVER: MooncakeKVReceiver,\n",
                "            KVClassType.RECEIVER: AcmeMooncakeKVReceiver,\n",
            ),
        ),
        expect={"41404": "partial"},
        why="receiver-subclass: get_kv_class gives the Mooncake prealloc queue AcmeMooncakeKVReceiver, which "
        "ignores #41404's ensure_abort_notified(force_arm=True): on Mooncake (the default) a failure decode did "
        "not initiate, a partial publish too, is released at once with no ABORT; a client abort still notifies; "
        "NIXL and Mori keep 0.5.22's receivers",
    ),
    ForkSpec(
        name="41404-decode-loop-frees-held-pages",
        cls="decode-loop-override",
        base_release="0.5.22",
        edits=(Edit(SCHEDULER, _SCHEDULER_BASES, _ACME_DECODE_LOOP_MIXIN),),
        expect={"41404": "partial", "43719a": "partial"},
        why="decode-loop-override: a mixin first in Scheduler's bases sets the transfer queue's release timeout "
        "to 0 s before every pass of process_decode_queue: pop_transferred still notifies every prefill rank and "
        "holds a failed request (the notify path is 0.5.22's), but the next pass frees its pages before any "
        "drain ack, as on 0.5.20 (the hold path is the base's), on every back end. #43719(a): prefill's "
        "transfer worker is 0.5.22's (no ack after a failed send), but on the CPU pair decode no longer waits "
        "for that ack, so the failed send's late write lands in reused pages as on 0.5.21 (the in-flight fields "
        "of kv-send-poison read like the base)",
    ),
)
CORPUS = CORPUS + DECODE_WIRED_CORPUS

# ---------------------------------------------------------------------------------------------
# The doors and the prefill result step as the server reaches them: intake, dispatch, start-up
# ---------------------------------------------------------------------------------------------
CLASSES.update(
    {
        "startup-apply": "run_scheduler_process, next to load_plugins(), installs a fix the release lacks",
        "fix-in-door-caller": "the fix placed in the scheduler's dispatch, before an unchanged door",
    }
)

_ACME_DECODE_QUEUE = '''class AcmeDecodePreallocQueue(DecodePreallocQueue):
    """ACME: the prealloc queue our decode nodes run, with admission accounting of our own."""

    def add(
        self, req: Req, is_retracted: bool = False, is_rebootstrap: bool = False
    ) -> None:
        self.acme_admitted = getattr(self, "acme_admitted", 0) + 1
        if self._check_if_req_exceed_kv_capacity(req):
            return
        if is_retracted:
            req.retraction_mb_id = None
            self.retracted_queue.append(req)
            return
        decode_req = self._create_receiver_and_enqueue(
            req, is_rebootstrap=is_rebootstrap
        )
        if _is_fake_transfer(req):
            decode_req.kv_receiver.init(0)
            return
        prefill_dp_rank = self._resolve_prefill_dp_rank(req)
        if prefill_dp_rank is not None:
            decode_req.kv_receiver.init(prefill_dp_rank)
            return
        self.pending_reqs.append(decode_req)


class DecodeTransferQueue('''

_ACME_ADMISSION_MODULE = '''"""ACME: #38935's admission check for our 0.5.20 fleet, installed as a scheduler starts."""

from sglang.srt.disaggregation.utils import is_aborted

_installed = False


def acme_rejected_at_intake(req) -> bool:
    """Rejected at intake and holding nothing a queue must release (a re-entering request may hold a pending abort)."""
    if not is_aborted(req):
        return False
    kv = req.kv
    still_owns = kv.holds_kv or kv.holds_mamba or kv.retraction_backup is not None
    return not (req.is_retracted or still_owns or req.metadata_buffer_index >= 0)


def acme_retire_at_door(scheduler, req) -> None:
    """End a request a PD door refused, before it acquired anything."""
    session = req.session
    if session is not None and session.streaming:
        session.abort_req()
        req.session = None
    scheduler.beam_coordinator.retire_group(req)
    scheduler._release_aborted_request(req)
    verdict = req.finished_reason or req.to_finish
    req.time_stats.trace_ctx.abort(abort_info={"reason": verdict.message})
    req.update_finish_state()
    scheduler.output_streamer.stream_output([req], req.return_logprob)


def install_admission_check() -> None:
    global _installed
    if _installed:
        return
    _installed = True
    from sglang.srt.disaggregation.decode import DecodePreallocQueue
    from sglang.srt.disaggregation.prefill import PrefillBootstrapQueue

    prefill_add = PrefillBootstrapQueue.add
    decode_add = DecodePreallocQueue.add

    def checked_prefill_add(self, req, num_kv_heads):
        if acme_rejected_at_intake(req):
            acme_retire_at_door(self.scheduler, req)
            return
        prefill_add(self, req, num_kv_heads)

    def checked_decode_add(self, req, is_retracted=False, is_rebootstrap=False):
        if not (is_retracted or is_rebootstrap) and acme_rejected_at_intake(req):
            acme_retire_at_door(self.scheduler, req)
            return
        decode_add(self, req, is_retracted=is_retracted, is_rebootstrap=is_rebootstrap)

    PrefillBootstrapQueue.add = checked_prefill_add
    DecodePreallocQueue.add = checked_decode_add
'''

_OLD_PREFILL_ADD_21 = '''    def acme_add(self, req: Req, num_kv_heads: int) -> None:
        """ACME: admission as our router expects it (kept from 0.5.20)."""
        if not self.create_sender(req, num_kv_heads):
            return
        self.queue.append(req)

    def add(self, req: Req, num_kv_heads: int) -> None:
'''

DOOR_CORPUS: tuple[ForkSpec, ...] = (
    ForkSpec(
        name="38935-decode-queue-subclass",
        cls="queue-subclass",
        base_release="0.5.21",
        edits=(
            Edit(DECODE, "class DecodeTransferQueue(", _ACME_DECODE_QUEUE),
            Edit(SCHEDULER, "    DecodePreallocQueue,\n", "    AcmeDecodePreallocQueue,\n    DecodePreallocQueue,\n"),
            Edit(
                SCHEDULER,
                "self.disagg_decode_prealloc_queue = DecodePreallocQueue(",
                "self.disagg_decode_prealloc_queue = AcmeDecodePreallocQueue(",
            ),
        ),
        expect={"38935": "partial"},
        why="queue-subclass: init_disaggregation builds AcmeDecodePreallocQueue, whose add() hands every fresh "
        "request a receiver without the check (the decode door is 0.5.20's); the prefill door is 0.5.21's",
    ),
    ForkSpec(
        name="38935-prefill-door-skipped-on-nixl",
        cls="backend-revert",
        base_release="0.5.21",
        edits=(
            Edit(
                PREFILL,
                "        if is_unadmitted_reject(req):\n",
                "        # ACME: NIXL prefill nodes leave admission to their own router\n"
                "        if is_unadmitted_reject(req) and self.transfer_backend != TransferBackend.NIXL:\n",
            ),
        ),
        expect={"38935": "partial"},
        why="backend-revert: the prefill door skips #38935's check when the back end is NIXL: on NIXL a rejected "
        "stub gets a sender and a place in the bootstrap queue as on 0.5.20; Mooncake, Mori and the decode door "
        "keep 0.5.21's behaviour",
    ),
    ForkSpec(
        name="38935-old-prefill-add-called",
        cls="handler-not-called",
        base_release="0.5.21",
        edits=(
            Edit(PREFILL, "    def add(self, req: Req, num_kv_heads: int) -> None:\n", _OLD_PREFILL_ADD_21),
            Edit(
                SCHEDULER,
                "            self.disagg_prefill_bootstrap_queue.add(\n"
                "                req, self.model_config.num_key_value_heads\n",
                "            self.disagg_prefill_bootstrap_queue.acme_add(\n"
                "                req, self.model_config.num_key_value_heads\n",
            ),
        ),
        expect={"38935": "partial"},
        why="handler-not-called: PrefillBootstrapQueue.add keeps the check, but the scheduler's dispatch now calls "
        "acme_add, 0.5.20's admission: the prefill door admits the rejected stub; the decode door is 0.5.21's",
    ),
    ForkSpec(
        name="38935-startup-applies",
        cls="startup-apply",
        base_release="0.5.20",
        edits=(
            new_module("sglang/srt/acme_admission.py", _ACME_ADMISSION_MODULE),
            Edit(
                SCHEDULER,
                "    load_plugins()\n",
                "    load_plugins()\n"
                "    # ACME: the PD doors refuse what intake rejected (#38935, not in our release).\n"
                "    from sglang.srt.acme_admission import install_admission_check\n\n"
                "    install_admission_check()\n",
            ),
        ),
        expect={"38935": "present"},
        why="startup-apply: run_scheduler_process wraps both doors' add() with #38935's check (same five clauses) "
        "and retirement (session, beam group, cache, finish state, 400 streamed) before any sender or receiver",
    ),
    ForkSpec(
        name="38935-fix-in-dispatch",
        cls="fix-in-door-caller",
        base_release="0.5.20",
        edits=(
            new_module("sglang/srt/acme_admission.py", _ACME_ADMISSION_MODULE),
            Edit(
                SCHEDULER,
                "        elif self.disaggregation_mode == DisaggregationMode.PREFILL:\n"
                "            self._prefetch_kvcache(req)\n",
                "        elif not is_retracted and acme_rejected_at_intake(req):\n"
                "            # ACME (#38935): a PD door never sees what intake rejected.\n"
                "            acme_retire_at_door(self, req)\n"
                "        elif self.disaggregation_mode == DisaggregationMode.PREFILL:\n"
                "            self._prefetch_kvcache(req)\n",
            ),
            Edit(
                SCHEDULER,
                "from sglang.srt.disaggregation.utils import (\n",
                "from sglang.srt.acme_admission import acme_rejected_at_intake, acme_retire_at_door\n"
                "from sglang.srt.disaggregation.utils import (\n",
            ),
        ),
        expect={"38935": "present"},
        why="fix-in-door-caller: _add_request_to_queue retires a rejected stub of a PD side before either "
        "unchanged door (a retracted hand-over and the decode queue's own re-bootstrap bypass it, as the head's "
        "door exempts them): both doors behave like 0.5.21's",
    ),
    ForkSpec(
        name="36988-release-helper-moved",
        cls="moved-helper",
        base_release="0.5.20",
        edits=(
            new_module(
                "sglang/srt/disaggregation/prefill_release.py",
                '"""ACME: how prefill gives an aborted request\'s KV back (moved out of prefill.py)."""\n\n'
                "from sglang.srt.mem_cache.common import release_kv_cache\n\n\n"
                "def release_aborted_kv(req, tree_cache):\n"
                "    release_kv_cache(req, tree_cache, is_insert=False)\n",
            ),
            Edit(
                PREFILL,
                "from sglang.srt.mem_cache.deepseek_v4_memory_pool import DeepSeekV4TokenToKVPool\n",
                "from sglang.srt.disaggregation.prefill_release import release_aborted_kv\n"
                "from sglang.srt.mem_cache.deepseek_v4_memory_pool import DeepSeekV4TokenToKVPool\n",
            ),
            Edit(
                PREFILL,
                "        if req.kv.holds_kv or req.kv.holds_mamba:\n"
                "            release_kv_cache(req, self.tree_cache, is_insert=False)\n"
                "        return True\n",
                "        if req.kv.holds_kv or req.kv.holds_mamba:\n"
                "            release_aborted_kv(req, self.tree_cache)\n"
                "        return True\n",
            ),
        ),
        expect={"36988": "present"},
        why="moved-helper: _retire_aborted_prefill_result releases through a helper in a new module that imports "
        "release_kv_cache itself; the same call, so 0.5.20's behaviour",
    ),
    ForkSpec(
        name="36988-metrics-counter",
        cls="harmless-metrics",
        base_release="0.5.20",
        edits=(
            Edit(
                PREFILL,
                '        """Release an aborted request when its last prefill result is safe."""\n',
                '        """Release an aborted request when its last prefill result is safe."""\n'
                "        if self.metrics_reporter.enable_metrics:\n"
                "            reporter = self.metrics_reporter\n"
                '            reporter.acme_retired_total = getattr(reporter, "acme_retired_total", 0) + 1\n',
            ),
        ),
        expect={"36988": "present"},
        why="harmless-metrics: a counter in _retire_aborted_prefill_result gated on the reporter's enable_metrics "
        "(off by default): the fix's behaviour is 0.5.20's",
    ),
)
CORPUS = CORPUS + DOOR_CORPUS
