"""Other systems' default gradient buckets as simulator plans (the rows LGS is compared with).

Defaults from ../shared/REFERENCE.md ("Defaults of the gradient-bucket knobs elsewhere") and
megatron-core 0.16.1 `DistributedDataParallel.__init__`. A one-threshold system buckets once:
its size is both the intra threshold and the inter message cap, so nothing is split. Sizes given
in elements become bytes at the run's gradient width (`Layout.grad_bytes`, fp32 by default).
"""

from __future__ import annotations

from dataclasses import dataclass

from megatron_lgs.lgs.timeline import (
    MB,
    StepPrediction,
    Thresholds,
    Workload,
    ddp_buckets,
    predict_step,
)
from megatron_lgs.lgs.workload import Layout


@dataclass(frozen=True)
class Plan:
    name: str
    thresholds: Thresholds
    bucket_later_stages: bool = True
    note: str = ""
    pipelined_hops: bool = False  # one communication channel; LGS plans have two


def megatron_default_bucket_bytes(dp: int, grad_bytes: int) -> int:
    """megatron-core DDP's default `bucket_size`, max(40M, 1M x DP) parameters, in bytes."""
    return max(40_000_000, 1_000_000 * dp) * grad_bytes


def megatron_default(lay: Layout) -> Plan:
    n = megatron_default_bucket_bytes(lay.dp, lay.grad_bytes)
    # megatron-core turns bucketing off on pipeline stages after the first.
    return Plan("Megatron default", ddp_buckets(n), bucket_later_stages=False,
                note="max(40M, 1M x DP) params; stages > 0 one bucket")


def baseline_plans(lay: Layout) -> list[Plan]:
    """PyTorch DDP, Megatron-core, DeepSpeed ZeRO and the seed's thresholds, in that order."""
    ds = int(5e8) * lay.grad_bytes
    return [
        Plan("PyTorch DDP 25 MB", ddp_buckets(25 * MB),
             note="bucket_cap_mb=25 (its 1 MB first bucket not modelled)"),
        megatron_default(lay),
        Plan("DeepSpeed 5e8", ddp_buckets(ds), note="reduce_bucket_size=5e8 elements"),
        Plan("seed 160/24 MB", Thresholds(160 * MB, 24 * MB), note="intra 160 MB, inter 24 MB",
             pipelined_hops=True),
    ]


def predict_plan(w: Workload, plan: Plan) -> StepPrediction:
    return predict_step(w, plan.thresholds, plan.bucket_later_stages, plan.pipelined_hops)
