"""Benchmark results: bench_serving's JSONL format, the built-in load generator, the interleaved A/B."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from difflab.engine.client import StreamReply
from difflab.gpu.bench import BenchError, BenchSpec, bench_serving_argv, read_result, summarize
from difflab.gpu.scenarios.throughput import THROUGHPUT, run_ab
from difflab.gpu.targets import TestServerTarget
from difflab.gpu.verdicts import judge_throughput
from difflab.matrix import load_matrix
from difflab.matrix.gpu import load_gpu_plans
from difflab.matrix.model import Fix, SidePin
from difflab.observation import Observation
from difflab.paths import default_matrix
from difflab.testing.testserver import head_config

# One line as sglang.bench_serving appends it to --output-file (fields as in its result dict).
BENCH_LINE = {
    "backend": "sglang",
    "dataset_name": "random-ids",
    "request_rate": "inf",
    "max_concurrency": 32,
    "duration": 41.7,
    "completed": 200,
    "total_input_tokens": 204800,
    "total_output_tokens": 51200,
    "request_throughput": 4.796,
    "input_throughput": 4911.3,
    "output_throughput": 1227.8,
    "mean_e2e_latency_ms": 6421.0,
    "median_e2e_latency_ms": 6398.2,
    "mean_ttft_ms": 311.9,
    "median_ttft_ms": 280.4,
    "std_ttft_ms": 80.2,
    "p99_ttft_ms": 610.3,
    "mean_tpot_ms": 23.9,
    "median_tpot_ms": 23.7,
    "std_tpot_ms": 1.1,
    "p99_tpot_ms": 27.0,
    "mean_itl_ms": 23.9,
    "median_itl_ms": 21.5,
    "std_itl_ms": 9.8,
    "p99_itl_ms": 61.0,
    "concurrency": 30.8,
}


def test_reads_the_last_line_of_a_bench_serving_file(tmp_path: Path):
    path = tmp_path / "x.jsonl"
    path.write_text(json.dumps({**BENCH_LINE, "completed": 1}) + "\n" + json.dumps(BENCH_LINE) + "\n\n")
    result = read_result(path)
    assert result.completed == 200
    assert result.values["output_throughput"] == pytest.approx(1227.8)
    assert "backend" not in result.values  # numbers only


@pytest.mark.parametrize(
    "content, message",
    [
        (None, "no benchmark output"),
        ("", "empty"),
        ("{not json\n", "not JSON"),
        (json.dumps({"completed": 3, "request_throughput": 1.0}) + "\n", "lacks output_throughput"),
    ],
)
def test_unusable_results_say_why(tmp_path: Path, content, message):
    path = tmp_path / "x.jsonl"
    if content is not None:
        path.write_text(content)
    with pytest.raises(BenchError, match=message):
        read_result(path)


def test_bench_serving_command_line():
    argv = bench_serving_argv(
        "http://127.0.0.1:8000",
        "/bench/base-round0.jsonl",
        "Qwen/Qwen3-0.6B",
        BenchSpec(num_prompts=50, input_len=512, output_len=128, max_concurrency=8),
        7,
    )
    assert argv[:3] == ["python3", "-m", "sglang.bench_serving"]
    pairs = dict(zip(argv[3::2], argv[4::2], strict=True))
    assert pairs["--backend"] == "sglang" and pairs["--dataset-name"] == "random-ids"
    assert pairs["--base-url"] == "http://127.0.0.1:8000" and pairs["--output-file"] == "/bench/base-round0.jsonl"
    assert (pairs["--num-prompts"], pairs["--random-input-len"], pairs["--seed"]) == ("50", "512", "7")


def test_summary_uses_bench_serving_field_names():
    replies = [
        StreamReply(200, "a b", ttft_s=0.1, itl_s=[0.01, 0.03], elapsed_s=0.14, completion_tokens=3, prompt_tokens=10),
        StreamReply(500, error="boom"),
    ]
    s = summarize(replies, 2.0, BenchSpec())
    assert s["completed"] == 1 and s["request_throughput"] == 0.5 and s["output_throughput"] == 1.5
    assert s["median_ttft_ms"] == pytest.approx(100.0) and s["median_itl_ms"] == pytest.approx(20.0)
    assert s["errors"] == ["boom"]


FIX = Fix(
    id="41404",
    pr=41404,
    title="t",
    base=SidePin(release="0.5.20"),
    head=SidePin(release="0.5.21"),
    probes=load_gpu_plans(load_matrix(default_matrix()))["41404"].probes,
)


def _judge(ab):
    obs = {
        s: Observation(fix="41404", probe=THROUGHPUT, side=s, source={}, status="ok", fields=ab.side_fields(s))
        for s in ("base", "head")
    }
    return judge_throughput(FIX, ab, obs["base"], obs["head"], {"label": "b"}, {"label": "h"}), obs


def test_interleaved_ab_detects_a_slower_head(tmp_path: Path):
    spec = BenchSpec(num_prompts=2, input_len=16, output_len=6, max_concurrency=2)
    base = TestServerTarget("base", head_config(transfer_s=0.02, decode_token_s=0.0005), spec, 1)
    head = TestServerTarget("head", head_config(transfer_s=0.02, decode_token_s=0.01), spec, 1)
    ab = run_ab({"base": base, "head": head}, rounds=4, out_dir=tmp_path, seed=3)
    assert [r.side for r in ab.rounds] == ["base", "head"] * 4  # A B A B ...
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        f"{s}-round{r}.jsonl" for r in range(4) for s in ("base", "head")
    )
    itl = ab.comparisons["median_itl_ms"]
    assert itl.regression and itl.rel_diff > 2.0
    assert "median_itl_ms" in ab.regressions
    verdict, obs = _judge(ab)
    assert verdict.verdict == "control-drift" and "median_itl_ms" in verdict.reason
    assert obs["head"].fields["throughput.no_significant_regression"] is False
    assert len(obs["base"].fields["throughput.median_itl_ms"]) == 4


def test_failed_rounds_make_an_error_verdict(tmp_path: Path):
    class Broken:
        def bench(self, round_index, output_file):
            raise BenchError("container exited 1")

    ab = run_ab({"base": Broken(), "head": Broken()}, rounds=2, out_dir=tmp_path, seed=1)
    assert ab.error and "container exited 1" in ab.error
    verdict, _ = _judge(ab)
    assert verdict.verdict == "error" and not verdict.passed
