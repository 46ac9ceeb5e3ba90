"""An MoE layer's own costs for the whole-step model (`stepmodel`): the routed experts' GEMMs
and element-wise work, the expert-parallel all-to-alls, and megatron-core's overlap of those
all-to-alls with another micro-batch's compute. Every time is a prediction.
"""

from __future__ import annotations

from typing import NamedTuple

from megatron_lgs.lgs.costmodel import HardwareProfile
from megatron_lgs.lgs.gpus import NCCL_COMM_SMS, GpuProfile
from megatron_lgs.lgs.kernels import (
    all_to_all_time,
    gemm_fwd_bwd,
    gemm_parts,
    sm_contention,
    tp_collective_time,
)
from megatron_lgs.lgs.runspec import Run


class MoeMlp(NamedTuple):
    """An MoE layer's MLP on one GPU, one micro-batch, balanced routing: seconds, and bytes of
    element-wise traffic."""

    experts_fwd: float    # the routed experts' GEMMs, forward,
    experts_dgrad: float  # their data gradients
    experts_wgrad: float  # and their weight gradients
    router_fwd: float     # the router's GEMM, forward and backward
    router_bwd: float
    elem_f: float         # element-wise bytes forward (activation, permutes) and backward
    elem_b: float
    a2a: float            # all-to-all per direction, dispatch and combine

    @property
    def fwd(self) -> float:
        """Every GEMM of the MLP, forward."""
        return self.experts_fwd + self.router_fwd

    @property
    def bwd(self) -> float:
        """Every GEMM of the MLP, backward."""
        return self.experts_dgrad + self.experts_wgrad + self.router_bwd


