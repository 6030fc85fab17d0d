"""Throughput runs: SGLang's ``bench_serving`` on GPUs, a small built-in load generator elsewhere.

Both end in the same place: one JSON line in ``bench_serving``'s ``--output-file``
format (``request_throughput``, ``output_throughput``, ``{mean,median,p99}_{ttft,itl,tpot}_ms``,
``completed``...), read back by :func:`read_result`, so the parser the GPU runs rely
on is the one the CPU tests exercise.
"""

from __future__ import annotations

import json
import random
import statistics
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from difflab.engine.client import EngineClient, StreamReply
from difflab.errors import DifflabError
from difflab.gpu.scenarios.base import FILLER

# metric -> higher is better; the A/B compares these per round
AB_METRICS: dict[str, bool] = {
    "request_throughput": True,
    "output_throughput": True,
    "median_ttft_ms": False,
    "median_itl_ms": False,
}
REQUIRED = ("completed", *AB_METRICS)


class BenchError(DifflabError):
    """A benchmark round produced no usable result."""

    exit_code = 1


@dataclass(frozen=True)
class BenchSpec:
    """One round's load (bench_serving ``random-ids`` dataset, fixed lengths)."""

    num_prompts: int = 200
    input_len: int = 1024
    output_len: int = 256
    max_concurrency: int = 32


@dataclass
class BenchResult:
    values: dict[str, float]
    completed: int
    raw: dict[str, Any]


def read_result(path: Path) -> BenchResult:
    """The last JSON line of a bench_serving output file (it appends one line per run)."""
    try:
        lines = [ln for ln in path.read_text().splitlines() if ln.strip()]
    except OSError as exc:
        raise BenchError(f"{path}: no benchmark output ({exc.strerror})") from None
    if not lines:
        raise BenchError(f"{path}: benchmark output is empty")
    try:
        raw = json.loads(lines[-1])
    except json.JSONDecodeError as exc:
        raise BenchError(f"{path}: last line is not JSON ({exc})") from None
    missing = [k for k in REQUIRED if not isinstance(raw.get(k), int | float)]
    if missing:
        raise BenchError(f"{path}: benchmark result lacks {', '.join(missing)}")
    values = {k: float(v) for k, v in raw.items() if isinstance(v, int | float) and not isinstance(v, bool)}
    return BenchResult(values=values, completed=int(raw["completed"]), raw=raw)


def bench_serving_argv(base_url: str, output_file: str, model: str, spec: BenchSpec, seed: int) -> list[str]:
    """The command a GPU round runs inside the side's own image (so client and server versions match)."""
    return [
        "python3",
        "-m",
        "sglang.bench_serving",
        "--backend",
        "sglang",
        "--base-url",
        base_url,
        "--dataset-name",
        "random-ids",
        "--model",
        model,
        "--num-prompts",
        str(spec.num_prompts),
        "--random-input-len",
        str(spec.input_len),
        "--random-output-len",
        str(spec.output_len),
        "--random-range-ratio",
        "1.0",
        "--max-concurrency",
        str(spec.max_concurrency),
        "--seed",
        str(seed),
        "--output-file",
        output_file,
    ]


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def summarize(replies: list[StreamReply], duration_s: float, spec: BenchSpec) -> dict[str, Any]:
    """bench_serving's summary fields from streamed replies (times in ms, throughputs per second)."""
    done = [r for r in replies if r.ok]
    ttfts = [r.ttft_s * 1000 for r in done if r.ttft_s is not None]
    itls = [x * 1000 for r in done for x in r.itl_s]
    tpots = [
        (r.elapsed_s - r.ttft_s) * 1000 / (r.completion_tokens - 1)
        for r in done
        if r.ttft_s is not None and r.completion_tokens > 1
    ]
    out_tokens = sum(r.completion_tokens for r in done)
    in_tokens = sum(r.prompt_tokens for r in done)
    duration_s = max(duration_s, 1e-9)
    result: dict[str, Any] = {
        "backend": "sglang",
        "dataset_name": "random-ids",
        "duration": duration_s,
        "completed": len(done),
        "total_input_tokens": in_tokens,
        "total_output_tokens": out_tokens,
        "request_throughput": len(done) / duration_s,
        "input_throughput": in_tokens / duration_s,
        "output_throughput": out_tokens / duration_s,
        "max_concurrency": spec.max_concurrency,
        "random_input_len": spec.input_len,
        "random_output_len": spec.output_len,
    }
    for name, values in (("ttft", ttfts), ("itl", itls), ("tpot", tpots)):
        result[f"mean_{name}_ms"] = statistics.fmean(values) if values else 0.0
        result[f"median_{name}_ms"] = statistics.median(values) if values else 0.0
        result[f"p99_{name}_ms"] = _percentile(values, 0.99)
    result["errors"] = [r.error for r in replies if not r.ok][:20]
    return result


def run_load(
    client: EngineClient, spec: BenchSpec, seed: int, output_file: Path, timeout_s: float = 60.0
) -> BenchResult:
    """Built-in load: ``num_prompts`` streamed requests, ``max_concurrency`` at a time (stdlib threads)."""
    rng = random.Random(seed)
    prompts = [" ".join(rng.choice(FILLER) for _ in range(spec.input_len)) for _ in range(spec.num_prompts)]
    replies: list[StreamReply] = []
    lock = threading.Lock()
    queue = list(reversed(prompts))

    def worker() -> None:
        while True:
            with lock:
                if not queue:
                    return
                prompt = queue.pop()
            reply = client.generate_stream(prompt, max_new_tokens=spec.output_len, timeout=timeout_s)
            with lock:
                replies.append(reply)

    start = time.monotonic()
    threads = [threading.Thread(target=worker, daemon=True) for _ in range(max(1, spec.max_concurrency))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s * spec.num_prompts)
    result = summarize(replies, time.monotonic() - start, spec)
    with output_file.open("a") as fh:
        fh.write(json.dumps(result) + "\n")
    return read_result(output_file)
