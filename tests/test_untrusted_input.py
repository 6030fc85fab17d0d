"""What a bundle, an archive or a matrix says is shown as data, never obeyed: escaped names, no ready-made
trust commands, nothing of the publisher's machine in REPRODUCE.md, and configuration errors named.
"""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

from difflab.bundle import layout, trust
from difflab.bundle.pack import safe_extract
from difflab.bundle.sealing import seal
from difflab.bundle.verify import verify_path
from difflab.cli import main
from difflab.errors import ConfigError, VerificationFailed
from difflab.files.names import printable
from difflab.matrix import load_matrix
from matrix_samples import FIX, RELEASES
from test_bundle_support import (  # noqa: F401 - isolated_config is an autouse fixture
    isolated_config,
    make_key,
    make_run_folder,
    sealed,
)

ESCAPE = "report\x1b[2K\r\x1b[32mOK everything verified\x1b[0m.txt"


def test_control_characters_in_a_bundle_file_name_are_escaped_and_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    private, public = make_key(tmp_path / "keys")
    run_dir, _ = sealed(tmp_path, private)
    (run_dir / ESCAPE).write_text("x")
    assert main(["verify", str(run_dir), "--key", str(public)]) == 1
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\r" not in err
    assert f"{printable(ESCAPE)}: file name holds control characters" in err
    assert "report\\x1b[2K\\x0d\\x1b[32mOK" in err


def test_sealing_refuses_a_file_name_with_control_characters(tmp_path: Path) -> None:
    private, _ = make_key(tmp_path / "keys")
    run_dir = make_run_folder(tmp_path)
    (run_dir / "observations" / "bidi\u202etxt.json").write_text("{}")
    with pytest.raises(ConfigError, match=r"bidi\\u202etxt.json"):
        seal(run_dir, private, echo=lambda _m: None, environ={})


def test_an_archive_member_with_control_characters_is_refused_escaped(tmp_path: Path) -> None:
    path = tmp_path / "names.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for name in ("run/SHA256SUMS", f"run/{ESCAPE}"):
            info = tarfile.TarInfo(name)
            info.size = 1
            tar.addfile(info, io.BytesIO(b"x"))
    dest = tmp_path / "dest"
    dest.mkdir()
    with pytest.raises(VerificationFailed) as caught:
        safe_extract(path, dest)
    assert "\x1b" not in str(caught.value) and f"run/{printable(ESCAPE)}: unsafe name" in str(caught.value)


def test_the_untrusted_key_is_shown_as_a_claim_not_as_a_command(tmp_path: Path) -> None:
    private, _ = make_key(tmp_path / "keys")
    run_dir, info = sealed(tmp_path, private)
    report = verify_path(run_dir, trust.build(fingerprints=["sha256:" + "1" * 64]))
    [problem] = [p for p in report.problems if p.path == layout.PUBLIC_KEY]
    assert f"--fingerprint {info.fingerprint}" not in problem.message  # nothing to paste blindly
    assert f"untrusted: {info.fingerprint}" in problem.message
    assert "published" in problem.message


def test_reproduce_md_records_no_local_key_path_or_program_path(tmp_path: Path) -> None:
    private, _ = make_key(tmp_path / "keys")
    run_dir = make_run_folder(tmp_path)
    run = json.loads((run_dir / "run.json").read_text())
    run["argv"] = [".venv/bin/difflab", "run", "--key", "/root/.config/sglang-difflab/publish-key.pem", "--no-cache"]
    (run_dir / "run.json").write_text(json.dumps(run))
    info = seal(run_dir, private, echo=lambda _m: None, environ={})
    text = (run_dir / layout.REPRODUCE).read_text()
    assert "publish-key.pem" not in text and "/root" not in text and ".venv" not in text
    assert "difflab run --no-cache" in text
    assert f"--fingerprint {info.fingerprint}" not in text  # the bundle's own claim is not a command to paste
    assert info.fingerprint in text


def test_the_published_reproduce_md_still_verifies_as_it_is() -> None:
    """The committed bundle's REPRODUCE.md is signed as it was written; it is not rewritten."""
    published = Path(__file__).resolve().parents[1] / "results" / "published" / "upstream"
    assert "publish-key.pem" in (published / layout.REPRODUCE).read_text()
    fingerprint = (published / layout.FINGERPRINT).read_text().strip()
    assert verify_path(published, trust.build(fingerprints=[fingerprint])).ok