def moe_mlp(r: Run, gpu: GpuProfile, hw: HardwareProfile, tok: float) -> MoeMlp:
    """An MoE layer's MLP with balanced routing (`MoeMlp`)."""
    t, h, p, e = r.tp, r.hidden, r.precision, r.num_experts
    mats = 2 if r.swiglu else 1
    f = r.expert_ffn / r.etp
    local = e // r.ep
    per_expert = tok * r.moe_topk / t * r.etp * r.ep / e
    experts = [local * (a + b) for a, b in zip(gemm_parts(per_expert, f * mats, h, gpu, p),
                                               gemm_parts(per_expert, h, f, gpu, p),
                                               strict=True)]
    router = gemm_fwd_bwd(tok / t, e, h, gpu, p)
    bp = 5 if r.swiglu else 3
    # Activation, then permute and unpermute of each token copy (read + write each way).
    copies = local * per_expert
    elem_f = expert_activation_bytes(r, tok) + copies * 4 * h * 2
    elem_b = copies * (bp * f + 4 * h) * 2
    if r.moe_dispatcher == "flex":
        a2a = 2 * flex_dispatch_time(r, hw, tok)
    elif r.moe_dispatcher == "allgather":
        a2a = allgather_dispatch_time(r, hw, tok)
    else:
        sent = tok / t * r.moe_topk * h * 2
        intra_peers = max(0, min(r.ep, r.gpus_per_node // max(1, r.etp)) - 1)
        a2a = 2 * all_to_all_time(sent, r.ep, intra_peers, hw.intra, hw.inter)
    return MoeMlp(*experts, *router, elem_f, elem_b, a2a)


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


def allgather_dispatch_time(r: Run, hw: HardwareProfile, tok: float) -> float:
    """A dispatch and a combine of megatron-core's allgather dispatcher (0.16
    `MoEAllGatherTokenDispatcher`, the trainer's default): every rank all-gathers all the
    tokens of its expert-TP x EP group, their hidden states (BF16) with the routing map and
    the probabilities (a byte and two per expert), its experts take the copies routed to them,
    and their outputs, put back in the gathered order, are reduce-scattered to the ranks that
    sent them. The backward's pair is the same traffic the other way round."""
    group = r.etp * r.ep
    gathered = tok / r.tp * group
    link = hw.intra if group <= r.gpus_per_node else hw.inter
    return (tp_collective_time("all_gather", gathered * (r.hidden * 2 + r.num_experts * 3),
                               group, link)
            + tp_collective_time("reduce_scatter", gathered * r.hidden * 2, group, link))


def expert_activation_bytes(r: Run, tok: float) -> float:
    """Bytes the experts' activation moves forward on one GPU, one micro-batch: SwiGLU reads
    both halves of the first GEMM's output and writes one (3 passes of the expert width), GeLU
    reads and writes it (2), BF16, for every routed token copy the GPU's experts receive."""
    copies = tok * r.moe_topk / r.tp * r.etp
    return copies * (3 if r.swiglu else 2) * r.expert_ffn / r.etp * 2


class ExpertNode(NamedTuple):
    """The compute megatron-core's fine-grained schedule runs between an MoE layer's dispatch
    and combine (0.16 `fine_grained_callables.submodule_moe_forward`: the routed experts, their
    activation and permutes), seconds; the rest of the layer is its attention node."""

    fwd: float
    dgrad: float  # backward without the weight gradients: data gradients, element-wise work
    wgrad: float


def _layer_pair(a_f: float, m_f: float, a_b: float, a_dw: float, m_b: float, m_dw: float,
                comm_f: float, comm_b: float, layers: int) -> float:
    """Mean seconds of one layer of megatron-core 0.16's fine-grained 1F1B
    (`TransformerLayerSchedulePlan.run`), one micro-batch's forward (attention a_f, experts
    m_f) beside another's backward (a_b then its weight gradients a_dw, m_b then m_dw), over a
    model chunk of `layers`. Two streams, each in its issue order, each op waiting for its
    inputs: compute a_f, m_b, m_dw, m_f, a_b, a_dw; communication the backward's combine, the
    forward's dispatch, the backward's dispatch, the forward's combine (each `comm_f` forward,
    `comm_b` backward). A layer's forward input is the last one's combine, its output gradient
    the last one's a_b, so a_dw runs beside the next layer's first all-to-all."""
    comm = comp = grad = out = 0.0
    for _ in range(layers):
        cb = max(comm, grad) + comm_b
        af = max(comp, out) + a_f
        df = max(cb, af) + comm_f
        mb = max(af, cb) + m_b
        db = max(df, mb) + comm_b
        mf = max(mb + m_dw, df) + m_f
        cf = max(db, mf) + comm_f
        ab = max(mf, db) + a_b
        comm, comp, grad, out = cf, ab + a_dw, ab, cf
    return max(comm, comp) / layers


def overlap_all_to_all(r: Run, gpu: GpuProfile, fwd: dict[str, float], bwd: dict[str, float],
                       experts: ExpertNode, attn_wgrad: float, recompute: float) -> None:
    """megatron-core's EP all-to-all overlap (`overlap_moe_expert_parallel_comm`, 0.16's
    `combined_1f1b.py`): in the 1F1B steady state one micro-batch's forward and another's
    backward run layer by layer together (`_layer_pair`), an all-to-all beside the other's
    compute of the same phase on the GPU's other SMs (NCCL's 16, HybridEP's default); with
    `delay_wgrad_compute` the weight gradients run apart from the data gradients, after them,
    so the backward's dispatch starts earlier. The warm-up forwards, one more than the
    schedule's own, and as many cool-down backwards run alone and keep theirs exposed: the
    first stage's share of them, the largest, is taken for every stage. `fwd`, `bwd`: one
    layer's terms, updated; `experts`, `attn_wgrad` (the attention node's weight gradients)
    and `recompute` (the layer's selective recompute, the experts' share in `experts.dgrad`)
    split its compute into the schedule's nodes."""
    warm = 1 if r.pp == 1 else 2 * (r.pp - 1) + (r.vpp - 1) * r.pp + 1
    alone = min(1.0, warm / (r.num_micro_batches * r.vpp))
    a2a_f, a2a_b = fwd["moe_all_to_all"], bwd["moe_all_to_all"]
    busy_f = sum(fwd.values()) - a2a_f
    busy_b = sum(bwd.values()) - a2a_b + recompute
    a_f, m_f = busy_f - experts.fwd, experts.fwd
    if r.delay_wgrad_compute:
        m_b, m_dw, a_dw = experts.dgrad, experts.wgrad, attn_wgrad
    else:
        m_b, m_dw, a_dw = experts.dgrad + experts.wgrad, 0.0, 0.0
    a_b = busy_b - m_b - m_dw - a_dw
    disp_f, disp_b = a2a_f / 2, a2a_b / 2  # dispatch and combine move the same bytes

    def slowed(compute: float, comm: float) -> float:
        return compute + sm_contention(compute, comm, gpu, NCCL_COMM_SMS)

    # Each compute op beside the all-to-all of its phase: a_f the backward's combine, m_b the
    # forward's dispatch, m_dw and m_f the backward's dispatch, a_b and a_dw the forward's
    # combine.
    pair = _layer_pair(slowed(a_f, disp_b), slowed(m_dw + m_f, disp_b) - m_dw,
                       slowed(a_b + a_dw, disp_f) - a_dw, a_dw, slowed(m_b, disp_f), m_dw,
                       disp_f, disp_b,
                       max(1, round(r.num_layers / (r.pp * r.vpp))))
    exposed = max(0.0, pair - busy_f - busy_b)
    share_f = a2a_f / (a2a_f + a2a_b)
    fwd["moe_all_to_all"] = alone * a2a_f + (1 - alone) * exposed * share_f
    bwd["moe_all_to_all"] = alone * a2a_b + (1 - alone) * exposed * (1 - share_f)
