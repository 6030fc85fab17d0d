"""Entry point that runs one probe module inside the shared SGLang environment.

``python -m difflab.probe.child PROBE_FILE OUT_JSON``

The materialised SGLang source is already on ``PYTHONPATH``. The child
installs the GPU-package stubs, imports the probe, calls ``observe(kit)``
and writes a raw result as JSON (atomically). A raised exception, a missing
fake attribute, an exception swallowed by SGLang or an unexpected logged
error turns the result into ``status = "error"`` with the reason; the parent
turns a crash or hang into an error of its own.

Standard library only, apart from the probe and SGLang.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from difflab.probe import stubs
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
    if len(argv) != 2:
        print("usage: python -m difflab.probe.child PROBE_FILE OUT_JSON", file=sys.stderr)
        return 2
    stubs.install()
    probe, out = Path(argv[0]), Path(argv[1])
    result = run_probe(probe)
    write_atomic(out, result)
    sys.stdout.flush()
    sys.stderr.flush()
    # Interpreter teardown with torch loaded costs ~1.5 s and proves nothing.
    os._exit(0)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