def test_a_probe_without_a_probe_file_is_a_configuration_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    matrix = tmp_path / "m.toml"
    matrix.write_text((RELEASES + FIX).replace("pr38935_prefill_door", "pr38935_no_such_probe"))
    load_matrix(matrix)  # well-formed: the probe simply does not exist
    out = tmp_path / "out"
    assert main(["run", "--matrix", str(matrix), "--out", str(out), "--no-bundle", "--no-cache"]) == 2
    err = capsys.readouterr().err
    assert "fix '38935'.probes[0].name" in err and "pr38935_no_such_probe" in err and str(matrix) in err
    assert not out.exists()


def test_a_release_pin_must_be_an_sglang_wheel(tmp_path: Path) -> None:
    """A matrix (an unverified bundle's, say) cannot make the lab download and import another package."""
    matrix = tmp_path / "m.toml"
    matrix.write_text((RELEASES + FIX).replace("sglang-0.5.20-cp311", "evilpkg-0.5.20-cp311"))
    with pytest.raises(ConfigError, match=r"releases.'0.5.20'.file: .*sglang"):
        load_matrix(matrix)


# -- build and fork text is data ---------------------------------------------------------------------------

HOSTILE = (
    "boom <img src=x onerror=alert(1)> <a href='https://evil.example'>click</a> [link](https://evil.example) "
    "![pixel](https://evil.example/p.png) https://evil.example www.evil.example `code|cell` [/bold] "
    "[link=https://evil.example]here[/link] \x1b[31mred\x1b[0m"
)


def hostile_verdicts() -> list:
    from difflab.diff.verdict import FieldResult, FixVerdict, ProbeDiff

    field = FieldResult("field`|x", "expect", HOSTILE, ["<b>", "[x](y)"], HOSTILE, "b", False)
    probe = ProbeDiff("p", "error", HOSTILE, "", "", [field], None, None)
    base, head = {"label": "<i>0.5.20</i>"}, {"label": "[link=x]fork[/link]"}
    return [FixVerdict(38935, "38935", None, HOSTILE, "error", HOSTILE, False, base, head, [probe])]


def test_fork_text_in_summary_md_renders_as_text_not_html(tmp_path: Path) -> None:
    from markdown_it import MarkdownIt

    from difflab.report.markdown import render_summary

    text = render_summary(hostile_verdicts())
    html = MarkdownIt("commonmark").enable("table").render(text)
    for tag in ("<img", "<a ", "<a>", "<i>", "<b>"):
        assert tag not in html, f"{tag} rendered from build text"
    assert "&lt;img src=x onerror=alert(1)&gt;" in html  # shown, as the characters it is
    assert "\x1b" not in text and "\\x1b&#91;31m" in text
    rows = [line for line in text.splitlines() if line.startswith("| 38935")]
    assert len(rows) == 1 and rows[0].count("|") == 7  # no cell split by a pipe of the build's


def test_fork_text_on_the_terminal_is_printed_without_markup_or_escapes() -> None:
    from rich.console import Console

    from difflab.progress import Reporter

    console = Console(file=io.StringIO(), force_terminal=True, width=400, color_system=None)
    reporter = Reporter(console)
    reporter.say(HOSTILE)  # a stray [/bold] raised MarkupError here
    reporter.table(hostile_verdicts())
    shown = console.file.getvalue()  # type: ignore[attr-defined]
    assert "[/bold]" in shown and "[link=https://evil.example]here[/link]" in shown
    assert "\x1b]8;" not in shown  # no terminal hyperlink made from build text
    assert "\x1b[31m" not in shown and "\\x1b[31m" in shown


def test_esc_characters_in_fork_text_make_valid_junit_and_a_results_folder(tmp_path: Path) -> None:
    from junitparser import JUnitXml

    from difflab.report import write_reports

    write_reports(tmp_path, hostile_verdicts())
    suite = next(iter(JUnitXml.fromfile(str(tmp_path / "junit.xml"))))
    (case,) = list(suite)
    assert "\\x1b[31m" in case.result[0].message
    assert json.loads((tmp_path / "diff.json").read_text())["fixes"][0]["reason"] == HOSTILE
    assert (tmp_path / "summary.md").is_file()


