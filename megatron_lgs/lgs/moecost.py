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
    bp = 5 if r.swiglu else 3
    # Activation, then permute and unpermute of each token copy (read + write each way).
    copies = local * per_expert
    elem_f = expert_activation_bytes(r, tok) + copies * 4 * h * 2
    elem_b = copies * (bp * f + 4 * h) * 2
    if r.moe_dispatcher == "flex":
        a2a = 2 * flex_dispatch_time(r, hw, tok)
    else:
        sent = tok / t * r.moe_topk * h * 2
        intra_peers = max(0, min(r.ep, r.gpus_per_node // max(1, r.etp)) - 1)
        a2a = 2 * all_to_all_time(sent, r.ep, intra_peers, hw.intra, hw.inter)
    return fwd, bwd, elem_f, elem_b, a2a


def _holds_one(experts: int, group: int, k: int) -> float:
    """Probability that a group of `group` of the `experts` holds at least one of a token's k
    distinct experts, the k drawn uniformly (balanced routing)."""
    miss = 1.0
    for i in range(k):
        miss *= max(0, experts - group - i) / (experts - i)
    return 1.0 - miss


def flex_dispatch_time(r: Run, hw: HardwareProfile, tok: float) -> float:
    """One dispatch (or combine) of megatron-core's flex dispatcher, DeepEP's or HybridEP's
    kernels (expert TP 1): a token goes once to each GPU that holds any of its experts, not
    once per expert as the all-to-all dispatcher's permuted copies go (DeepEP's
    `get_dispatch_layout`: tokens per rank and `is_token_in_rank`), and across nodes once per
    node, over RDMA to the GPU of the same index there, which forwards it over NVLink to the
    others (DeepEP's README, "forwarding data from NVLink domain to RDMA domain"; Hybrid-EP's
    "hierarchical communication design", docs/README_Hybrid-EP.md). NVLink and the network
    run at once; the slower sets the time."""
    row = r.hidden * 2  # BF16 hidden state
    sent = tok / r.tp
    per_node = min(r.ep, r.gpus_per_node)
    nodes = r.ep // per_node
    on_gpu = _holds_one(r.num_experts, r.num_experts // r.ep, r.moe_topk)
    on_node = _holds_one(r.num_experts, r.num_experts // nodes, r.moe_topk)
    # Every GPU of the node a token reaches, the sender's own node and each remote one, gets it
    # over NVLink but the one that holds it already.
    nvlink = sent * nodes * (per_node - 1) * on_gpu * row
    network = sent * (nodes - 1) * on_node * row
    t_intra = (per_node - 1) * hw.intra.alpha_s + nvlink / hw.intra.bandwidth_Bps
    t_inter = (nodes - 1) * hw.inter.alpha_s + network / hw.inter.bandwidth_Bps if network else 0.0
    return max(t_intra, t_inter)


def expert_activation_bytes(r: Run, tok: float) -> float:
    """Bytes the experts' activation moves forward on one GPU, one micro-batch: SwiGLU reads
    both halves of the first GEMM's output and writes one (3 passes of the expert width), GeLU
    reads and writes it (2), BF16, for every routed token copy the GPU's experts receive."""
    copies = tok * r.moe_topk / r.tp * r.etp
    return copies * (3 if r.swiglu else 2) * r.expert_ffn / r.etp * 2


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
