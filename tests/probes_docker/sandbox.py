"""What a probe process can reach: network, writable paths, limits (asserted by tests/test_docker_runner.py).

Stands in for any probe: it runs through the same ``difflab.probe.child`` as real probes,
imports the (test) ``sglang`` package from the source mount, and reports instead of asserting.
"""

from __future__ import annotations

import errno
import os
import socket
import sys
from pathlib import Path
from typing import Any


def _connect(host: str, port: int) -> str:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.settimeout(3)
    try:
        sock.connect((host, port))
        return "connected"
    except OSError as exc:
        return errno.errorcode.get(exc.errno or 0, type(exc).__name__)
    finally:
        sock.close()


def _write(folder: str) -> str:
    try:
        path = Path(folder) / ".difflab-write-test"
        path.write_text("x")
        path.unlink()
        return "written"
    except OSError as exc:
        return errno.errorcode.get(exc.errno or 0, type(exc).__name__)


def _read(path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return ""


def observe(kit: Any) -> dict[str, Any]:
    import sglang

    source = Path(sglang.__file__).resolve().parent.parent
    child = Path(sys.modules["difflab"].__file__).resolve().parent.parent
    net = sorted(os.listdir("/sys/class/net")) if os.path.isdir("/sys/class/net") else []
    return {
        "net.interfaces": net,
        "net.external": _connect("8.8.8.8", 53),
        "net.loopback_port_1": _connect("127.0.0.1", 1),
        "write.source": _write(str(source / "sglang")),
        "write.child": _write(str(child)),
        "write.probes": _write(str(Path(__file__).parent)),
        "write.rootfs": _write(sys.prefix),
        "write.tmp": _write("/tmp"),
        "write.cwd": _write(os.getcwd()),
        "limits.cpu_quota_us": _read("/sys/fs/cgroup/cpu/cpu.cfs_quota_us") or _read("/sys/fs/cgroup/cpu.max"),
        "limits.memory_bytes": _read("/sys/fs/cgroup/memory/memory.limit_in_bytes")
        or _read("/sys/fs/cgroup/memory.max"),
        "python.prefix": sys.prefix,
        "python.version": sys.version.split()[0],
        "env.pythonpath": os.environ.get("PYTHONPATH", ""),
    }
