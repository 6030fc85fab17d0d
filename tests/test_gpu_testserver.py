"""The test server itself: a paged pool that never zeroes pages, loopback-only front ends, SGLang shapes."""

from __future__ import annotations

import pytest

from difflab.engine.client import EngineClient, EngineError
from difflab.testing.testserver import TestDeployment, TestServerConfig, head_config
from difflab.testing.testserver.engine import respond
from difflab.testing.testserver.pool import PagedKVPool


def test_pool_never_zeroes_and_reuses_the_last_freed_page_first():
    pool = PagedKVPool(64, 4)
    a = pool.alloc(8)
    pool.write_span(a, ["A-1", "x", "y", "z", "w", "v", "u", "A-2"])
    assert pool.used_tokens == 8
    pool.free(a)
    assert pool.used_tokens == 0
    b = pool.alloc(8)
    assert b == list(reversed(a))  # stack: the most recently freed page comes back first
    assert pool.read(b, 8) == ["w", "v", "u", "A-2", "A-1", "x", "y", "z"]  # stale, not zeroed


def test_pinned_pages_stay_in_use_after_every_owner_frees_them():
    pool = PagedKVPool(32, 4)
    pages = pool.alloc(8)
    pool.free(pages)
    pool.pin(pages)  # a phantom re-registers pages that were already free
    assert pool.used_tokens == 8
    assert pool.alloc(32) is None  # they are no longer available
    other = pool.alloc(24)
    assert other is not None and not set(other) & set(pages)


def test_pool_refuses_what_it_cannot_hold():
    with pytest.raises(ValueError):
        PagedKVPool(3, 4)
    assert PagedKVPool(16, 4).alloc(17) is None


def test_model_repeats_code_words_then_pads():
    assert respond(["CANARY-a-001-S", "the", None, "fox", "X-1"], 4) == [
        "CANARY-a-001-S",
        "X-1",
        "the",
        "fox",
    ]
    assert respond([None, None], 2) == ["...", "..."]


def test_front_ends_bind_loopback_only_and_stop_cleanly():
    dep = TestDeployment(head_config()).start()
    try:
        for role in ("prefill", "decode", "router"):
            assert dep.url(role).startswith("http://127.0.0.1:")
        urls = (dep.prefill_url, dep.decode_url, dep.router_url)
    finally:
        dep.stop()
    assert not EngineClient(urls[2], timeout_s=1).health(timeout=1)  # nothing left listening


def test_endpoints_answer_in_sglang_shapes():
    with TestDeployment(head_config()) as dep:
        prefill, router = EngineClient(dep.prefill_url), EngineClient(dep.router_url)
        info = prefill.server_info()
        assert info["disaggregation_mode"] == "prefill" and info["max_total_num_tokens"] == 1024
        assert prefill.model_info()["model_path"] == "Qwen/Qwen3-0.6B"
        metrics = EngineClient(dep.decode_url).metrics()
        assert metrics.minimum("sglang:max_total_num_tokens") == 8192 and metrics.has("sglang:context_len")
        reply = router.generate("hello world", max_new_tokens=3, rid="r-1")
        assert reply.ok and reply.meta()["id"] == "r-1" and reply.meta()["completion_tokens"] == 3
        assert prefill.generate("x", max_new_tokens=1).status == 400  # PD engines take requests via the router
        assert router.get("/metrics").status == 404
        assert prefill.abort_request("no-such-rid").body == {"success": True, "aborted": 0}
        too_long = router.generate("w " * 2040, max_new_tokens=16)
        assert too_long.status == 400 and "context length" in too_long.excerpt()


def test_model_info_path_falls_back_for_older_engines():
    old = TestServerConfig(model_info_paths=("/get_model_info",), server_info_paths=("/get_server_info",))
    with TestDeployment(old) as dep:
        client = EngineClient(dep.decode_url)
        assert client.model_info()["is_generation"] is True and client.model_info_path == "/get_model_info"
        assert client.server_info()["disaggregation_mode"] == "decode"
        assert client.server_info_path == "/get_server_info"
    with TestDeployment(TestServerConfig()) as dep:
        client = EngineClient(dep.decode_url)
        client.model_info()
        assert client.model_info_path == "/model_info"
    with (
        TestDeployment(TestServerConfig(model_info_paths=())) as dep,
        pytest.raises(EngineError, match=r"no model info \(/model_info -> 404; /get_model_info -> 404\)"),
    ):
        EngineClient(dep.decode_url).model_info()


def test_client_reports_timeouts_and_refused_connections():
    with TestDeployment(head_config(admit_rejected=True, rejected_hang_s=5.0)) as dep:
        url = dep.router_url
        reply = EngineClient(url).generate("w " * 1500, max_new_tokens=8, timeout=0.3)
        assert reply.status == 0 and reply.timed_out and 0.25 < reply.elapsed_s < 3.0
    refused = EngineClient(url).get("/health", timeout=1)
    assert refused.status == 0 and "ConnectionRefusedError" in (refused.error or "")
    with pytest.raises(EngineError, match="expected an http://HOST:PORT URL"):
        EngineClient("ftp://example")


def test_streaming_times_each_token():
    with TestDeployment(head_config(decode_token_s=0.005)) as dep:
        s = EngineClient(dep.router_url).generate_stream("A-1 b c", max_new_tokens=6)
    assert s.ok and s.completion_tokens == 6 and s.prompt_tokens == 3
    assert len(s.itl_s) == 5  # one arrival per token, none for the closing chunk
    assert sum(s.itl_s) > 5 * 0.005 * 0.8  # tokens arrive as they are made, not in one burst at the end
    assert s.ttft_s is not None and s.ttft_s >= 0.09  # the KV transfer happens before the first token


@pytest.mark.parametrize("checksum", ["0", "1"])
def test_late_write_lands_in_the_next_request_unless_the_checksum_catches_it(checksum):
    """Pre-fix abort: A's pages are freed while A's write is in flight; B takes them, A's tail lands in B."""
    import threading
    import time

    from difflab.engine import names
    from difflab.gpu.scenarios.base import canary_prompt

    env = {names.DEFERRED_ENV: "0", names.CHECKSUM_ENV: checksum}
    cfg = head_config(transfer_s=0.8).with_env("prefill", **env).with_env("decode", **env)  # 0.2 s per page
    with TestDeployment(cfg) as dep:
        router, decode = EngineClient(dep.router_url), EngineClient(dep.decode_url)
        first = threading.Thread(
            target=router.generate,
            args=(canary_prompt("aaaaaa", 1, 60),),
            kwargs={"max_new_tokens": 4, "rid": "A"},
            daemon=True,
        )
        first.start()
        time.sleep(0.12)
        assert decode.abort_request("A").body["aborted"] == 1
        victim = router.generate(canary_prompt("bbbbbb", 2, 60), max_new_tokens=8, rid="B")
        first.join(5)
        stats = dict(dep.engine.stats)
    assert stats["late_writes"] == 1
    if checksum == "0":
        assert victim.ok and "CANARY-aaaaaa-001-E" in victim.text()  # another tenant's marker: a leak
    else:
        assert victim.status == 500 and "KV checksum mismatch" in victim.excerpt()
        assert stats["checksum_mismatches"] == 1
