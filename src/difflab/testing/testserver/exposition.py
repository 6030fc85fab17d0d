"""What the simulated engines answer on /server_info, /model_info and /metrics (SGLang's shapes)."""

from __future__ import annotations

from typing import Any

from difflab.engine import names
from difflab.engine.metrics import render_sample
from difflab.testing.testserver.engine import SimEngine


def server_info(engine: SimEngine, role: str) -> dict[str, Any]:
    """Server args merged with the scheduler's init info, as ``/server_info`` does."""
    cfg = engine.config
    pool = cfg.pool_tokens(role)
    info: dict[str, Any] = {
        "model_path": cfg.model,
        "tokenizer_path": cfg.model,
        "served_model_name": cfg.model,
        "host": "127.0.0.1",
        "page_size": cfg.page_size,
        "context_length": None,
        "max_total_tokens": pool,
        "enable_metrics": True,
        "load_format": "dummy",
        "tp_size": 1,
        "dp_size": 1,
        names.ROLE_INFO_KEY: role,
        names.BACKEND_INFO_KEY: "mooncake",
        "disaggregation_bootstrap_port": 8998,
        "status": "ready",
        "max_total_num_tokens": pool,
        "max_req_input_len": pool - 1,
        "internal_states": [{"last_gen_throughput": 0.0}],
        "version": cfg.version,
    }
    info.update(cfg.server_args.get(role, {}))
    return info


def model_info(engine: SimEngine) -> dict[str, Any]:
    cfg = engine.config
    return {
        "model_path": cfg.model,
        "tokenizer_path": cfg.model,
        "is_generation": True,
        "preferred_sampling_params": None,
        "weight_version": "default",
        "model_type": "qwen3",
        "architectures": ["Qwen3ForCausalLM"],
    }


def metrics_text(engine: SimEngine, role: str) -> str:
    """Prometheus text for one role, with the label set SGLang's scheduler collector uses."""
    cfg = engine.config
    snap = engine.snapshot(role)
    labels = (
        ("engine_type", role),
        ("model_name", cfg.model),
        ("moe_ep_rank", "0"),
        ("pp_rank", "0"),
        ("tp_rank", "0"),
    )
    lines: list[str] = []

    def gauge(name: str, doc: str, value: float) -> None:
        lines.extend([f"# HELP {name} {doc}", f"# TYPE {name} gauge", render_sample(name, labels, value)])

    gauge(
        names.POOL_METRIC,
        "Maximum total number of tokens in the KV cache pool.",
        snap["max_total_num_tokens"],
    )
    gauge(names.CONTEXT_METRIC, "The context length.", cfg.context_length)
    gauge(names.USED_METRIC, "The number of used tokens.", snap["num_used_tokens"])
    gauge(names.RUNNING_METRIC, "The number of running requests.", snap["num_running_reqs"])
    gauge("sglang:token_usage", "The token usage.", snap["num_used_tokens"] / snap["max_total_num_tokens"])
    if role == "decode" and cfg.deferred_metric and cfg.deferred_release:
        gauge(names.DEFERRED_HELD_METRIC, "Requests whose KV release is deferred.", snap["held"])
        base = names.DEFERRED_METRIC.removesuffix("_total")
        lines += [f"# HELP {base} Deferred decode KV releases by outcome.", f"# TYPE {base} counter"]
        for outcome in ("drained", "timeout", "error"):
            lab = tuple(sorted((*labels, ("outcome", outcome))))
            lines.append(render_sample(names.DEFERRED_METRIC, lab, snap[f"deferred_{outcome}"]))
            lines.append(render_sample(f"{base}_created", lab, engine.started_at))
    return "\n".join(lines) + "\n"
