"""Every GPU-tier detector fires with its pre-fix behaviour switched on and stays quiet with it off.

Each pre-fix switch is turned on alone, so a detector is shown to respond to its own
bug and not to another's.
"""

from __future__ import annotations

import pytest

from difflab.engine import names
from difflab.gpu.scenarios import (
    AbortStorm,
    CanaryLeak,
    Endpoints,
    Limits,
    OversizedPrompt,
    ScenarioUnavailable,
)
from difflab.testing.testserver import TestDeployment, TestServerConfig, head_config

pytestmark = pytest.mark.xdist_group("gpu-testserver")  # timing-sensitive: one worker, one at a time

LIMITS = Limits(
    request_timeout_s=10.0,
    at_once_s=1.0,
    settle_s=0.6,
    poll_s=0.02,
    abort_stagger_s=0.02,
    abort_delays_s=(0.0, 0.02, 0.04, 0.06, 0.08, 0.1, 0.12, 0.14),
)
NO_DEFERRED = {names.DEFERRED_ENV: "0"}


def run(scenario, config: TestServerConfig, limits: Limits = LIMITS):
    with TestDeployment(config) as dep:
        outcome = scenario.run(Endpoints.from_urls(dep.router_url, dep.prefill_url, dep.decode_url, 10.0), limits)
        return outcome, dict(dep.engine.stats)


# -- oversized prompt (#38935) ------------------------------------------------------------------------
def test_oversized_prompt_rejected_at_once_when_fixed():
    out, stats = run(OversizedPrompt(), head_config())
    f = out.fields
    assert f["oversized.rejected_at_once"] is True and f["oversized.status"] == 400
    assert f["oversized.pool_tokens"] < f["oversized.prompt_tokens_target"] < f["oversized.context_len"]
    assert f["oversized.control_ok"] and f["oversized.calibrated"] and stats["rejected_at_intake"] == 1


def test_oversized_prompt_handed_off_with_a_strangers_text():
    out, stats = run(OversizedPrompt(), head_config(admit_rejected=True))
    assert out.fields["oversized.status"] == 200 and out.fields["oversized.outcome"] == "accepted"
    assert out.fields["oversized.rejected_at_once"] is False and stats["stale_handoffs"] == 1
    assert "CANARY-" in out.problems[0]  # the answer is another request's text, markers included


def test_oversized_prompt_that_hangs_is_a_timeout_not_a_rejection():
    limits = Limits(**{**LIMITS.__dict__, "request_timeout_s": 0.8})
    out, _ = run(OversizedPrompt(), head_config(admit_rejected=True, rejected_hang_s=3.0), limits)
    assert out.fields["oversized.outcome"] == "timeout" and out.fields["oversized.rejected_at_once"] is False


def test_oversized_prompt_needs_a_pool_below_the_context():
    with pytest.raises(ScenarioUnavailable, match="not smaller than the context length"):
        run(OversizedPrompt(), TestServerConfig())  # pool 4096 >= context 2048


# -- canary markers (#38935 stale pages) ---------------------------------------------------------------
def test_canary_clean_when_fixed():
    out, _ = run(CanaryLeak(), head_config())
    f = out.fields
    assert f["canary.leak_seen"] is False and f["canary.leaks"] == 0 and f["canary.short_requests_ok"]
    assert f["canary.long_statuses"] == [200, 200, 400, 400]  # below the pool served, above rejected


def test_canary_catches_stale_pages():
    out, _ = run(CanaryLeak(), head_config(admit_rejected=True))
    f = out.fields
    assert f["canary.leak_seen"] is True and f["canary.short_requests_ok"]
    leaking = [e for e in out.events if e["foreign_markers"]]
    assert leaking and all(e["kind"] == "long" and e["tokens"] > f["canary.pool_tokens"] for e in leaking)


# -- abort storm (#36988 prefill leak, #41404 deferred release) -------------------------------------
STORM = {"transfer_s": 0.25}  # every abort delay lands inside the write, even on a busy machine


def test_abort_storm_leaves_engines_whole_when_fixed():
    out, stats = run(AbortStorm(), head_config(**STORM))
    f = out.fields
    assert stats["aborts_mid_transfer"] >= 1  # the storm did hit in-flight transfers
    assert f["abort.prefill_kv_back_to_baseline"] and f["abort.decode_kv_back_to_baseline"]
    assert f["abort.no_phantom_running"] and f["abort.phantom_running"] == 0
    assert f["abort.deferred_metric_seen"] and f["abort.deferred_outcomes"]["drained"] == stats["aborts_mid_transfer"]
    assert f["abort.deferred_errors"] == 0 and f["abort.leak_seen"] is False and f["abort.followup_ok"]


def test_abort_storm_without_deferred_release_leaks_decode_pages_and_phantoms():
    cfg = head_config(deferred_metric=False).with_env("decode", **NO_DEFERRED).with_env("prefill", **NO_DEFERRED)
    out, stats = run(AbortStorm(), cfg)
    f = out.fields
    assert stats["late_writes"] >= 1
    assert f["abort.decode_kv_back_to_baseline"] is False and f["abort.decode_used_delta"] > 0
    assert f["abort.no_phantom_running"] is False and f["abort.phantom_running"] == stats["late_writes"]
    assert f["abort.deferred_metric_seen"] is False and f["abort.deferred_outcomes"] == {}
    assert f["abort.prefill_kv_back_to_baseline"] is True  # not this bug's symptom
    assert f["abort.followup_ok"] is True


def test_abort_storm_catches_a_prefill_leak_alone():
    out, stats = run(AbortStorm(), head_config(prefill_leaks_aborted=True, **STORM))
    f = out.fields
    assert stats["prefill_leaks"] >= 1 and f["abort.prefill_used_delta"] > 0
    assert f["abort.prefill_kv_back_to_baseline"] is False
    assert f["abort.decode_kv_back_to_baseline"] and f["abort.no_phantom_running"]  # not this bug's symptoms


def test_abort_storm_deferred_timeout_is_counted():
    cfg = head_config(transfer_s=0.4, deferred_timeout_s=0.05)
    limits = Limits(
        **{
            **LIMITS.__dict__,
            "abort_requests": 2,
            "abort_delays_s": (0.1, 0.1),
            "settle_s": 1.0,
            "abort_followups": 0,
        }
    )
    out, _ = run(AbortStorm(), cfg, limits)
    assert out.fields["abort.deferred_outcomes"]["timeout"] >= 1