def test_a_report_writer_that_fails_leaves_a_stand_in_and_the_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import difflab.report as report

    def broken(*_args: object, **_kw: object) -> None:
        raise RuntimeError("writer broke")

    monkeypatch.setattr(report, "write_summary", broken)
    report.write_reports(tmp_path, hostile_verdicts())
    assert "could not be written: RuntimeError: writer broke" in (tmp_path / "summary.md").read_text()
    assert (tmp_path / "junit.xml").is_file() and (tmp_path / "diff.json").is_file()


# -- a release's label is checked, not trusted --------------------------------------------------------------

LOCK_0_5_24 = """schema = 1
package = "sglang"

[releases."0.5.24"]
file = "sglang-0.5.22-cp311-cp311-manylinux_2_34_x86_64.whl"
sha256 = "{sha}"
first_seen = "2026-12-01"
"""


def test_a_lock_entry_whose_wheel_is_another_release_is_refused_naming_both(tmp_path: Path) -> None:
    from difflab.source.release_lock import load_lock

    lock = tmp_path / "releases.lock"
    lock.write_text(LOCK_0_5_24.format(sha="a" * 64))
    with pytest.raises(ConfigError) as caught:
        load_lock(lock)
    message = str(caught.value)
    assert "0.5.24" in message and "sglang-0.5.22-" in message and "release 0.5.22" in message
    assert caught.value.exit_code == 2


def test_a_release_whose_sglang_imports_as_another_version_is_refused_naming_both(tmp_path: Path) -> None:
    from dataclasses import dataclass

    from difflab.errors import SourceError
    from difflab.observation import Observation
    from difflab.progress import Reporter
    from difflab.source.base import MaterialisedSource
    from difflab.workflows.observe import observe

    @dataclass
    class Imports:
        """Answers every probe as if the build's ``sglang.__version__`` said ``version``."""

        version: str
        name: str = "fake"

        def describe(self) -> dict:
            return {"name": self.name}

        def run(self, jobs: list, on_done: object = None) -> list[Observation]:
            return [
                Observation(
                    fix=j.fix_id,
                    probe=j.probe,
                    side=j.side,
                    source=dict(j.source.identity),
                    status="ok",
                    sglang_version=self.version,
                )
                for j in jobs
            ]

    matrix = tmp_path / "m.toml"
    matrix.write_text(RELEASES + FIX)
    (fix,) = load_matrix(matrix).fixes

    def release(label: str) -> MaterialisedSource:
        ident = {"kind": "release", "version": label, "file": f"sglang-{label}-x.whl", "sha256": "0" * 64}
        return MaterialisedSource(label=label, kind="release", root=tmp_path, identity=ident, digest=label)

    sources = {("38935", "base"): release("0.5.20"), ("38935", "head"): release("0.5.21")}
    with pytest.raises(SourceError) as caught:
        observe([fix], sources, Imports("0.5.22"), tmp_path / "work", Reporter())  # type: ignore[arg-type]
    assert "release 0.5.20" in str(caught.value) and "version 0.5.22" in str(caught.value)
    assert caught.value.exit_code == 2
    observed = observe([fix], {("38935", "base"): release("0.5.20")}, Imports("0.5.20"), tmp_path / "w2", Reporter())  # type: ignore[arg-type]
    assert [o.sglang_version for o in observed] == ["0.5.20"]


# -- relative paths --------------------------------------------------------------------------------------


@pytest.mark.parametrize("spelling", [".", "./run", "run", "run/", "./run/../run"])
def test_verify_and_pack_take_a_relative_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], spelling: str
) -> None:
    priv, pub = make_key(tmp_path / "keys")
    run_dir, _info = sealed(tmp_path, priv)
    monkeypatch.chdir(run_dir if spelling == "." else tmp_path)
    assert main(["verify", spelling, "--key", str(pub)]) == 0
    assert f"OK {run_dir}" in capsys.readouterr().out
    archive = "../out.tar.gz" if spelling == "." else "out.tar.gz"
    assert main(["pack", spelling, "-o", archive]) == 0
    assert main(["verify", archive, "--key", str(pub)]) == 0
