"""Which live scenarios judge which fix, and what they must show: the GPU tier's part of the matrix.

Same shape as the matrix's probes (``expect`` = [base, head], ``controls`` =
equal on both sides), so the verdicts come from :func:`difflab.diff.judge_fix`.
These expectations are derived from the fixes' descriptions; on real hardware a
``not-reproduced`` verdict is a finding about the scenario's reach, and the doc
(docs/gpu-tier.md) says which ones are least certain.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from difflab.errors import ConfigError
from difflab.matrix.model import Fix, ProbeSpec

ABORT = "gpu_abort_storm"
OVERSIZED = "gpu_oversized_prompt"
CANARY = "gpu_canary_leak"
THROUGHPUT = "gpu_throughput_ab"


@dataclass(frozen=True)
class GpuPlan:
    probes: tuple[ProbeSpec, ...]
    throughput: bool = False  # also run the interleaved throughput A/B for this pair


PLANS: dict[str, GpuPlan] = {
    # #36988: an aborted request's final prefill result released nothing: prefill KV leaks.
    "36988": GpuPlan(
        probes=(
            ProbeSpec(
                ABORT,
                expect={"abort.prefill_kv_back_to_baseline": (False, True)},
                controls={"abort.followup_ok": True},
            ),
        )
    ),
    # #38935: an over-pool prompt is retired at intake (400 at once) instead of handed off with stale pages.
    "38935": GpuPlan(
        probes=(
            ProbeSpec(
                OVERSIZED,
                expect={"oversized.rejected_at_once": (False, True)},
                controls={"oversized.control_ok": True},
            ),
            ProbeSpec(
                CANARY,
                expect={"canary.leak_seen": (True, False)},
                controls={"canary.short_requests_ok": True},
            ),
        )
    ),
    # #41404: decode holds aborted pages until the in-flight write drains; its cost is measured too.
    "41404": GpuPlan(
        probes=(
            ProbeSpec(
                ABORT,
                expect={
                    "abort.decode_kv_back_to_baseline": (False, True),
                    "abort.no_phantom_running": (False, True),
                },
                controls={"abort.followup_ok": True},
            ),
        ),
        throughput=True,
    ),
}


def scenario_names(plan: GpuPlan) -> list[str]:
    return [p.name for p in plan.probes]


def gpu_fixes(fixes: list[Fix], wanted: list[str] | None) -> list[Fix]:
    """The selected matrix fixes that have a GPU plan, with the GPU probes in place of the CPU ones."""
    chosen = [f for f in fixes if f.id in PLANS]
    if wanted:
        tokens = {t.lstrip("#") for t in wanted}
        chosen = [f for f in chosen if f.id in tokens or str(f.pr) in tokens]
        if not chosen:
            raise ConfigError(
                f"no GPU scenario for fix(es) {', '.join(sorted(tokens))}; the GPU tier covers "
                f"{', '.join(sorted(PLANS))}"
            )
    return [replace(f, probes=PLANS[f.id].probes) for f in chosen]
