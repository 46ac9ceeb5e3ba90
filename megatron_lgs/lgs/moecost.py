"""An MoE layer's own costs for the whole-step model (`stepmodel`): the routed experts' GEMMs
and element-wise work, the expert-parallel all-to-alls, and megatron-core's overlap of those
all-to-alls with another micro-batch's compute. Every time is a prediction.
"""

from __future__ import annotations

from megatron_lgs.lgs.costmodel import HardwareProfile
from megatron_lgs.lgs.gpus import GpuProfile
from megatron_lgs.lgs.kernels import all_to_all_time, gemm_fwd_bwd, nccl_beside
from megatron_lgs.lgs.runspec import Run


def moe_mlp(r: Run, gpu: GpuProfile, hw: HardwareProfile, tok: float
            ) -> tuple[float, float, float, float, float]:
    """(GEMM fwd, GEMM bwd, element-wise bytes fwd, bwd, all-to-all per direction) of an MoE
    layer with balanced routing."""
    t, h, p, e = r.tp, r.hidden, r.precision, r.num_experts
    mats = 2 if r.swiglu else 1
    f = r.expert_ffn / r.etp
    local = e // r.ep
    per_expert = tok * r.moe_topk / t * r.etp * r.ep / e
    f1 = gemm_fwd_bwd(per_expert, f * mats, h, gpu, p)
    f2 = gemm_fwd_bwd(per_expert, h, f, gpu, p)
    router = gemm_fwd_bwd(tok / t, e, h, gpu, p)
    fwd = local * (f1[0] + f2[0]) + router[0]
    bwd = local * (f1[1] + f2[1]) + router[1]
    fp, bp = (3, 5) if r.swiglu else (2, 3)
    # Activation, then permute and unpermute of each token copy (read + write each way).
    copies = local * per_expert
    elem_f, elem_b = copies * (fp * f + 4 * h) * 2, copies * (bp * f + 4 * h) * 2
    sent = tok / t * r.moe_topk * h * 2
    intra_peers = max(0, min(r.ep, r.gpus_per_node // max(1, r.etp)) - 1)
    a2a = 2 * all_to_all_time(sent, r.ep, intra_peers, hw.intra, hw.inter)
    return fwd, bwd, elem_f, elem_b, a2a


def overlap_all_to_all(r: Run, gpu: GpuProfile, fwd: dict[str, float], bwd: dict[str, float]
                       ) -> None:
    """megatron-core's EP all-to-all overlap (`overlap_moe_expert_parallel_comm`, 0.16's
    `combined_1f1b.py`): in the 1F1B steady state one micro-batch's forward and another's
    backward run layer by layer together, each one's all-to-alls beside the other's compute
    (on NCCL's SMs). The warm-up forwards, one more than the schedule's own, and as many
    cool-down backwards run alone and keep theirs exposed: the first stage's share of them,
    the largest, is taken for every stage. `fwd`, `bwd`: one layer's terms, updated."""
    warm = 1 if r.pp == 1 else 2 * (r.pp - 1) + (r.vpp - 1) * r.pp + 1
    alone = min(1.0, warm / (r.num_micro_batches * r.vpp))
    a2a_f, a2a_b = fwd["moe_all_to_all"], bwd["moe_all_to_all"]
    busy_f, busy_b = sum(fwd.values()) - a2a_f, sum(bwd.values()) - a2a_b
    fwd["moe_all_to_all"] = alone * a2a_f + (1 - alone) * nccl_beside(a2a_f, busy_b, gpu)
    bwd["moe_all_to_all"] = alone * a2a_b + (1 - alone) * nccl_beside(a2a_b, busy_f, gpu)
