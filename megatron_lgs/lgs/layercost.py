"""One transformer layer and the logits, per micro-batch and GPU, op by op, for the whole-step
model (`stepmodel`): the GEMMs of each TP linear layer (`tpcomm`) or of the MoE block
(`moecost`), attention with its s^2 part, fused (`attention_blocks`) or as batched GEMMs plus
softmax/dropout traffic, the memory-bound passes (norms, bias-dropout-adds, activations, RoPE,
FP8 casts, the cross-entropy), the TP, CP and expert-TP communication exposed beyond the
compute it runs beside, the host's launch floor, and recompute. Each term lands in a `Cost`
under one of `TERMS`. Every time is a prediction.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from megatron_lgs.lgs.costmodel import HardwareProfile
from megatron_lgs.lgs.gpus import HOST_S_PER_KERNEL, GpuProfile
from megatron_lgs.lgs.kernels import (
    flash_attention_time,
    gemm_fwd_bwd,
    memory_time,
    small_allreduce_time,
)
from megatron_lgs.lgs.moecost import (
    ExpertNode,
    expert_activation_bytes,
    moe_mlp,
    overlap_all_to_all,
)
from megatron_lgs.lgs.runcheck import RECOMPUTE_MODULES
from megatron_lgs.lgs.runspec import Run
from megatron_lgs.lgs.tpcomm import (
    expert_tp_comm,
    tp_collectives,
    tp_comm_exposed,
    tp_gemm_parts,
)

TERMS = ("gemm", "attention", "elementwise", "host_overhead", "recompute", "tp_comm",
         "cp_comm", "moe_all_to_all", "pp_p2p", "fp8_amax_reduction", "pipeline_bubble",
         "grad_buffer", "dp_grad_sync", "embedding_grad_sync", "param_all_gather", "optimizer")
# Kernels one transformer layer launches per micro-batch (Megatron-Core's TE layer): forward
# norm, QKV, attention, projection, bias-dropout-add, norm, FC1, activation, FC2,
# bias-dropout-add; backward a data- and a weight-gradient GEMM per linear layer, attention,
# 2 norms, the activation, 2 dropouts, 2 residual adds. Plus the layer's TP collectives
# (`tpcomm.tp_collectives`) when tp > 1, and its rotary embeddings' (ROPE_KERNELS).
LAYER_KERNELS_FWD, LAYER_KERNELS_BWD = 10, 16
# An unfused bias-GeLU launches the bias add apart (`Run.bias_gelu_fusion`).
UNFUSED_BIAS_GELU_KERNELS = 1
# Fused vocab-parallel cross-entropy (megatron/core/tensor_parallel/cross_entropy.py, as in
# r0.8): forward casts the BF16 logits to FP32 (0.5 read + 1 write, in units of the FP32
# logits), max (1), subtract the max in place (2), exp in place (2), sum (1), divide in place
# (2); backward multiplies in place (2) and casts the gradient back to BF16 (1 + 0.5).
CE_PASSES_FWD, CE_PASSES_BWD = 9.5, 3.5
# Transformer Engine (v2.7, `Float8Quantizer` / `Float8CurrentScalingQuantizer`) casts every
# FP8 GEMM operand that is an activation or a gradient in a memory-bound pass of its own:
# read the BF16 tensor, write FP8 row-wise (for its GEMM) and column-wise (for the other
# gradient GEMM), 2 + 1 + 1 bytes per element; current scaling first reads it once more for
# its amax (+2). A norm followed by a GEMM (QKV, FC1) quantizes inside the norm kernel with
# delayed scaling (no pass); with current scaling the norm writes BF16 and its amax, and one
# cast pass follows (`normalization.cpp`, `force_unfused_kernel`). Weights are cast once per
# step, by the first micro-batch (`stepmodel.fp8_weight_cache`).
FP8_QUANTIZE_BYTES = {"delayed": 4.0, "current": 6.0}
FP8_NORM_FUSED_BYTES = {"delayed": 0.0, "current": 4.0}
# Rotary embeddings, passes over each query and key element (BF16), forward and backward:
# Transformer Engine's fused kernel reads and writes it once each way (`fused_rope.cu`);
# megatron-core 0.16's unfused `_apply_rotary_pos_emb_bshd` (mul cos, neg + cat for the
# rotated half, mul sin, add, cat with the empty unrotated rest) makes 12 forward and, through
# autograd, 14 backward (counted on its own ops, tests/unit/lgs/test_rope_passes.py).
ROPE_PASSES = {True: (2.0, 2.0), False: (12.0, 14.0)}
# Kernels the same rotation launches for the query and the key together, forward and backward
# (the host floor): the fused kernel one per tensor each way; the unfused form 12 ATen ops
# forward (cos and sin of the frequencies and their casts included) and 7 backward per tensor.
ROPE_KERNELS = {True: (2, 2), False: (24, 14)}


@dataclass
class Cost:
    """Seconds per micro-batch of one stage, forward and backward, by term."""

    fwd: dict[str, float] = field(default_factory=lambda: dict.fromkeys(TERMS, 0.0))
    bwd: dict[str, float] = field(default_factory=lambda: dict.fromkeys(TERMS, 0.0))

    def add(self, other: Cost, times: float = 1.0) -> None:
        for mine, theirs in ((self.fwd, other.fwd), (self.bwd, other.bwd)):
            for k, v in theirs.items():
                mine[k] += times * v

    @property
    def fwd_s(self) -> float:
        return sum(self.fwd.values())

    @property
    def bwd_s(self) -> float:
        return sum(self.bwd.values())


def _dense_mlp(r: Run, gpu: GpuProfile, tok: float
               ) -> tuple[tuple[float, float, float], tuple[float, float, float], float, float]:
    """(FC1 parts, FC2 parts, element-wise bytes fwd, bwd) of the dense MLP."""
    t, h, f = r.tp, r.hidden, r.ffn_hidden
    mats = 2 if r.swiglu else 1
    f1 = tp_gemm_parts(r, tok, f * mats / t, h, gpu, column=True)
    f2 = tp_gemm_parts(r, tok, h, f / t, gpu, column=False)
    # GeLU: read + write forward, read 2 + write 1 backward; SwiGLU: 3 forward, 5 backward.
    # An unfused GeLU adds its bias in a pass of its own (read + write).
    fp, bp = (3, 5) if r.swiglu else (2 if r.bias_gelu_fusion else 4, 3)
    act = tok * f / t * 2
    return f1, f2, fp * act, bp * act


def _fp8_quantize_bytes(r: Run, tok: float) -> tuple[float, float, float, float]:
    """(forward, backward) HBM bytes of one layer's FP8 casts, and of those the MLP's: forward
    the inputs of the four GEMMs (QKV and FC1 after their norms, sequence-sharded with SP;
    projection and FC2 head-sharded), backward their output gradients (QKV, FC1 head-sharded;
    projection and FC2 sequence-sharded, cast before the all-gather). MoE: the experts' grouped
    GEMMs in FP8, the router in BF16."""
    if r.precision != "fp8":
        return 0.0, 0.0, 0.0, 0.0
    t, h = r.tp, r.hidden
    sp = t if r.sequence_parallel else 1
    q, fused = FP8_QUANTIZE_BYTES[r.fp8_recipe], FP8_NORM_FUSED_BYTES[r.fp8_recipe]
    mats = 2 if r.swiglu else 1
    if r.num_experts:
        copies = tok * r.moe_topk / t * r.etp
        f = r.expert_ffn / r.etp
        mlp_in, mlp_grads = copies * (h + f), copies * (f * mats + h)
        norm_in = tok / sp * h  # QKV only: the router reads the MLP norm's BF16 output
    else:
        f = r.ffn_hidden / t
        mlp_in, mlp_grads = tok * f, tok * f * mats + tok / sp * h
        norm_in = 2 * tok / sp * h
    fwd = fused * norm_in + q * (tok * r.q_dim / t + mlp_in)
    bwd = q * (tok * (r.q_dim + 2 * r.kv_dim) / t + tok / sp * h + mlp_grads)
    return fwd, bwd, q * mlp_in, q * mlp_grads


def _host_bound(r: Run, c: Cost) -> None:
    """The GPU waits for the host where launching a layer's kernels outlasts running them.

    The host enqueues kernels asynchronously, so a layer takes max(GPU time, host time) per
    direction; `host_overhead` is what the host adds beyond the GPU's own work.
    """
    coll = tp_collectives(r)
    rope = ROPE_KERNELS[r.rope_fusion] if r.position_embedding == "rope" else (0, 0)
    bias = 0 if r.swiglu or r.bias_gelu_fusion else UNFUSED_BIAS_GELU_KERNELS
    for times, kernels, n in ((c.fwd, LAYER_KERNELS_FWD + rope[0] + bias, coll[0]),
                              (c.bwd, LAYER_KERNELS_BWD + rope[1], coll[1])):
        host = (kernels + n) * HOST_S_PER_KERNEL
        times["host_overhead"] = max(0.0, host - sum(times.values()))


def attention_blocks(r: Run) -> list[tuple[float, float, bool, int, float]]:
    """One layer's fused-attention blocks on one GPU, one micro-batch: (query length, key
    length, causal, count, forward FLOPs of all `count`).

    The kernel skips the masked half of the score matrix. Without CP it runs one s x s causal
    block per sequence; under CP, Transformer Engine's load-balanced ring runs per sequence one
    causal block of the rank's own s/cp tokens (1/cp of its FLOPs) and cp - 1 full blocks of
    s/cp x s/(2 cp).
    """
    flops = 4 * r.micro_batch * r.seq_length / r.cp * r.seq_length * r.q_dim / r.tp * 0.5
    n = r.seq_length / r.cp
    blocks = [(n, n, True, 1, flops / r.cp)]
    if r.cp > 1:
        blocks.append((n, n / 2, False, r.cp - 1, flops * (r.cp - 1) / r.cp))
    return blocks


def flash_attention(r: Run, gpu: GpuProfile) -> tuple[float, float]:
    """(forward, backward) of one layer's fused attention blocks (`attention_blocks`), each at
    its own tile factor: CP's smaller blocks run at lower efficiency."""
    fwd = bwd = 0.0
    for q_len, kv_len, _, _, flops in attention_blocks(r):
        f, b = flash_attention_time(flops, gpu, q_len, kv_len)
        fwd, bwd = fwd + f, bwd + b
    return fwd, bwd


