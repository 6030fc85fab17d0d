"""``junit.xml``: one test case per fix x probe, so CI dashboards show each probe."""

from __future__ import annotations

from pathlib import Path

from junitparser import Error, Failure, JUnitXml, Skipped, TestCase, TestSuite

from difflab.diff.verdict import FixVerdict


def write_junit(path: Path, verdicts: list[FixVerdict], suite_name: str = "difflab") -> None:
    suite = TestSuite(suite_name)
    for v in verdicts:
        if not v.probes:
            case = TestCase(name="(no probes)", classname=f"fix.{v.id}")
            case.result = [Error(v.reason, "error")]
            suite.add_testcase(case)
            continue
        for p in v.probes:
            case = TestCase(name=p.probe, classname=f"fix.{v.id}")
            duration = sum(o.duration_s for o in (p.base, p.head) if o is not None)
            case.time = round(duration, 3)
            message = f"{p.verdict}: {p.reason}"
            if p.verdict == "confirmed":
                pass
            elif p.verdict == "unavailable" and v.expected_unavailable:
                case.result = [Skipped(message)]
            elif p.verdict == "error":
                case.result = [Error(message, "error")]
            else:
                case.result = [Failure(message, p.verdict)]
            case.system_out = "\n".join(
                f"{f.kind} {f.field}: base={f.base!r} head={f.head!r} "
                f"declared={f.declared_base!r}->{f.declared_head!r} {'ok' if f.ok else 'MISMATCH'}"
                for f in p.fields
            )
            suite.add_testcase(case)
    xml = JUnitXml()
    xml.add_testsuite(suite)
    xml.write(str(path), pretty=True)
