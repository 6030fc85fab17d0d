"""The four preflight gates against running (test) engines: safe passes, each unsafe setting fails alone."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from difflab import cli
from difflab.engine import names
from difflab.errors import ConfigError
from difflab.preflight.envsource import parse_lines, read_env
from difflab.preflight.run import run_preflight
from difflab.testing.testserver import TestDeployment, TestServerConfig

GATES = ["kv-pool", "deferred-release", "transfer-batch", "kv-checksum"]


def env_files(cfg: TestServerConfig, tmp_path: Path) -> dict[str, str]:
    out = {}
    for role, env in cfg.env.items():
        path = tmp_path / f"{role}.env"
        path.write_text("".join(f"{k}={v}\n" for k, v in env.items()))
        out[role] = str(path)
    return out


def preflight(cfg: TestServerConfig, tmp_path: Path, with_env: bool = True, router: bool = True):
    with TestDeployment(cfg) as dep:
        return run_preflight(
            dep.prefill_url,
            dep.decode_url,
            dep.router_url if router else None,
            env_files(cfg, tmp_path) if with_env else None,
            timeout_s=10,
        )


def statuses(report) -> dict[str, str]:
    return {g.gate: g.status for g in report.gates}


def gate(report, name):
    return next(g for g in report.gates if g.gate == name)


def test_safe_deployment_passes_every_gate(tmp_path: Path):
    report = preflight(TestServerConfig(), tmp_path)
    assert report.ok and report.failing == []
    assert statuses(report) == dict.fromkeys(GATES, "pass")
    sources = {e.source for g in report.gates for e in g.evidence}
    assert "metric sglang:max_total_num_tokens" in sources and "metric sglang:context_len" in sources
    assert any(s.startswith(f"env {names.DEFERRED_ENV} (") for s in sources)
    assert "live request" in gate(report, "kv-checksum").reason


@pytest.mark.parametrize(
    "change, failing, words",
    [
        (lambda c: TestServerConfig(prefill_pool_tokens=1024), "kv-pool", "prefill pool 1024 < context 2048"),
        (lambda c: TestServerConfig(decode_pool_tokens=1024), "kv-pool", "decode pool 1024 < context 2048"),
        (
            lambda c: c.with_env("decode", **{names.DEFERRED_ENV: "false"}),
            "deferred-release",
            "off on decode",
        ),
        (lambda c: c.with_env("prefill", **{names.DEFERRED_ENV: "0"}), "deferred-release", "off on prefill"),
        (
            lambda c: c.with_env("prefill", **{names.TRANSFER_BATCH_ENV: "0"}),
            "transfer-batch",
            "splitting is disabled",
        ),
        (
            lambda c: c.with_env("decode", **{names.CHECKSUM_ENV: "0"}),
            "kv-checksum",
            "off on decode only: decode skips the comparison",
        ),
        (
            lambda c: c.with_env("prefill", **{names.CHECKSUM_ENV: "0"}).with_env(
                "decode", **{names.CHECKSUM_ENV: "0"}
            ),
            "kv-checksum",
            "off on prefill, decode",
        ),
        (lambda c: c.with_env("decode", **{names.CHECKSUM_ENV: "2"}), "kv-checksum", "levels differ"),
    ],
)
def test_each_unsafe_setting_fails_its_gate_alone(tmp_path: Path, change, failing, words):
    report = preflight(change(TestServerConfig()), tmp_path)
    assert report.failing == [failing]
    assert words in gate(report, failing).reason
    assert all(s == "pass" for g, s in statuses(report).items() if g != failing)


def test_checksum_as_an_old_server_flag(tmp_path: Path):
    flag = {names.CHECKSUM_FLAG_KEY: True}
    cfg = TestServerConfig(server_args={"prefill": dict(flag), "decode": dict(flag)})
    cfg = cfg.with_env("prefill", **{names.CHECKSUM_ENV: None}).with_env("decode", **{names.CHECKSUM_ENV: None})
    report = preflight(cfg, tmp_path)
    g = gate(report, "kv-checksum")
    assert g.status == "pass" and {e.source for e in g.evidence} >= {f"/server_info {names.CHECKSUM_FLAG_KEY}"}
    off = TestServerConfig(server_args={"prefill": dict(flag), "decode": {names.CHECKSUM_FLAG_KEY: False}})
    assert gate(preflight(off, tmp_path), "kv-checksum").status == "fail"


def test_older_endpoint_names_are_followed(tmp_path: Path):
    cfg = TestServerConfig(model_info_paths=("/get_model_info",), server_info_paths=("/get_server_info",))
    report = preflight(cfg, tmp_path)
    assert report.ok
    assert report.engines["decode"]["model_info_path"] == "/get_model_info"
    assert report.engines["prefill"]["server_info_path"] == "/get_server_info"


@pytest.mark.parametrize(
    "version, status",
    [
        ("0.5.21", "pass"),
        ("0.5.23.post1", "pass"),
        ("0.5.20", "fail"),
        ("0.5.18", "unknown"),
        ("dev", "unknown"),
    ],
)
def test_deferred_release_falls_back_to_the_release_default(tmp_path: Path, version, status):
    cfg = TestServerConfig(version=version)
    report = preflight(cfg, tmp_path, with_env=False)
    g = gate(report, "deferred-release")
    assert g.status == status
    if status != "unknown":
        assert all(e.source.startswith(f"default of SGLang {version}") for e in g.evidence)


def test_without_an_environment_source_env_only_flags_are_unknown_not_passed(tmp_path: Path):
    report = preflight(TestServerConfig(version="dev"), tmp_path, with_env=False)
    assert statuses(report) == {
        "kv-pool": "pass",
        "deferred-release": "unknown",
        "transfer-batch": "unknown",
        "kv-checksum": "unknown",
    }
    assert "set it explicitly" in gate(report, "transfer-batch").reason
    assert not report.ok and report.failing == ["deferred-release", "transfer-batch", "kv-checksum"]


def test_gates_that_do_not_apply(tmp_path: Path):
    cfg = TestServerConfig(server_args={"prefill": {names.BACKEND_INFO_KEY: "nixl"}, "decode": {"dcp_size": 2}})
    report = preflight(cfg.with_env("prefill", **{names.TRANSFER_BATCH_ENV: "0"}), tmp_path)
    assert statuses(report)["transfer-batch"] == "not-applicable"
    assert statuses(report)["kv-checksum"] == "not-applicable"
    assert report.ok


def test_unreachable_engines_and_failing_live_request(tmp_path: Path):
    with TestDeployment(TestServerConfig()) as dep:
        prefill, decode = dep.prefill_url, dep.decode_url
        dead_router = "http://127.0.0.1:9"  # discard port: nothing listens
        report = run_preflight(prefill, decode, dead_router, env_files(TestServerConfig(), tmp_path), timeout_s=2)
    assert gate(report, "kv-checksum").status == "fail" and "live request failed" in gate(report, "kv-checksum").reason
    report = run_preflight(prefill, decode, None, timeout_s=1)  # the deployment is gone now
    assert not report.ok and "did not answer" in gate(report, "kv-pool").reason


def test_environment_sources(tmp_path: Path, monkeypatch):
    text = '# comment\nexport A=1\nB="two words"\n\nnot a pair\nC=\n'
    assert parse_lines(text) == {"A": "1", "B": "two words", "C": ""}
    path = tmp_path / "e.env"
    path.write_text(text)
    assert read_env(str(path))["B"] == "two words"
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(20)"],
        env={"PREFLIGHT_PROBE": "yes"},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"  # exec has happened
        assert read_env(f"pid:{child.pid}")["PREFLIGHT_PROBE"] == "yes"
    finally:
        child.kill()
        child.wait(timeout=10)
    with pytest.raises(ConfigError, match="not docker:NAME, pid:N or a readable"):
        read_env(str(tmp_path / "missing.env"))
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    with pytest.raises(ConfigError, match="docker:engine-0: cannot inspect the container"):
        read_env("docker:engine-0")


def test_cli_exit_codes_and_json(tmp_path: Path, capsys):
    safe = TestServerConfig()
    envs = env_files(safe, tmp_path)
    with TestDeployment(safe) as dep:
        args = [
            "preflight",
            "--prefill",
            dep.prefill_url,
            "--decode",
            dep.decode_url,
            "--router",
            dep.router_url,
            "--env",
            f"prefill={envs['prefill']}",
            "--env",
            f"decode={envs['decode']}",
        ]
        assert cli.main(args) == 0
        doc = json.loads(capsys.readouterr().out)
        assert doc["ok"] is True and [g["gate"] for g in doc["gates"]] == GATES
        assert cli.main([*args, "--json", str(tmp_path / "r.json")]) == 0
        assert "preflight passed" in capsys.readouterr().out
        assert json.loads((tmp_path / "r.json").read_text())["failing"] == []
        assert cli.main(["preflight", "--prefill", dep.prefill_url, "--decode", dep.decode_url, "--env", "x=y"]) == 2
        assert "expected prefill=SOURCE" in capsys.readouterr().err
    unsafe = TestServerConfig(prefill_pool_tokens=1024).with_env("prefill", **{names.TRANSFER_BATCH_ENV: "0"})
    envs = env_files(unsafe, tmp_path)
    with TestDeployment(unsafe) as dep:
        code = cli.main(
            [
                "preflight",
                "--prefill",
                dep.prefill_url,
                "--decode",
                dep.decode_url,
                "--env",
                f"prefill={envs['prefill']}",
                "--env",
                f"decode={envs['decode']}",
            ]
        )
    captured = capsys.readouterr()
    assert code == 1
    assert "preflight FAILED: kv-pool, transfer-batch" in captured.err
    assert json.loads(captured.out)["failing"] == ["kv-pool", "transfer-batch"]
