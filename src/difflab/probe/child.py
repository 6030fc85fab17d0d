"""Entry point that runs one probe module inside the shared SGLang environment.

``python -m difflab.probe.child PROBE_FILE OUT_JSON [TIMEOUT_S]``

Started with only the lab's package on ``PYTHONPATH``; the materialised SGLang source
(``$DIFFLAB_SOURCE_ROOT``) goes on ``sys.path`` behind it once this process leads its own
session, is a subreaper and has hidden the lab's secrets from itself
(:func:`difflab.probe.process.enter_box`). This process supervises
(:func:`difflab.probe.process.supervise`): it forks the probe process into a session of its own,
which installs the GPU-package stubs, imports the probe, calls ``observe(kit)`` and writes a raw
result as JSON (atomically); at the timeout, or when the probe ends, its session and anything
that escaped it are killed. A raised exception, a missing fake attribute, an exception swallowed
by SGLang or an unexpected logged error turns the result into ``status = "error"`` with the
reason; the parent turns a crash or hang into an error of its own.

Standard library only, apart from the probe and SGLang.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from difflab.probe import process, stubs
from difflab.probe.kit import Kit, MissingFakeAttribute, NotApplicable


def load_probe(path: Path, entry: str = "observe") -> Any:
    """Import a probe module from its file; its folder goes on ``sys.path`` for shared helpers.

    ``entry`` is the function it must define: ``observe(kit)``, or ``workloads(kit)`` for a
    throughput probe.
    """
    sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location(f"difflab_probe_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load probe {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not callable(getattr(module, entry, None)):
        raise ImportError(f"probe {path} defines no {entry}(kit) function")
    return module


def _jsonable(value: Any, where: str) -> Any:
    try:
        json.dumps(value)
    except TypeError as exc:
        raise TypeError(f"field {where!r} is not JSON-serialisable: {exc}") from None
    return value


def run_probe(path: Path, kit: Kit | None = None) -> dict[str, Any]:
    """Run one probe in this process and return its raw result."""
    kit = kit or Kit()
    started = time.perf_counter()
    result: dict[str, Any] = {"status": "ok", "fields": {}, "error": None, "sglang_version": None}
    try:
        module = load_probe(path)
        with kit.capture_logs():
            fields = module.observe(kit)
        if not isinstance(fields, dict):
            raise TypeError(f"observe() returned {type(fields).__name__}, expected dict")
        result["fields"] = {str(k): _jsonable(v, str(k)) for k, v in sorted(fields.items())}
    except NotApplicable as exc:
        result["status"] = "n/a"
        result["error"] = f"not applicable: {exc}"
    except MissingFakeAttribute as exc:
        result["status"] = "error"
        result["error"] = f"probe fake incomplete: {exc}"
    except BaseException as exc:  # the probe, or SGLang under it, failed
        if isinstance(exc, KeyboardInterrupt):
            raise
        result["status"] = "error"
        result["error"] = "".join(traceback.format_exception(exc)).strip()
    try:
        result["sglang_version"] = kit.sglang_version
    except Exception:  # sglang never imported: the error above says why
        result["sglang_version"] = None
    problems = kit.problems()
    if problems and result["status"] == "ok":
        result["status"] = "error"
        result["error"] = "observation not trustworthy: " + "; ".join(p.splitlines()[0] for p in problems)
    result["problems"] = problems
    result["events"] = kit.events
    result["defaults"] = kit.defaults
    result["forced"] = kit.forced
    result["fallbacks"] = kit.fallbacks
    result["duration_s"] = round(time.perf_counter() - started, 6)
    return result


def write_atomic(path: Path, payload: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".part")
    tmp.write_text(json.dumps(payload, indent=2, sort_keys=True, default=str) + "\n")
    os.replace(tmp, path)


def main(argv: list[str]) -> int:
    """Supervise one probe process: it runs in a session of its own, and nothing it starts outlives it.

    The outcome (exit code or signal, timed out, strays ended) goes to ``OUT_JSON.ended.json``.
    """
    if len(argv) not in (2, 3):
        print("usage: python -m difflab.probe.child PROBE_FILE OUT_JSON [TIMEOUT_S]", file=sys.stderr)
        return 2
    process.enter_box()
    probe, out = Path(argv[0]), Path(argv[1])
    timeout_s = float(argv[2]) if len(argv) == 3 else None
    process.die_with_parent(signal.SIGTERM)  # the lab went: end the probe and what it started

    def run() -> None:
        stubs.install()
        write_atomic(out, run_probe(probe))

    ended = process.supervise(run, timeout_s)
    write_atomic(ended_path(out), ended.to_dict())
    sys.stdout.flush()
    sys.stderr.flush()
    # The probe's own exit status, as a shell reports it (a container's exit code is this one's).
    os._exit(ended.exit if ended.exit is not None else 128 + (ended.signal or 0))


def ended_path(out: Path) -> Path:
    """Where the supervisor says how the probe process ended (beside its result)."""
    return out.with_name(out.name + ".ended.json")


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
