"""The image's smoke test: the same modules imported in the image and in the host environment.

Every difference is fatal, so an image that builds but cannot import what the probes need
never runs a probe.
"""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any

from difflab.environment.shared import SharedEnvironment
from difflab.errors import EnvironmentSetupError
from difflab.image.catalog import DifflabImage

SMOKE_MODULES = (
    "ssl",
    "sqlite3",
    "ctypes",
    "lzma",
    "bz2",
    "zlib",
    "hashlib",
    "decimal",
    "uuid",
    "multiprocessing",
    "numpy",
    "torch",
    "zmq",
    "PIL.Image",
    "tokenizers",
    "sentencepiece",
    "pydantic",
    "orjson",
    "msgspec",
    "psutil",
    "setproctitle",
    "pybase64",
    "aiohttp",
    "uvicorn",
    "fastapi",
    "yaml",
    "regex",
    "safetensors",
    "xgrammar",
    "tvm_ffi",
    "transformers",
    "openai",
    "einops",
    "gguf",
    "compressed_tensors",
)
"""Imported once in the host environment and once in the image: the two must fail alike."""

_SMOKE = """
import importlib, json, sys
out = {}
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
        out[name] = "ok"
    except BaseException as exc:
        text = str(exc).splitlines()[0][:200] if str(exc) else ""
        out[name] = type(exc).__name__ + (": " + text if text else "")
import torch
out["torch.sum"] = float(torch.arange(4.0).sum())
print("DIFFLAB-SMOKE " + json.dumps(out, sort_keys=True))
"""


def smoke_results(output: str) -> dict[str, Any]:
    for line in output.splitlines():
        if line.startswith("DIFFLAB-SMOKE "):
            return dict(json.loads(line[len("DIFFLAB-SMOKE ") :]))
    raise EnvironmentSetupError(f"smoke test printed no result:\n{output[-2000:]}")


def verify_image(client: Any, image: DifflabImage, env: SharedEnvironment | None = None) -> dict[str, Any]:
    """Import the same modules in the image as in the host environment; every difference is fatal.

    The host side runs at the same time as the container (each is one busy core for ~15 s).
    """
    import docker.errors

    quiet = {"PYTHONDONTWRITEBYTECODE": "1", "CUDA_VISIBLE_DEVICES": ""}
    host_proc = None
    if env is not None and env.ready:
        host_proc = subprocess.Popen(
            [str(env.python), "-c", _SMOKE, *SMOKE_MODULES],
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env={**os.environ, **quiet},
        )
    try:
        out = client.containers.run(
            image.id,
            [image.python, "-c", _SMOKE, *SMOKE_MODULES],
            network_mode="none",
            remove=True,
            stdout=True,
            stderr=True,
            environment=quiet,
        )
    except docker.errors.ContainerError as exc:
        err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else str(exc.stderr)
        raise EnvironmentSetupError(f"docker image {image.ref}: the interpreter does not run:\n{err[-2000:]}") from None
    finally:
        host_out = host_proc.communicate()[0] if host_proc is not None else None
    inside = smoke_results(out.decode(errors="replace"))
    if host_out is not None:
        host = smoke_results(host_out)
        diff = {
            k: (host.get(k), inside.get(k))
            for k in sorted(set(host) | set(inside))
            if (host.get(k) == "ok") != (inside.get(k) == "ok") or k == "torch.sum" and host.get(k) != inside.get(k)
        }
        if diff:
            lines = "\n".join(f"  {k}: host {h!r}, image {i!r}" for k, (h, i) in diff.items())
            raise EnvironmentSetupError(f"docker image {image.ref} differs from the host environment:\n{lines}")
    return inside
