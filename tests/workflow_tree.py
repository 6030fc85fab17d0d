"""A two-commit SGLang-shaped git repository and probes that read it, for driving whole workflows in a second.

Holds no tests. The real probes import SGLang (5-10 s each); the workflows' own decisions (exit codes,
``passed`` flags, which rows a self-check writes) do not depend on what is probed, only on the
observations' shapes. So the repository here is a ``python/sglang/`` package of three files, built
with ``git`` the way :mod:`difflab.source.git` reads any commit, and the probes call its one function
through the lab's real runner (``--backend subprocess``: a supervised process per probe, ~0.2 s).

- ``base``: ``admit`` admits every request (the bug);
- ``head``: an intake-rejected request is refused (the fix), valid ones still admitted;
- ``fork``: a branch off ``base`` whose ``admit`` refuses a rejected request in its own words.

Built once per content key under ``$DIFFLAB_CACHE/test-repos/`` (fixed dates and identities, so the
SHAs never move), like :mod:`fork_corpus`.
"""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import subprocess
import zipfile
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock

from difflab.paths import cache_root
from matrix_samples import RELEASES

BASE_DOOR = '''def admit(req):
    """Whether a request joins the handoff queue."""
    return True
'''
HEAD_DOOR = '''def admit(req):
    """Whether a request joins the handoff queue; an intake-rejected one is retired instead."""
    if req.rejected:
        return False
    return True
'''
FORK_DOOR = '''def admit(req):
    """Whether a request joins the handoff queue (the fork's own port of the fix)."""
    return not req.rejected
'''

DOOR_PROBE = '''"""The tiny tree's door: is an intake-rejected request admitted, and a valid one?"""

from types import SimpleNamespace


def observe(kit) -> dict:
    from sglang.door import admit

    return {
        "rejected.admitted": admit(SimpleNamespace(rejected=True)),
        "valid.admitted": admit(SimpleNamespace(rejected=False)),
        "door.note": "read from sglang/door.py",
    }
'''
BROKEN_PROBE = '''"""A probe of a module the tiny tree lacks: it must end as an error."""


def observe(kit) -> dict:
    import sglang.no_such_module  # noqa: F401

    return {"rejected.admitted": False}
'''
HANG_PROBE = '''"""A probe that outlives any short ``--timeout``: a run must end it there, never wait it out."""

import time


def observe(kit) -> dict:
    time.sleep(20)
    return {"rejected.admitted": False, "valid.admitted": True}
'''
PROBES = {"tiny_door": DOOR_PROBE, "tiny_broken": BROKEN_PROBE, "tiny_hang": HANG_PROBE}

DOOR_BENCH = '''"""The tiny tree's door under load: a batch of requests (every fourth rejected) through ``admit``."""

from types import SimpleNamespace

from difflab.probe.bench import Workload


class DoorLoad:
    def __init__(self, n):
        from sglang.door import admit

        self.admit = admit
        self.batch = [SimpleNamespace(rejected=i % 4 == 0) for i in range(max(1, n // 10))]

    def setup(self):
        pass

    def run(self):
        for req in self.batch:
            self.admit(req)
        return len(self.batch)

    def teardown(self):
        pass


def workloads(kit):
    return [Workload("door.admit", "requests", DoorLoad, "requests through the door")]
'''
BROKEN_BENCH = '''"""A throughput probe whose every run fails: an error, never a number."""

from difflab.probe.bench import Workload


class Fails:
    def __init__(self, n):
        pass

    def setup(self):
        pass

    def run(self):
        raise RuntimeError("the door is gone")

    def teardown(self):
        pass


def workloads(kit):
    return [Workload("door.gone", "requests", Fails)]
'''
THROUGHPUT_PROBES = {"tiny_door_bench": DOOR_BENCH, "tiny_broken_bench": BROKEN_BENCH}

BUILDER_VERSION = "1"
SIDES = {"base": BASE_DOOR, "head": HEAD_DOOR, "fork": FORK_DOOR}


@dataclass(frozen=True)
class TinyRepo:
    path: Path
    commits: dict[str, str]
    """base, head, fork -> full SHA."""


