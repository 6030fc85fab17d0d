"""JUnit XML, the one writer every command uses, so CI dashboards show each probe, mutation or test.

Commands map their own results to :class:`Case` (one line each); :func:`write_cases` is
the only place that talks to junitparser. :func:`write_junit` is the mapping for verdicts.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from junitparser import Error, Failure, JUnitXml, Skipped, TestCase, TestSuite

from difflab.diff.verdict import FixVerdict

OUTCOMES = ("passed", "failed", "error", "skipped")


@dataclass(frozen=True)
class Case:
    """One test case; ``kind`` is the failure's or error's ``type`` attribute."""

    classname: str
    name: str
    outcome: str = "passed"
    message: str = ""
    kind: str = ""
    time: float | None = None
    stdout: str | None = None
    stderr: str | None = None


_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ud800-\udfff\ufffe\uffff]")


def xml_text(text: str) -> str:
    """``text`` with what XML 1.0 cannot hold (ESC and the other control characters) written as escapes.

    A build's exception message is data: an ESC in it must neither stop the report nor colour a terminal.
    """
    return _NOT_XML.sub(
        lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100 else f"\\u{ord(m.group()):04x}", text
    )


def _case(raw: Case) -> TestCase:
    c = Case(
        **{
            k: xml_text(v) if isinstance(v, str) else v
            for k, v in ((f.name, getattr(raw, f.name)) for f in dataclasses.fields(raw))
        }
    )
    case = TestCase(name=c.name, classname=c.classname)
    if c.time is not None:
        case.time = round(c.time, 3)
    if c.outcome == "failed":
        case.result = [Failure(c.message, c.kind)]
    elif c.outcome == "error":
        case.result = [Error(c.message, c.kind)]
    elif c.outcome == "skipped":
        case.result = [Skipped(c.message)]
    elif c.outcome != "passed":
        raise ValueError(f"unknown JUnit outcome {c.outcome!r}")
    if c.stdout is not None:
        case.system_out = c.stdout
    if c.stderr is not None:
        case.system_err = c.stderr
    return case


def write_cases(path: Path, suite_name: str, cases: Iterable[Case]) -> None:
    """One suite holding ``cases``, written to ``path``."""
    suite = TestSuite(xml_text(suite_name))
    for c in cases:
        suite.add_testcase(_case(c))
    xml = JUnitXml()
    xml.add_testsuite(suite)
    path.parent.mkdir(parents=True, exist_ok=True)
    xml.write(str(path), pretty=True)


def verdict_cases(verdicts: list[FixVerdict]) -> Iterable[Case]:
    """One case per fix x probe: passes when the probe's own verdict is ``confirmed``."""
    for v in verdicts:
        if not v.probes and v.verdict == "unavailable" and v.expected_unavailable:
            yield Case(f"fix.{v.id}", "(no probes)", "skipped", v.reason)
        elif not v.probes:
            yield Case(f"fix.{v.id}", "(no probes)", "error", v.reason, "error")
        for p in v.probes:
            message = f"{p.verdict}: {p.reason}"
            if p.verdict == "confirmed":
                outcome, kind = "passed", ""
            elif p.verdict == "unavailable" and v.expected_unavailable:
                outcome, kind = "skipped", ""
            elif p.verdict == "error":
                outcome, kind = "error", "error"
            else:
                outcome, kind = "failed", p.verdict
            fields = (
                f"{f.kind} {f.field}: base={f.base!r} head={f.head!r} "
                f"declared={f.declared_base!r}->{f.declared_head!r} {'ok' if f.ok else 'MISMATCH'}"
                for f in p.fields
            )
            duration = sum(o.duration_s for o in (p.base, p.head) if o is not None)
            yield Case(f"fix.{v.id}", p.probe, outcome, message, kind, duration, "\n".join(fields))


def write_junit(path: Path, verdicts: list[FixVerdict], suite_name: str) -> None:
    write_cases(path, suite_name, verdict_cases(verdicts))