def layer_cost(r: Run, gpu: GpuProfile, hw: HardwareProfile) -> Cost:
    """One transformer layer, one micro-batch, one GPU."""
    c = Cost()
    t, h, p = r.tp, r.hidden, r.precision
    tok = r.micro_batch * r.seq_length / r.cp
    qkv = tp_gemm_parts(r, tok, (r.q_dim + 2 * r.kv_dim) / t, h, gpu, column=True)
    proj = tp_gemm_parts(r, tok, h, r.q_dim / t, gpu, column=False)
    gf, gb = qkv[0] + proj[0], qkv[1] + qkv[2] + proj[1] + proj[2]
    column, row = [qkv], [proj]
    moe_fwd = 0.0
    if r.num_experts:
        moe = moe_mlp(r, gpu, hw, tok)
        mf, mb, elem_f, elem_b = moe.fwd, moe.bwd, moe.elem_f, moe.elem_b
        c.fwd["moe_all_to_all"] = c.bwd["moe_all_to_all"] = moe.a2a
        moe_fwd = mf + memory_time(elem_f, gpu) + moe.a2a
    else:
        f1, f2, elem_f, elem_b = _dense_mlp(r, gpu, tok)
        mf, mb = f1[0] + f2[0], f1[1] + f1[2] + f2[1] + f2[2]
        column.append(f1)
        row.append(f2)
    c.fwd["gemm"], c.bwd["gemm"] = gf + mf, gb + mb
    # Attention scores: each rank's tok queries against the whole sequence's keys.
    heads_local, d = r.heads / t, r.head_dim
    if r.flash_attention:
        af, ab = flash_attention(r, gpu)
        score = 0.0
    else:
        seqs = tok / r.seq_length * heads_local
        qk = gemm_fwd_bwd(r.seq_length, r.seq_length, d, gpu, p)
        av = gemm_fwd_bwd(r.seq_length, d, r.seq_length, gpu, p)
        af, ab = seqs * (qk[0] + av[0]), seqs * (qk[1] + av[1])
        # Fused scale-mask-softmax and dropout: 4.5 passes forward, 5.5 backward, 2 B each.
        score = tok * heads_local * r.seq_length * 2
    c.fwd["attention"], c.bwd["attention"] = af, ab
    # Norms, bias-dropout-adds (h-sized, sequence-sharded with SP): 11 passes fwd, 13 bwd.
    sp = t if r.sequence_parallel else 1
    act = tok / sp * h * 2
    q_fwd, q_bwd, q_mlp_f, q_mlp_b = _fp8_quantize_bytes(r, tok)
    # Query/key norms (Qwen3): one read and one write of this rank's Q and K forward, three
    # passes backward (input, output gradient, input gradient), BF16.
    qk_bytes = tok * (r.q_dim + r.kv_dim) / t * 2
    qk = qk_bytes if r.qk_layernorm else 0.0
    rope_f, rope_b = ROPE_PASSES[r.rope_fusion] if r.position_embedding == "rope" else (0, 0)
    c.fwd["elementwise"] = memory_time(11 * act + elem_f + 4.5 * score + q_fwd + 2 * qk
                                       + rope_f * qk_bytes, gpu)
    c.bwd["elementwise"] = memory_time(13 * act + elem_b + 5.5 * score + q_bwd + 3 * qk
                                       + rope_b * qk_bytes, gpu)
    c.fwd["tp_comm"], c.bwd["tp_comm"] = tp_comm_exposed(r, gpu, hw, tok, column, row)
    c.fwd["fp8_amax_reduction"] = c.bwd["fp8_amax_reduction"] = current_scaling_amax(r)
    expert_tp = expert_tp_comm(r, hw, tok)  # gather and scatter, each direction
    c.fwd["tp_comm"] += expert_tp
    c.bwd["tp_comm"] += expert_tp
    if r.cp > 1:
        link = hw.intra if r.tp * r.cp <= r.gpus_per_node else hw.inter
        kv_bytes = tok * 2 * r.kv_dim / t * 2
        ring = (r.cp - 1) * (link.alpha_s + kv_bytes / link.bandwidth_Bps)
        c.fwd["cp_comm"], c.bwd["cp_comm"] = max(0.0, ring - af), max(0.0, 2 * ring - ab)
    recompute = (selective_recompute(r, gpu, tok, af, score, moe_fwd, act)
                 if r.recompute == "selective" else 0.0)
    if r.moe_a2a_overlap:
        # The expert-TP gather and scatter run inside dispatch and combine, on their stream.
        for d in (c.fwd, c.bwd):
            d["tp_comm"] -= expert_tp
            d["moe_all_to_all"] += expert_tp
        experts_recompute = selective_recompute(
            r, gpu, tok, 0.0, 0.0, moe_fwd, 0.0, modules=("moe", "moe_act"))
        experts = ExpertNode(
            moe.experts_fwd + memory_time(elem_f + q_mlp_f, gpu),
            moe.experts_dgrad + memory_time(elem_b + q_mlp_b, gpu) + experts_recompute,
            moe.experts_wgrad)
        overlap_all_to_all(r, gpu, c.fwd, c.bwd, experts, qkv[2] + proj[2], recompute)
    _host_bound(r, c)
    if r.recompute == "full":
        c.bwd["recompute"] = sum(v for k, v in c.fwd.items())
    elif r.recompute == "selective":
        c.bwd["recompute"] = recompute
    return c