def _git(cwd: Path, *args: str, date: str = "2026-01-01") -> str:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "difflab tests",
        "GIT_AUTHOR_EMAIL": "tests@example.invalid",
        "GIT_COMMITTER_NAME": "difflab tests",
        "GIT_COMMITTER_EMAIL": "tests@example.invalid",
        "GIT_AUTHOR_DATE": f"{date}T12:00:00Z",
        "GIT_COMMITTER_DATE": f"{date}T12:00:00Z",
    }
    done = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True, check=True)
    return done.stdout.strip()


def _commit(repo: Path, door: str, subject: str, date: str) -> str:
    package = repo / "python" / "sglang"
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text('"""A lab fixture shaped like SGLang\'s package, not SGLang\'s code."""\n')
    (package / "version.py").write_text('__version__ = "0.0.0"\n')
    (package / "door.py").write_text(door)
    _git(repo, "add", "-A")
    _git(repo, "commit", "--quiet", "-m", subject, date=date)
    return _git(repo, "rev-parse", "HEAD")


def _build(dest: Path) -> None:
    dest.mkdir(parents=True)
    _git(dest, "init", "--quiet", "--initial-branch=main")
    _commit(dest, BASE_DOOR, "door: admit every request", "2026-01-01")
    _commit(dest, HEAD_DOOR, "door: retire an intake-rejected request (#1)", "2026-01-02")
    _git(dest, "checkout", "--quiet", "-b", "fork", "main~1")
    _commit(dest, FORK_DOOR, "door: refuse rejected requests", "2026-01-03")
    _git(dest, "checkout", "--quiet", "main")


def tiny_repo() -> TinyRepo:
    key = hashlib.sha256((BUILDER_VERSION + "".join(SIDES.values())).encode()).hexdigest()[:16]
    path = cache_root() / "test-repos" / f"tiny-door-{key}"
    with FileLock(str(path) + ".lock"):
        if not (path / ".git").is_dir():
            shutil.rmtree(path, ignore_errors=True)
            _build(path)
    commits = {
        "base": _git(path, "rev-parse", "main~1"),
        "head": _git(path, "rev-parse", "main"),
        "fork": _git(path, "rev-parse", "fork"),
    }
    return TinyRepo(path, commits)


