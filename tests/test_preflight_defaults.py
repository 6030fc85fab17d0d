"""A build's configuration-only defences, read from its tree: ``difflab preflight --build`` and backport's section."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from difflab import cli
from difflab.matrix import load_matrix
from difflab.paths import default_matrix
from difflab.preflight.defaults import read_defaults
from difflab.source.release import ReleaseSource

ENVIRON = """
    class EnvBool: ...
    class EnvInt: ...
    class Envs:
        SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE = EnvBool({deferred})
        SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT = EnvFloat(30.0)
        {batch}
    envs = Envs()
"""
FIELDS = """
    class DisaggArgs:
        disaggregation_transfer_backend: A[str, "The backend."] = "mooncake"
        disaggregation_enable_kv_checksum: A[
            bool,
            "Compute an Adler-32 checksum over each request's KV pages.",
        ] = {checksum}
"""


def build_tree(
    root: Path,
    *,
    deferred: bool,
    batch: int | None,
    checksum: bool | None,
    fields_file: str = "arg_groups/fields/disagg.py",
) -> Path:
    """A tree laid out like a release's sglang/ (the files and shapes 0.5.21+ declare them in)."""
    srt = root / "sglang" / "srt"
    line = f"SGLANG_MOONCAKE_MAX_TRANSFER_BATCH_INDICES = EnvInt({batch})" if batch is not None else ""
    (srt / "disaggregation" / "common").mkdir(parents=True)
    (srt / "environ.py").write_text(textwrap.dedent(ENVIRON.format(deferred=deferred, batch=line)))
    (srt / "disaggregation" / "decode.py").write_text(
        "enabled = envs.SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE.get()\n"
    )
    (srt / "disaggregation" / "common" / "conn.py").write_text(
        "x = envs.SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE.get()\n"
    )
    if checksum is not None:
        (srt / fields_file).parent.mkdir(parents=True, exist_ok=True)
        (srt / fields_file).write_text(textwrap.dedent(FIELDS.format(checksum=checksum)))
    return root


def test_each_default_is_the_builds_own_literal_with_where_it_is_declared(tmp_path: Path) -> None:
    found = {d.key: d for d in read_defaults(build_tree(tmp_path, deferred=True, batch=0, checksum=False))}
    deferred, batch, checksum = found["deferred-release"], found["transfer-batch"], found["kv-checksum"]
    assert (deferred.value, deferred.protects, deferred.where) == (True, True, "sglang/srt/environ.py:5")
    assert deferred.read_by == ("disaggregation/common/conn.py", "disaggregation/decode.py")  # both roles' code
    assert (batch.value, batch.protects) == (0, False)  # 0 keeps one unbounded batch
    assert (checksum.value, checksum.protects) == (False, False)
    assert checksum.where == "sglang/srt/arg_groups/fields/disagg.py:4"
    assert checksum.describe() == (
        "PD KV checksum (#39500): disaggregation_enable_kv_checksum (--disaggregation-enable-kv-checksum) "
        "defaults to False (sglang/srt/arg_groups/fields/disagg.py:4): does NOT protect unless set"
    )


def test_an_older_layout_and_a_missing_option_are_told_apart(tmp_path: Path) -> None:
    root = build_tree(tmp_path, deferred=False, batch=None, checksum=True, fields_file="server_args.py")
    found = {d.key: d for d in read_defaults(root / "sglang")}  # the package folder itself works too
    assert found["kv-checksum"].where == "sglang/srt/server_args.py:4" and found["kv-checksum"].protects
    assert not found["deferred-release"].protects
    assert not found["transfer-batch"].found
    assert (
        found["transfer-batch"]
        .describe()
        .endswith("this build has no SGLANG_MOONCAKE_MAX_TRANSFER_BATCH_INDICES: not available")
    )


def test_preflight_build_prints_the_defaults_and_fails_on_one_left_off(tmp_path: Path, capsys) -> None:
    root = build_tree(tmp_path / "b", deferred=True, batch=4096, checksum=False)
    assert cli.main(["preflight", "--build", str(root)]) == 1
    out = capsys.readouterr()
    doc = json.loads(out.out)
    assert [(d["key"], d["value"], d["protects"]) for d in doc["defaults"]] == [
        ("deferred-release", True, True),
        ("transfer-batch", 4096, True),
        ("kv-checksum", False, False),
    ]
    assert "OFF  PD KV checksum (#39500)" in out.err and "ok   deferred decode KV release" in out.err
    safe = build_tree(tmp_path / "safe", deferred=True, batch=4096, checksum=True)
    assert cli.main(["preflight", "--build", str(safe), "--json", str(tmp_path / "r.json")]) == 0
    assert json.loads((tmp_path / "r.json").read_text())["build"] == str(safe)


def test_preflight_build_refuses_what_is_not_a_build(tmp_path: Path, capsys) -> None:
    assert cli.main(["preflight", "--build", str(tmp_path)]) == 2
    assert "not a build's tree (no sglang/srt under it)" in capsys.readouterr().err
    assert cli.main(["preflight", "--build", str(tmp_path / "nowhere")]) == 2
    assert "not a folder holding sglang/, nor a release version" in capsys.readouterr().err
    assert cli.main(["preflight", "--prefill", "http://127.0.0.1:1"]) == 2
    assert "--prefill and --decode are both needed" in capsys.readouterr().err


# -- the real release trees: the option names and defaults per release ----------------------------
EXPECTED = {  # release -> (deferred release default, batch cap default or None: absent, checksum default or None)
    "0.5.19": (False, None, None),
    "0.5.20": (False, 0, None),
    "0.5.21": (True, 0, False),
    "0.5.22": (True, 0, False),
    "0.5.23": (True, 0, False),
}


@pytest.mark.sglang
@pytest.mark.xdist_group("release")
def test_the_release_trees_declare_the_defences_as_recorded() -> None:
    releases = ReleaseSource(load_matrix(default_matrix()).releases)
    for version, (deferred, batch, checksum) in EXPECTED.items():
        found = {d.key: d for d in read_defaults(releases.release(version).root)}
        got = tuple(
            found[k].value if found[k].found else None for k in ("deferred-release", "transfer-batch", "kv-checksum")
        )
        assert got == (deferred, batch, checksum), version
        assert found["deferred-release"].read_by == ("disaggregation/common/conn.py", "disaggregation/decode.py")
        assert found["deferred-release"].where.startswith("sglang/srt/environ.py:")
        if checksum is not None:
            assert found["kv-checksum"].where.startswith("sglang/srt/arg_groups/fields/disagg.py:"), version
