"""Every engine-side name the preflight and the GPU scenarios read, with where it comes from.

One table, so that when SGLang renames something the fix is one line here. Each
entry says whether it was confirmed and from what public source; unconfirmed
behaviour is never presented as fact in a gate's verdict.
"""

from __future__ import annotations

# --- capacity (confirmed: sglang observability/metrics_collector.py, scheduler get_init_info) ---
POOL_METRIC = "sglang:max_total_num_tokens"  # gauge, one series per rank
POOL_INFO_KEY = "max_total_num_tokens"  # /server_info merges the scheduler's init info
CONTEXT_METRIC = "sglang:context_len"  # gauge set once at startup
CONTEXT_INFO_KEYS = ("context_length", "max_model_len")  # server arg (null = model default), newer init info
USED_METRIC = "sglang:num_used_tokens"
RUNNING_METRIC = "sglang:num_running_reqs"
ROLE_INFO_KEY = "disaggregation_mode"
BACKEND_INFO_KEY = "disaggregation_transfer_backend"

# --- deferred decode KV release (confirmed: sglang environ.py; facts file for the defaults) ---
DEFERRED_ENV = "SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE"
DEFERRED_TIMEOUT_ENV = "SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT"
# Default False in 0.5.19/0.5.20 and True from 0.5.21 (measured in the release wheels).
DEFERRED_DEFAULT_ON_FROM = (0, 5, 21)
DEFERRED_DEFAULT_KNOWN_FROM = (0, 5, 19)
DEFERRED_METRIC = "sglang:decode_deferred_kv_release_total"  # {outcome=drained|timeout|error}, 0.5.22+
DEFERRED_HELD_METRIC = "sglang:num_decode_deferred_kv_release_reqs"

# --- Mooncake transfer batch (sgl-project/sglang#32758; 0 disables splitting) ---
# The release trees name it ..._INDICES (a count of KV indices per batch, not bytes): EnvInt(0) in
# 0.5.20-0.5.23 (one unbounded batch unless set), absent in 0.5.19 (difflab.preflight.defaults).
TRANSFER_BATCH_ENV = "SGLANG_MOONCAKE_MAX_TRANSFER_BATCH_INDICES"

# --- KV checksum: a server flag first, an environment level later (both seen in SGLang tests) ---
CHECKSUM_FLAG_KEY = "disaggregation_enable_kv_checksum"  # --disaggregation-enable-kv-checksum
CHECKSUM_ENV = "SGLANG_DISAGGREGATION_KV_CHECKSUM"  # integer level, 0 = OFF (in no release tree 0.5.19-0.5.23)
# Context parallelism disables the checksum (KVChecksummer.maybe_create): "where supported".
CHECKSUM_UNSUPPORTED_INFO_KEYS = ("dcp_size", "attn_cp_size")

TRUE_WORDS = frozenset({"1", "true", "yes", "on"})
FALSE_WORDS = frozenset({"0", "false", "no", "off", ""})


def parse_bool(value: object) -> bool | None:
    """SGLang's EnvBool spelling; ``None`` when the text is neither."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in TRUE_WORDS:
        return True
    if text in FALSE_WORDS:
        return False
    return None


def parse_version(text: str | None) -> tuple[int, ...] | None:
    """``"0.5.21"`` / ``"0.5.21.post1"`` / ``"v0.5.21-cu129"`` -> ``(0, 5, 21)``; ``None`` if unreadable."""
    if not text:
        return None
    head = text.strip().lstrip("v").split("-")[0].split("+")[0]
    parts = []
    for piece in head.split(".")[:3]:
        if not piece.isdigit():
            return None
        parts.append(int(piece))
    return tuple(parts) if len(parts) == 3 else None