def write_probes(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in PROBES.items():
        (folder / f"{name}.py").write_text(text)
    (folder / "throughput").mkdir(exist_ok=True)
    for name, text in THROUGHPUT_PROBES.items():
        (folder / "throughput" / f"{name}.py").write_text(text)
    return folder


def with_throughput(entry: str, probe: str = "tiny_door_bench") -> str:
    """``entry`` timing its hot path with the throughput probe ``probe`` (``run --throughput``)."""
    return entry + f'[fixes.throughput]\nprobe = "{probe}"\n'


def fix_entry(
    fix_id: str, base: str, head: str, *, probe: str = "tiny_door", mutations: str = "", pinned: bool = True
) -> str:
    """One ``[[fixes]]`` entry on two commits of the tiny repository; with ``mutations``, its door hunk too.

    ``pinned=False`` leaves the commits out of the matrix: only the lock beside it (``difflab lock``) knows them.
    """
    pins = f'base = {{ sha = "{base}", confirmed = true }}, head = {{ sha = "{head}", confirmed = true }}'
    commits = f"commits = {{ {pins} }}\n"
    hunk = f"""[[fixes.hunks]]
id = "door-guard"
file = "sglang/door.py"
function = "admit"
change = "an intake-rejected request is refused at the door"
fields = {{ {probe} = ["rejected.admitted"] }}
"""
    return f"""
[[fixes]]
id = "{fix_id}"
pr = {fix_id}
title = "door {fix_id}"
base = {{ release = "0.5.20" }}
head = {{ release = "0.5.21" }}
{commits if pinned else ""}[[fixes.probes]]
name = "{probe}"
[fixes.probes.expect]
"rejected.admitted" = [true, false]
[fixes.probes.controls]
"valid.admitted" = true
{hunk if mutations else ""}{mutations}"""


DROP_GUARD = '''
[[fixes.mutations]]
name = "drop-guard"
file = "sglang/door.py"
find = """    if req.rejected:
        return False
"""
replace = ""
hunks = ["door-guard"]
'''
STALE = """
[[fixes.mutations]]
name = "unguard-stale"
file = "sglang/door.py"
find = "if req.rejected and req.stale:"
replace = "if False:"
hunks = ["door-guard"]
"""
MOVES_CONTROL = '''
[[fixes.mutations]]
name = "refuse-everyone"
file = "sglang/door.py"
find = """        return False
    return True
"""
replace = """        return False
    return False
"""
hunks = ["door-guard"]
'''

REWORDS_BASE = """
[[fixes.mutations]]
name = "reword-docstring"
file = "sglang/door.py"
find = "Whether a request joins the handoff queue."
replace = "Whether a request is queued for its handoff."
hunks = ["door-guard"]
"""
HANGS = '''
[[fixes.mutations]]
name = "hang-at-door"
file = "sglang/door.py"
find = """    if req.rejected:
        return False
"""
replace = """    import time

    time.sleep(3600)
"""
hunks = ["door-guard"]
'''


def matrix_text(*entries: str) -> str:
    return RELEASES + "".join(entries)


DOOR_TESTS = '''"""The tiny tree's door as its own tests see it (laid out like SGLang's test/ tree)."""

from types import SimpleNamespace

from sglang.door import admit


def test_a_rejected_request_is_refused():
    assert admit(SimpleNamespace(rejected=True)) is False


def test_a_valid_request_is_admitted():
    assert admit(SimpleNamespace(rejected=False)) is True
'''
DOOR_TESTS_FILE = "test/registered/unit/test_door.py"


def write_door_tests(folder: Path) -> Path:
    """A folder laid out like SGLang's repository holding the door's test file (``--upstream-tests``)."""
    path = folder / DOOR_TESTS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(DOOR_TESTS)
    return folder


def with_upstream_tests(entry: str, own: str) -> str:
    """``entry`` declaring the door's test file, with ``own`` as the fix's own test."""
    declared = f'upstream_tests = [{{ file = "{DOOR_TESTS_FILE}", own = ["{own}"] }}]\n'
    return entry.replace("[[fixes.probes]]", declared + "[[fixes.probes]]", 1)


# -- release wheels of the tiny tree (``difflab contains``) ------------------------------------------------
WHEEL_DATE = (2026, 1, 1, 12, 0, 0)


def _wheel_members(version: str, door: str) -> dict[str, bytes]:
    return {
        "sglang/__init__.py": b'"""A lab fixture shaped like SGLang\'s package, not SGLang\'s code."""\n',
        "sglang/version.py": f'__version__ = "{version}"\n'.encode(),
        "sglang/door.py": door.encode(),
    }


def door_wheel(version: str, door: str) -> tuple[str, str]:
    """A wheel of the tiny tree's package as release ``version``, in the lab's wheel cache: (file, sha256).

    The file name carries a content key, so it never meets a real SGLang wheel of that version in the
    cache; the release back end finds it there, checks its sha256 and RECORD, and downloads nothing.
    """
    members = _wheel_members(version, door)
    key = hashlib.sha256((BUILDER_VERSION + version + door).encode()).hexdigest()[:12]
    name = f"sglang-{version}-py3-none-tinydoor{key}.whl"
    rows = [
        f"{n},sha256={base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b'=').decode()},{len(d)}"
        for n, d in members.items()
    ]
    info = f"sglang-{version}.dist-info"
    members[f"{info}/METADATA"] = f"Metadata-Version: 2.1\nName: sglang\nVersion: {version}\n".encode()
    members[f"{info}/RECORD"] = ("\n".join([*rows, f"{info}/RECORD,,"]) + "\n").encode()
    wheels = cache_root() / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    path = wheels / name
    with FileLock(str(path) + ".lock"):
        if not path.exists():
            tmp = path.with_name(f".{name}.tmp")
            with zipfile.ZipFile(tmp, "w") as zf:
                for member, data in members.items():
                    zf.writestr(zipfile.ZipInfo(member, WHEEL_DATE), data)
            os.replace(tmp, path)
    return name, hashlib.sha256(path.read_bytes()).hexdigest()


def release_table(doors: dict[str, str]) -> str:
    """A matrix's ``[releases]`` pinning one tiny door wheel per version (``{version: door}``)."""
    text = "\nschema = 1\n"
    for version, door in doors.items():
        file, sha = door_wheel(version, door)
        text += f'[releases."{version}"]\nfile = "{file}"\nsha256 = "{sha}"\n'
    return text


# -- a longer history of the door (``difflab bisect``) ---------------------------------------------------------
@dataclass(frozen=True)
class DoorHistory:
    path: Path
    commits: dict[str, str]
    """name -> full SHA: ``base``, ``notes-1``, ``notes-2``, ``fix``, ``notes-3``, ``notes-4`` on ``main``;
    ``lost`` (the fix reverted after ``notes-3``) on ``lost``; ``unpackaged`` (no ``sglang/__init__.py``)
    then ``repackaged`` (the package back, with the fix) on ``moved``, both off ``base``."""


def _history_commit(repo: Path, subject: str, date: str, *, door: str | None = None, package: bool = True) -> str:
    sglang = repo / "python" / "sglang"
    sglang.mkdir(parents=True, exist_ok=True)
    init = sglang / "__init__.py"
    if package:
        init.write_text('"""A lab fixture shaped like SGLang\'s package, not SGLang\'s code."""\n')
    else:
        init.unlink(missing_ok=True)
    (sglang / "version.py").write_text('__version__ = "0.0.0"\n')
    if door is not None:
        (sglang / "door.py").write_text(door)
    notes = repo / "NOTES.md"
    notes.write_text((notes.read_text() if notes.exists() else "") + f"- {subject}\n")
    _git(repo, "add", "-A")
    _git(repo, "commit", "--quiet", "-m", subject, date=date)
    return _git(repo, "rev-parse", "HEAD")


def _build_history(dest: Path) -> None:
    dest.mkdir(parents=True)
    _git(dest, "init", "--quiet", "--initial-branch=main")
    _history_commit(dest, "door: admit every request", "2026-02-01", door=BASE_DOOR)
    _history_commit(dest, "notes: the handoff queue", "2026-02-02")
    _history_commit(dest, "notes: intake", "2026-02-03")
    _history_commit(dest, "door: retire an intake-rejected request (#1)", "2026-02-04", door=HEAD_DOOR)
    _history_commit(dest, "notes: the retired requests", "2026-02-05")
    _git(dest, "checkout", "--quiet", "-b", "lost")
    _history_commit(dest, "door: admit every request again", "2026-02-06", door=BASE_DOOR)
    _git(dest, "checkout", "--quiet", "main")
    _history_commit(dest, "notes: done", "2026-02-07")
    _git(dest, "checkout", "--quiet", "-b", "moved", "main~5")
    _history_commit(dest, "package: move sglang out", "2026-02-08", package=False)
    _history_commit(dest, "package: back, with the door fixed", "2026-02-09", door=HEAD_DOOR)
    _git(dest, "checkout", "--quiet", "main")


def door_history() -> DoorHistory:
    key = hashlib.sha256((BUILDER_VERSION + "history-1" + BASE_DOOR + HEAD_DOOR).encode()).hexdigest()[:16]
    path = cache_root() / "test-repos" / f"door-history-{key}"
    with FileLock(str(path) + ".lock"):
        if not (path / ".git").is_dir():
            shutil.rmtree(path, ignore_errors=True)
            _build_history(path)
    names = {"base": "main~5", "notes-1": "main~4", "notes-2": "main~3", "fix": "main~2", "notes-3": "main~1"}
    names |= {"notes-4": "main", "lost": "lost", "unpackaged": "moved~1", "repackaged": "moved"}
    return DoorHistory(path, {name: _git(path, "rev-parse", rev) for name, rev in names.items()})
