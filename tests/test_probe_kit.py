"""The probe kit turns every way a fake or SGLang can hide a failure into an ``error``."""

from __future__ import annotations

import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from difflab.probe.child import run_probe
from difflab.probe.kit import Kit
from difflab.runner.base import ProbeJob
from difflab.runner.subprocess import SubprocessRunner
from difflab.source.base import MaterialisedSource


def probe(tmp_path: Path, body: str, name: str = "p") -> Path:
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(body))
    return path


def test_ok_probe_returns_sorted_fields(tmp_path: Path) -> None:
    res = run_probe(probe(tmp_path, "def observe(kit):\n    return {'b.x': 1, 'a.y': [1, 2]}\n"), Kit())
    assert res["status"] == "ok" and list(res["fields"]) == ["a.y", "b.x"]


def test_missing_fake_attribute_swallowed_by_except_exception_is_still_an_error(tmp_path: Path) -> None:
    body = """
    def observe(kit):
        fake = kit.fake("kv_sender", send=lambda: None)
        try:
            fake.abort()          # SGLang code doing this inside `except Exception` ...
        except Exception:
            pass
        return {"s.sent": True}
    """
    res = run_probe(probe(tmp_path, body), Kit())
    assert res["status"] == "error"
    assert "kv_sender.abort" in res["error"]


def test_missing_fake_attribute_even_when_base_exception_is_swallowed(tmp_path: Path) -> None:
    body = """
    def observe(kit):
        try:
            kit.fake("engine").transfer
        except BaseException:
            pass
        return {"s.x": 1}
    """
    res = run_probe(probe(tmp_path, body), Kit())
    assert res["status"] == "error" and "missing fake attribute: engine.transfer" in res["problems"][0]


def test_exception_inside_a_guarded_fake_is_recorded(tmp_path: Path) -> None:
    body = """
    def observe(kit):
        send = kit.recorder("send_kvcache", side_effect=lambda: 1 / 0)
        try:
            send()
        except Exception:
            pass            # a worker loop that wraps and swallows
        return {"s.x": send.count}
    """
    res = run_probe(probe(tmp_path, body), Kit())
    assert res["status"] == "error" and "ZeroDivisionError" in res["error"]


def test_an_intended_failure_is_an_event_not_a_problem(tmp_path: Path) -> None:
    """A scenario may make a fake fail on purpose ("the transport refuses the abort"); nothing else may."""
    body = """
    def observe(kit):
        refused = kit.intended_failure("the transport refuses the abort")
        abort = kit.recorder("sender.abort", side_effect=lambda: (_ for _ in ()).throw(refused("link down")))
        sender = kit.fake("sender", abort=abort, ping={ping})
        try:
            sender.abort()
        except RuntimeError:
            pass            # SGLang's best-effort notify
        try:
            sender.ping()
        except Exception:
            pass
        return {{"s.tries": abort.count}}
    """
    good = run_probe(probe(tmp_path, body.format(ping="lambda: None"), "a"), Kit())
    assert good["status"] == "ok" and good["fields"] == {"s.tries": 1}
    (event,) = good["events"]
    assert event["event"] == "intended_failure" and event["what"] == "the transport refuses the abort"
    assert event["where"] == "sender.abort" and "link down" in event["exception"]
    bad = run_probe(probe(tmp_path, body.format(ping="lambda: 1 / 0"), "b"), Kit())
    assert bad["status"] == "error" and "sender.ping: ZeroDivisionError" in bad["error"]


def test_an_intended_failure_keeps_its_base_class() -> None:
    kit = Kit()
    rejected = kit.intended_failure("the grammar rejects the token", ValueError)
    assert issubclass(rejected, ValueError) and rejected("x").intended_failure == "the grammar rejects the token"
    with pytest.raises(TypeError):
        kit.intended_failure("not an error", KeyboardInterrupt)  # type: ignore[arg-type]


def test_an_intended_failure_sglang_does_not_handle_still_escapes_as_an_error(tmp_path: Path) -> None:
    escaping = """
    def observe(kit):
        unreachable = kit.intended_failure("rank 1 is unreachable", OSError)
        send = kit.recorder("send", side_effect=lambda: (_ for _ in ()).throw(unreachable("x")))
        send()
        return {"s.x": 1}
    """
    res = run_probe(probe(tmp_path, escaping, "c"), Kit())
    assert res["status"] == "error" and "IntendedOSError" in res["error"]


