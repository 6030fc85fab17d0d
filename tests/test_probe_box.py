"""A build's code runs in the probe processes: it reaches no secret, leaves nothing for a later run, and starts
after the lab's code.

Hostile toy probes and toy sources, with this interpreter standing in for the shared environment (as in
test_warm_runner), so the real supervisor, hub, server, cache and staging run in seconds.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path

import pytest

from difflab.bundle import keys, sealing
from difflab.errors import ConfigError
from difflab.observation import Observation
from difflab.probe import sandbox
from difflab.runner import childlib
from difflab.runner.cache import CachingRunner
from difflab.runner.subprocess import SubprocessRunner
from test_probe_processes import gone_soon
from test_warm_runner import HostEnvironment, job, lab, runner, toy_source  # noqa: F401 - lab is a fixture

needs_landlock = pytest.mark.skipif(not sandbox.available(), reason="this kernel has no Landlock")

HUNTER = """
import os
from pathlib import Path

def observe(kit):
    found = []
    for path in [{key_file!r}, str(Path.home() / ".config" / "sglang-difflab" / "signing-key.pem")]:
        try:
            found.append(Path(path).read_text())
        except OSError as exc:
            found.append(f"unreadable {{path}}: {{exc.strerror}}")
    try:  # nor replace what it cannot read (a key of its own choosing would then sign, or authenticate)
        Path({key_file!r}).with_name("result-cache.key").write_text("00" * 32)
        found.append("replaced the cache key")
    except OSError as exc:
        found.append(f"cannot replace the cache key: {{exc.strerror}}")
    found += [f"{{k}}={{v}}" for k, v in sorted(os.environ.items())]
    pid = os.getpid()
    while pid > 1:  # the environment of every process above this one, the lab's included
        try:
            found.append(open(f"/proc/{{pid}}/environ", "rb").read().decode(errors="replace"))
            pid = int(open(f"/proc/{{pid}}/stat").read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    print("\\n".join(found), flush=True)
    return {{"found": "\\n".join(found)}}
"""


def subprocess_runner() -> SubprocessRunner:
    return SubprocessRunner(environment=HostEnvironment(), workers=1)  # type: ignore[arg-type]


def write_results(out: Path, observations: list[Observation]) -> None:
    """What a run folder keeps of an observation (its log is already there)."""
    for n, obs in enumerate(observations):
        (out / f"{obs.probe}-{n}.json").write_text(json.dumps(obs.to_dict()))


def files_holding(folder: Path, texts: list[bytes]) -> list[str]:
    return sorted(
        str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file() and any(t in p.read_bytes() for t in texts)
    )


@needs_landlock
@pytest.mark.parametrize("backend", ["subprocess", "warm"])
def test_a_probe_hunting_for_the_signing_key_finds_neither_key(
    lab: Path,  # noqa: F811
    backend: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DIFFLAB_CONFIG", str(lab / "config"))
    user_key = keys.user_signing_key()  # ~/.config/sglang-difflab/signing-key.pem, as config_root() names it
    ci_key = keys.Ed25519PrivateKey.generate()
    monkeypatch.setenv("DIFFLAB_SIGNING_KEY", keys.private_pem(ci_key).decode())  # a CI secret, inline
    secrets = keys.private_key_marks(user_key.private) + keys.private_key_marks(ci_key)
    (lab / "probes" / "toy_hunt.py").write_text(HUNTER.format(key_file=str(user_key.path)))
    run_dir = lab / "run"
    jobs = [job(lab, "toy_hunt", toy_source(lab, "a"))]
    jobs = [dataclasses.replace(j, log_path=run_dir / "observations" / "f" / "a" / "toy_hunt.log") for j in jobs]
    if backend == "warm":
        with runner() as r:
            observations = r.run(jobs)
    else:
        observations = subprocess_runner().run(jobs)
    (obs,) = observations
    assert obs.status == "ok", obs.error
    assert f"unreadable {user_key.path}: Permission denied" in obs.fields["found"]  # it did look
    assert "cannot replace the cache key: Permission denied" in obs.fields["found"]
    write_results(run_dir, observations)
    assert files_holding(run_dir, secrets) == []
    env = dict(line.split("=", 1) for line in obs.fields["found"].splitlines() if line[:1].isupper() and "=" in line)
    assert Path(env["HOME"]).resolve() != Path.home().resolve()  # a home of its own
    assert "DIFFLAB_SIGNING_KEY" not in env and "DIFFLAB_CONFIG" not in env


def test_sealing_refuses_a_folder_holding_the_private_key_text(tmp_path: Path) -> None:
    signing = keys.SigningKey(keys.Ed25519PrivateKey.generate(), "argument", str(tmp_path / "key.pem"))
    run_dir = tmp_path / "run"
    (run_dir / "observations" / "f" / "a").mkdir(parents=True)
    (run_dir / "run.json").write_text("{}")
    leaked = run_dir / "observations" / "f" / "a" / "p.log"
    leaked.write_bytes(b"probe output\n" + keys.private_pem(signing.private) + b"more\n")
    with pytest.raises(ConfigError, match="holds the text of the signing key") as caught:
        sealing.seal_with(run_dir, signing)
    assert str(leaked) in str(caught.value)
    assert not (run_dir / "keys").exists()  # nothing of the seal was written


# -- nothing a probe writes reaches another run --------------------------------------------------------------

HONEST = """
import toymod

def observe(kit):
    return {"value": toymod.VALUE}
"""

VANDAL = """
import json
from pathlib import Path

def observe(kit):
    cache = Path({cache!r})
    rewritten = 0
    for entry in (cache / "results").rglob("*.json"):  # every stored observation now says "forged"
        data = json.loads(entry.read_text())
        data["observation"]["fields"] = {{"value": "forged"}}
        entry.write_text(json.dumps(data))
        rewritten += 1
    for child in (cache / "childlib").glob("*/difflab/probe/child.py"):  # and so does every later probe
        text = child.read_text()
        text = text.replace(
            'if __name__ == "__main__":',
            "_run_probe = run_probe\\n"
            "def run_probe(path, kit=None):\\n"
            "    result = _run_probe(path, kit)\\n"
            "    result['fields'] = {{'value': 'forged'}}\\n"
            "    return result\\n\\n"
            'if __name__ == "__main__":',
        )
        child.write_text(text)
        rewritten += 1
    return {{"rewritten": rewritten}}
"""


def test_a_probe_that_rewrites_the_cache_and_the_staged_package_changes_no_later_run(
    lab: Path,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DIFFLAB_CONFIG", str(lab / "config"))
    cache = lab / "cache"
    (lab / "probes" / "toy_honest.py").write_text(HONEST)
    (lab / "probes" / "toy_vandal.py").write_text(VANDAL.format(cache=str(cache)))
    src = toy_source(lab, "a")
    env = HostEnvironment()

    def cached() -> CachingRunner:
        return CachingRunner(inner=subprocess_runner(), environment=env)  # type: ignore[arg-type]

    (first,) = cached().run([job(lab, "toy_honest", src)])
    assert first.fields == {"value": "a"} and not first.cached
    (vandal,) = subprocess_runner().run([job(lab, "toy_vandal", src, 1)])
    assert vandal.status == "ok" and vandal.fields["rewritten"] >= 2, vandal.error  # it did rewrite both

    later = cached()
    (again,) = later.run([job(lab, "toy_honest", src)])
    assert again.fields == {"value": "a"} and not again.cached  # the forged entry was not replayed
    assert later.discarded == 1
    (fresh,) = subprocess_runner().run([job(lab, "toy_honest", src, 2)])  # --no-cache
    assert fresh.fields == {"value": "a"}
    staged = childlib.stage(cache)
    assert childlib.staged_digest(staged) == childlib.child_digest()  # the staged copy is the lab's again


def test_the_cache_key_names_the_back_end(lab: Path) -> None:  # noqa: F811
    src = toy_source(lab, "a")
    one = job(lab, "toy_patch", src)
    keys_by_backend = set()
    for name in ("warm", "subprocess", "docker"):
        inner = subprocess_runner()
        inner.name = name
        caching = CachingRunner(inner=inner, environment=HostEnvironment())  # type: ignore[arg-type]
        keys_by_backend.add(caching.key(caching.key_parts(one, {"harness": "", "child": ""})))
    assert len(keys_by_backend) == 3


def test_a_staged_copy_with_anything_added_is_staged_again(lab: Path) -> None:  # noqa: F811
    staged = childlib.stage(lab / "cache")
    (staged / "difflab" / "probe" / "__pycache__").mkdir()
    (staged / "difflab" / "probe" / "__pycache__" / "child.cpython-311.pyc").write_bytes(b"not the lab's")
    assert childlib.staged_digest(staged) is None
    assert childlib.staged_digest(childlib.stage(lab / "cache")) == childlib.child_digest()


# -- the lab's code first, and nothing outlives the command --------------------------------------------------

ESCAPE = """
import os, time
from pathlib import Path

def escape(pidfile):
    first = os.fork()
    if first == 0:
        os.setsid()
        if os.fork() == 0:
            Path(pidfile).write_text(str(os.getpid()))
            time.sleep(300)
        os._exit(0)
    os.waitpid(first, 0)
    for _ in range(300):
        if Path(pidfile).exists() and Path(pidfile).read_text():
            break
        time.sleep(0.01)
"""

LEADER = """
import os, sys
from pathlib import Path
import difflab, toymod

def observe(kit):
    supervisor = os.getppid()
    lab_package = str(Path(difflab.__file__).parents[1])
    source = str(Path(toymod.__file__).parent)
    hooks = [getattr(sys.modules.get(h), "__file__", None) or "" for h in ("sitecustomize", "usercustomize")]
    return {{
        "supervisor_leads_its_session": os.getsid(supervisor) == supervisor,
        "source_behind_lab": sys.path.index(source) > sys.path.index(lab_package),
        "build_hooks_ran": [h for h in hooks if h.startswith({root!r})],
    }}
"""


@pytest.mark.parametrize("backend", ["subprocess", "warm"])
def test_a_fork_whose_start_up_hook_and_import_double_fork_leaves_nothing_running(
    lab: Path,  # noqa: F811
    backend: str,
) -> None:
    src = toy_source(lab, "hostile")
    pids = {name: lab / f"{backend}-{name}.pid" for name in ("sitecustomize", "usercustomize", "import")}
    (src.root / "escape.py").write_text(ESCAPE)
    for hook in ("sitecustomize", "usercustomize"):
        (src.root / f"{hook}.py").write_text(f"import escape\nescape.escape({str(pids[hook])!r})\n")
    (src.root / "toymod.py").write_text(f"import escape\nescape.escape({str(pids['import'])!r})\nVALUE = 'x'\n")
    (lab / "probes" / "toy_leader.py").write_text(LEADER.format(root=str(src.root)))
    jobs = [job(lab, "toy_leader", src, timeout_s=20)]
    started = time.monotonic()
    if backend == "warm":
        with runner() as r:
            (obs,) = r.run(jobs)
    else:
        (obs,) = subprocess_runner().run(jobs)
    assert obs.status == "ok", obs.error
    assert obs.fields["build_hooks_ran"] == []  # the build's start-up hooks never ran
    assert obs.fields["source_behind_lab"] is True
    if backend == "subprocess":
        assert obs.fields["supervisor_leads_its_session"] is True
    left = []
    for name, pidfile in pids.items():
        if pidfile.exists() and pidfile.read_text():
            pid = int(pidfile.read_text())
            if not gone_soon(pid, within_s=max(0.5, 3 - (time.monotonic() - started))):
                left.append(f"{name}: {pid}")
                os.kill(pid, 9)
    assert left == [], f"still running after the command returned ({backend})"


# -- what a verdict about hostile code is worth ---------------------------------------------------------------


def test_backport_on_a_local_back_end_says_what_its_verdict_is_worth(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from difflab.errors import DifflabError
    from difflab.paths import repo_root
    from difflab.progress import Reporter
    from difflab.workflows.backport import BackportRequest, execute

    monkeypatch.setenv("DIFFLAB_CACHE", str(tmp_path / "cache"))
    said: list[str] = []
    reporter = Reporter()
    monkeypatch.setattr(reporter, "say", said.append)
    for backend in ("warm", "subprocess", "docker"):
        req = BackportRequest(repo=str(tmp_path / "no-such-fork"), ref="main", runner=backend, out=tmp_path / backend)
        with pytest.raises(DifflabError):  # the fork is unreachable: the line comes before anything is fetched
            execute(req, reporter)
    notes = [line for line in said if "not that it is honest" in line]
    assert [n.split()[1] for n in notes] == ["warm", "subprocess"]  # one line per local run, none for docker
    assert all("--backend docker" in n for n in notes)
    forks = (repo_root() / "docs" / "forks.md").read_text()
    assert "can therefore forge its own observation" in forks and "**every** back end, Docker included" in forks
    bundle = (repo_root() / "docs" / "bundle.md").read_text()
    assert "a fork's code forges its own observation" in bundle


SCRIBBLER = """
import os
from pathlib import Path

def observe(kit):
    outcome = {{}}
    for name, folder in {targets!r}.items():
        try:
            Path(folder).mkdir(parents=True, exist_ok=True)
            (Path(folder) / "planted.py").write_text("print('planted')")
            outcome[name] = "written"
        except OSError as exc:
            outcome[name] = exc.strerror
    Path("own-folder.txt").write_text("mine")  # its own temporary folder
    outcome["own"] = "written"
    return outcome
"""


@needs_landlock
@pytest.mark.parametrize("backend", ["subprocess", "warm"])
def test_a_probe_can_change_nothing_a_later_run_reads(
    lab: Path,  # noqa: F811
    backend: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import tempfile

    work = lab / "tmp"
    work.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(work))  # the cache below lies outside the temporary folder
    cache = lab / "cache"
    src, other = toy_source(lab, "a"), toy_source(lab, "b")
    targets = {
        "result cache": str(cache / "results" / "ab"),
        "staged package": str(childlib.stage(cache) / "difflab" / "probe"),
        "environment": str(lab / "env" / "site-packages"),
        "sources": str(other.root),
        "other build's bytecode": str(cache / "pycache" / str(other.root).lstrip("/")),
        "probes": str(lab / "probes"),
    }
    (lab / "probes" / "toy_scribble.py").write_text(SCRIBBLER.format(targets=targets))
    jobs = [job(lab, "toy_scribble", src)]
    if backend == "warm":
        with runner() as r:
            (obs,) = r.run(jobs)
    else:
        (obs,) = subprocess_runner().run(jobs)
    assert obs.status == "ok", obs.error
    assert obs.fields == {**dict.fromkeys(targets, "Permission denied"), "own": "written"}
    assert not any(Path(t, "planted.py").exists() for t in targets.values())


def test_a_docker_probe_gets_only_checked_read_only_inputs_and_no_secret(
    lab: Path,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from types import SimpleNamespace

    from difflab.paths import config_root
    from difflab.runner.docker import DockerRunner

    monkeypatch.setenv("DIFFLAB_CONFIG", str(lab / "config"))
    monkeypatch.setenv("DIFFLAB_SIGNING_KEY", "-----BEGIN PRIVATE KEY-----\nsecret\n-----END PRIVATE KEY-----")
    staged = childlib.stage(lab / "cache")
    (staged / "difflab" / "probe" / "child.py").write_text("# rewritten by a probe\n")
    child_root = childlib.stage(lab / "cache")  # what DockerRunner.run mounts: checked, staged again
    assert childlib.staged_digest(child_root) == childlib.child_digest()
    image = SimpleNamespace(id="sha256:x", python="/opt/difflab/env/bin/python")
    config = DockerRunner().container_config(
        job(lab, "toy_patch", toy_source(lab, "a")), image, child_root, lab / "out"
    )
    assert "DIFFLAB_SIGNING_KEY" not in config["environment"]
    assert all(not str(m["Source"]).startswith(str(config_root())) for m in config["mounts"])
    assert [m["Target"] for m in config["mounts"] if not m["ReadOnly"]] == ["/difflab/out"]
    assert config["network_mode"] == "none" and config["read_only"] is True
