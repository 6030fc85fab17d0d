"""Metrics parsing (prometheus_client's parser), on text shaped like SGLang's /metrics and on
text prometheus_client itself writes; the test server's renderer round-trips through it."""

from __future__ import annotations

import math

import pytest

from difflab.engine.metrics import MetricsParseError, parse, render_sample

L = 'engine_type="decode",model_name="Qwen/Qwen3-0.6B",moe_ep_rank="0",pp_rank="0"'  # SGLang's label set
SGLANG_LIKE = f"""\
# HELP sglang:max_total_num_tokens Maximum total number of tokens in the KV cache pool.
# TYPE sglang:max_total_num_tokens gauge
sglang:max_total_num_tokens{{{L},tp_rank="0"}} 8192.0
sglang:max_total_num_tokens{{{L},tp_rank="1"}} 8176.0
# HELP sglang:num_used_tokens The number of used tokens.
# TYPE sglang:num_used_tokens gauge
sglang:num_used_tokens{{{L},tp_rank="0"}} 48.0
sglang:num_used_tokens{{{L},tp_rank="1"}} 16.0
# HELP sglang:decode_deferred_kv_release Deferred decode KV releases by outcome.
# TYPE sglang:decode_deferred_kv_release counter
sglang:decode_deferred_kv_release_total{{{L},outcome="drained",tp_rank="0"}} 7.0
sglang:decode_deferred_kv_release_created{{{L},outcome="drained",tp_rank="0"}} 1.7e+09
sglang:decode_deferred_kv_release_total{{{L},outcome="timeout",tp_rank="0"}} 2.0
sglang:decode_deferred_kv_release_total{{{L},outcome="timeout",tp_rank="1"}} 1.0
# HELP sglang:e2e_request_latency_seconds Histogram of end-to-end request latency
# TYPE sglang:e2e_request_latency_seconds histogram
sglang:e2e_request_latency_seconds_bucket{{le="0.1",model_name="m"}} 3.0
sglang:e2e_request_latency_seconds_bucket{{le="+Inf",model_name="m"}} 9.0
sglang:e2e_request_latency_seconds_sum{{model_name="m"}} 12.5 1700000000000
sglang:spec_accept_rate{{model_name="m"}} NaN
python_gc_objects_collected_total{{generation="0"}} 1234.0
"""


def test_parses_gauges_counters_histograms_and_timestamps():
    m = parse(SGLANG_LIKE)
    assert m.types["sglang:max_total_num_tokens"] == "gauge"
    assert m.types["sglang:decode_deferred_kv_release"] == "counter"
    assert m.minimum("sglang:max_total_num_tokens") == 8176.0  # the weakest rank decides capacity
    assert m.total("sglang:num_used_tokens") == 64.0
    assert m.total("sglang:num_used_tokens", tp_rank="1") == 16.0
    assert m.by_label("sglang:decode_deferred_kv_release_total", "outcome") == {
        "drained": 7.0,
        "timeout": 3.0,
    }
    assert m.find("sglang:e2e_request_latency_seconds_bucket", le="+Inf")[0].value == 9.0
    assert m.total("sglang:e2e_request_latency_seconds_sum") == 12.5  # trailing timestamp ignored
    assert math.isnan(m.find("sglang:spec_accept_rate")[0].value)
    assert m.minimum("sglang:spec_accept_rate") is None  # NaN is no capacity
    assert m.total("sglang:not_exposed") is None and not m.has("sglang:not_exposed")


def test_label_escapes_and_round_trip():
    line = render_sample("x", [("path", 'a "quoted"\\back\nslash')], 2.5)
    assert line == 'x{path="a \\"quoted\\"\\\\back\\nslash"} 2.5'
    (sample,) = parse(line).samples
    assert sample.label("path") == 'a "quoted"\\back\nslash'
    assert parse(render_sample("y", [], math.inf)).samples[0].value == math.inf
    assert parse("z{} -Inf\n").samples[0].value == -math.inf


def test_label_values_may_hold_spaces_commas_and_braces():
    (s,) = parse('m{a="x, y} z",b="2"} 1\n').samples
    assert dict(s.labels) == {"a": "x, y} z", "b": "2"}


def test_parses_what_prometheus_client_writes():
    """SGLang exposes through prometheus_client: its own output (counters, _created, histograms) parses back."""
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

    reg = CollectorRegistry()
    labels = ["engine_type", "tp_rank"]
    used = Gauge("sglang:num_used_tokens", "used", labels, registry=reg)
    used.labels("decode", "0").set(48)
    used.labels("decode", "1").set(16)
    released = Counter("sglang:decode_deferred_kv_release", "releases", [*labels, "outcome"], registry=reg)
    released.labels("decode", "0", "drained").inc(7)
    released.labels("decode", "1", "timeout").inc(2)
    latency = Histogram("sglang:e2e_request_latency_seconds", "e2e", registry=reg, buckets=(0.1, 1.0))
    latency.observe(0.05)
    latency.observe(0.5)
    m = parse(generate_latest(reg).decode())
    assert m.total("sglang:num_used_tokens") == 64.0 and m.minimum("sglang:num_used_tokens") == 16.0
    assert m.types["sglang:decode_deferred_kv_release"] == "counter"
    assert m.by_label("sglang:decode_deferred_kv_release_total", "outcome") == {"drained": 7.0, "timeout": 2.0}
    assert m.has("sglang:decode_deferred_kv_release_created")
    assert m.find("sglang:e2e_request_latency_seconds_bucket", le="1.0")[0].value == 2.0
    assert m.total("sglang:e2e_request_latency_seconds_count") == 2.0


@pytest.mark.parametrize(
    "bad, where",
    [
        ("9bad 1", "line 1: invalid metric name"),
        ("m{a=1} 2", "line 1: Invalid labels"),
        ('m{a="1" 2', "line 1: could not convert"),
        ('m{a="1"}', "line 1: could not convert"),
        ('ok 1\n# HELP m x\nm{a="x"} one', "line 3: could not convert string to float: 'one'"),
    ],
)
def test_errors_name_the_line(bad, where):
    with pytest.raises(MetricsParseError, match=where.replace("(", r"\(").replace("{", r"\{")):
        parse(bad)