def test_logged_error_is_a_problem_unless_allowed(tmp_path: Path) -> None:
    body = """
    import logging
    def observe(kit):
        {allow}
        logging.getLogger("sglang.x").error("Transfer failed for room 7")
        return {{"s.x": 1}}
    """
    bad = run_probe(probe(tmp_path, body.format(allow="pass"), "a"), Kit())
    assert bad["status"] == "error" and "Transfer failed" in bad["error"]
    good = run_probe(probe(tmp_path, body.format(allow="kit.allow_log('Transfer failed')"), "b"), Kit())
    assert good["status"] == "ok"


def test_not_applicable_and_non_json(tmp_path: Path) -> None:
    na = run_probe(probe(tmp_path, "def observe(kit):\n    kit.not_applicable('no such path')\n", "a"), Kit())
    assert na["status"] == "n/a"
    bad = run_probe(probe(tmp_path, "def observe(kit):\n    return {'x': object()}\n", "b"), Kit())
    assert bad["status"] == "error" and "not JSON-serialisable" in bad["error"]


def test_no_observe_function(tmp_path: Path) -> None:
    res = run_probe(probe(tmp_path, "X = 1\n"), Kit())
    assert res["status"] == "error" and "defines no observe(kit)" in res["error"]


@dataclass
class HostPython:
    """The test interpreter standing in for the shared environment (no SGLang needed here)."""

    python: str = sys.executable
    digest: str = "host"


def job(tmp_path: Path, body: str, timeout: float = 30.0) -> ProbeJob:
    src = MaterialisedSource(label="none", kind="release", root=tmp_path, identity={"kind": "test"}, digest="x")
    return ProbeJob(
        fix_id="1",
        probe="p",
        side="base",
        source=src,
        probe_file=probe(tmp_path, body),
        log_path=tmp_path / "p.log",
        timeout_s=timeout,
    )


def test_runner_turns_a_crash_into_an_error_observation(tmp_path: Path) -> None:
    runner = SubprocessRunner(environment=HostPython(), workers=1)  # type: ignore[arg-type]
    (o,) = runner.run([job(tmp_path, "import os\ndef observe(kit):\n    print('dying', flush=True); os._exit(3)\n")])
    assert o.status == "error" and "exit 3" in o.error and "dying" in o.error


def test_runner_kills_a_hanging_probe(tmp_path: Path) -> None:
    runner = SubprocessRunner(environment=HostPython(), workers=1)  # type: ignore[arg-type]
    (o,) = runner.run([job(tmp_path, "import time\ndef observe(kit):\n    time.sleep(60)\n", timeout=2)])
    assert o.status == "error" and "hung" in o.error


def test_runner_records_fields_and_source_identity(tmp_path: Path) -> None:
    runner = SubprocessRunner(environment=HostPython(), workers=1)  # type: ignore[arg-type]
    (o,) = runner.run([job(tmp_path, "def observe(kit):\n    return {'s.x': True}\n")])
    assert o.status == "ok" and o.fields == {"s.x": True} and o.source == {"kind": "test"}


def test_stubs_serve_triton_and_torchvision() -> None:
    import subprocess

    code = (
        "from difflab.probe import stubs; stubs.install()\n"
        "import triton, triton.language as tl, torchvision\n"
        "@triton.jit\ndef k(x):\n    return x\n"
        "assert k(3) == 3\n"
        "c = triton.Config({'B': 1}, num_warps=4)\n"
        "assert torchvision.__version__ and torchvision.transforms.InterpolationMode.NEAREST_EXACT is not None\n"
        "try:\n    triton.runtime.driver.active\nexcept RuntimeError:\n    print('no-driver')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "no-driver" in out


def test_a_build_reporting_a_staged_failure_in_its_own_words_is_not_a_problem(tmp_path: Path) -> None:
    """A fork's hand-port may log the failure the scenario staged with its own sentence; other errors still count."""
    body = """
    import logging
    log = logging.getLogger("sglang.srt.disaggregation.prefill")
    def observe(kit):
        refused = kit.intended_failure("the transport refuses the abort")
        def abort():
            raise refused("KV sender unreachable for room 7")
        abort = kit.recorder("sender.abort", side_effect=abort)
        try:
            abort()
        except RuntimeError as exc:
            log.exception("ACME: KV sender abort failed for room 7")       # carries the staged exception
            log.error("ACME: could not notify: %s", exc)                     # quotes it
        {extra}
        return {{"s.tries": abort.count}}
    """
    ok = run_probe(probe(tmp_path, body.format(extra="pass"), "own_words"), Kit())
    assert ok["status"] == "ok", ok["problems"]
    bad = run_probe(probe(tmp_path, body.format(extra="log.error('ACME: pool exhausted')"), "other_error"), Kit())
    assert bad["status"] == "error" and "ACME: pool exhausted" in bad["error"]