def current_scaling_amax(r: Run) -> float:
    """One direction's amax all-reduces of one layer under FP8 current scaling with sequence
    parallelism. Transformer Engine casts a column-parallel GEMM's input and a row-parallel
    GEMM's output gradient to FP8 before all-gathering them, so every TP rank needs one scale:
    the tensor's amax is all-reduced over the TP group first, blocking (TE 2.9's
    `_customize_quantizers_float8_current_scaling`, `with_amax_reduction`): QKV's and FC1's
    inputs forward, the projection's and FC2's output gradients backward. An MoE layer's expert
    GEMMs take no part (TE runs grouped GEMMs under current scaling without TP), so only the
    attention's. Delayed scaling reduces once a chunk instead (`stepmodel.fp8_amax_reduction`)."""
    if r.precision != "fp8" or r.fp8_recipe != "current" or not r.sequence_parallel:
        return 0.0
    return (1 if r.num_experts else 2) * small_allreduce_time(r.tp, r.gpus_per_node)


def selective_recompute(r: Run, gpu: GpuProfile, tok: float, attention_fwd: float,
                        score_bytes: float, moe_fwd: float, hidden_bytes: float,
                        modules: tuple[str, ...] = RECOMPUTE_MODULES) -> float:
    """The forward work Megatron-LM's selective recompute runs again in one layer's backward,
    by module: core_attn the attention forward (with its softmax passes when unfused), moe the
    whole MoE block's forward, `moe_fwd` (router, dispatch, experts and combine: megatron-core
    0.16 `moe_layer.py` checkpoints them together), moe_act the experts' activation alone,
    layernorm an MoE layer's pre-MLP norm (one read and one write of the sequence-sharded
    hidden state, `hidden_bytes`; megatron-core 0.16 `transformer_layer.py` skips the norms
    Transformer Engine fuses into the next GEMM, which are all the others)."""
    modules = [m for m in r.recompute_modules if m in modules]
    t = 0.0
    if "core_attn" in modules:
        t += attention_fwd + memory_time(4.5 * score_bytes, gpu)
    if "moe" in modules:
        t += moe_fwd
    elif r.num_experts and "moe_act" in modules:
        t += memory_time(expert_activation_bytes(r, tok), gpu)
    if r.num_experts and "layernorm" in modules:
        t += memory_time(2 * hidden_bytes, gpu)
    return t


def logits_cost(r: Run, gpu: GpuProfile) -> Cost:
    """The output layer and the cross-entropy. The output layer is megatron-core's own
    ColumnParallelLinear (0.16, `gpt_model.py`), a torch matmul outside Transformer Engine, so
    an FP8 run computes its logits in BF16."""
    c = Cost()
    tok = r.micro_batch * r.seq_length / r.cp
    precision = "bf16" if r.precision == "fp8" else r.precision
    f, b = gemm_fwd_bwd(tok, r.padded_vocab / r.tp, r.hidden, gpu, precision)
    c.fwd["gemm"], c.bwd["gemm"] = f, b
    ce = tok * r.padded_vocab / r.tp * 4
    c.fwd["elementwise"] = memory_time(CE_PASSES_FWD * ce, gpu)
    c.bwd["elementwise"] = memory_time(CE_PASSES_BWD * ce, gpu)
    return c
