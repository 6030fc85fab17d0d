"""Bad input gets a clear message, exit 2, and never replaces a good result."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from difflab.cli import main
from difflab.paths import default_matrix
from matrix_samples import FIX, RELEASES


def run_cli(args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "difflab", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=300,
    )


def test_every_command_has_help() -> None:
    out = run_cli(["--help"])
    assert out.returncode == 0
    for name in ("run", "observe", "merge", "contains", "selfcheck"):
        assert name in out.stdout


def test_malformed_matrix_exits_2_naming_the_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text((RELEASES + FIX).replace("pr = 38935", "pr = -1"))
    assert main(["run", "--matrix", str(bad), "--out", str(tmp_path / "o"), "--no-bundle"]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "fix '38935'.pr" in err
    assert not (tmp_path / "o").exists()


def test_unknown_fix_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--fix", "12345", "--out", str(tmp_path / "o"), "--no-bundle"]) == 2
    assert "unknown fix '12345'" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_unreachable_registry_names_the_release_and_keeps_the_good_result(tmp_path: Path) -> None:
    good = tmp_path / "out"
    good.mkdir()
    (good / "run.json").write_text('{"tool": "sglang-difflab"}')  # an earlier result: --force may replace it
    (good / "diff.json").write_text('{"good": true}')
    matrix = tmp_path / "m.toml"
    matrix.write_text(default_matrix().read_text())
    env = {
        "DIFFLAB_CACHE": str(tmp_path / "cache"),
        "PIP_INDEX_URL": "http://127.0.0.1:9/simple",
        "PIP_EXTRA_INDEX_URL": "",
        "PIP_FIND_LINKS": "",
        "PIP_RETRIES": "0",
        "PIP_TIMEOUT": "2",
        "PIP_CONFIG_FILE": os.devnull,
    }
    out = run_cli(["run", "--matrix", str(matrix), "--fix", "38935", "--out", str(good), "--force", "--no-bundle"], env)
    assert out.returncode == 2, out.stderr
    assert "release 0.5.20" in out.stderr and "could not download" in out.stderr
    assert (good / "diff.json").read_text() == '{"good": true}'
    assert not [p for p in tmp_path.iterdir() if ".partial-" in p.name]


def test_wheel_with_the_wrong_hash_is_refused_and_not_kept(tmp_path: Path) -> None:
    """A registry serving a different file under the pinned name: named, exit 2, nothing cached or written."""
    import zipfile

    links = tmp_path / "links"
    links.mkdir()
    name = "sglang-0.5.20-cp311-cp311-manylinux_2_34_x86_64.whl"
    with zipfile.ZipFile(links / name, "w") as z:
        z.writestr("sglang/__init__.py", "# not the pinned release\n")
        z.writestr("sglang-0.5.20.dist-info/METADATA", "Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.20\n")
        z.writestr(
            "sglang-0.5.20.dist-info/WHEEL",
            "Wheel-Version: 1.0\nGenerator: t\nRoot-Is-Purelib: false\nTag: cp311-cp311-manylinux_2_34_x86_64\n",
        )
        z.writestr("sglang-0.5.20.dist-info/RECORD", "")
    cache = tmp_path / "cache"
    env = {
        "DIFFLAB_CACHE": str(cache),
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": str(links),
        "PIP_CONFIG_FILE": os.devnull,
    }
    out = run_cli(["run", "--fix", "38935", "--out", str(tmp_path / "out"), "--no-bundle"], env)
    assert out.returncode == 2, out.stderr
    assert f"release 0.5.20: {name} has sha256" in out.stderr and "refusing to use it" in out.stderr
    assert not (cache / "wheels" / name).exists()
    assert not any((cache / "sources").glob("**/__init__.py"))
    assert not (tmp_path / "out").exists()


def test_a_command_imports_only_its_own_module_and_help_lists_every_one() -> None:
    from difflab.cli import discover

    assert [m.NAME for m in discover("run")] == ["run"]
    every = [m.NAME for m in discover()]
    assert every == [
        "backport",
        "bisect",
        "contains",
        "fuzz",
        "gpu",
        "hub",
        "image",
        "lock",
        "merge",
        "observe",
        "pack",
        "preflight",
        "releases",
        "reproduce",
        "run",
        "selfcheck",
        "verify",
    ]
    assert [m.NAME for m in discover("no-such-command")] == every  # argparse then names the choices


def test_a_run_does_not_import_the_other_commands_workflows() -> None:
    code = (
        "import sys\nfrom difflab.cli import main\n"
        "try:\n    main(['merge', '--help'])\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in sys.modules if m.startswith('difflab.workflows.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    # the session is the steps every workflow shares, not another command's workflow
    assert out.stdout.strip().splitlines()[-1] == "['difflab.workflows.merge', 'difflab.workflows.session']"


def test_selfcheck_takes_the_session_options_and_refuses_bad_input_before_writing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "o"
    argv = ["selfcheck", "--no-bundle", "--timeout", "60", "--source", "git", "--fix", "12345", "--out", str(out)]
    assert main(argv) == 2
    assert "unknown fix '12345'" in capsys.readouterr().err
    assert not out.exists()
    with pytest.raises(SystemExit) as exited:  # argparse names the choices
        main(["selfcheck", "--source", "tarball", "--out", str(out)])
    assert exited.value.code == 2 and "invalid choice: 'tarball'" in capsys.readouterr().err
