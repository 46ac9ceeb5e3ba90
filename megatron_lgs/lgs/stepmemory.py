"""Peak memory per GPU of a run: model states by ZeRO stage, activations by recompute mode.

States per parameter of the heaviest stage: BF16/FP16 weights (2 B), gradient buffer (4 B FP32
with BF16/FP8 unless `grad_reduce_in_fp32` is off; 2 B with FP16), Adam's FP32 master weights
and two moments (12 B, or the run's `optimizer_state_bytes`); ZeRO 1 shards them over the
(expert-)data-parallel group, ZeRO 2
the gradients too, ZeRO 3 the weights too. FP8 runs keep 2 B a weight too when the weights are
FP8 parameters (1 B data + 1 B transpose; Megatron-Bridge's FP8 recipes set
`fp8_param_gather`); with BF16 weights (`fp8_params` false, this trainer's only form)
Transformer Engine caches such an FP8 copy and its transpose beside each local weight across
the step's micro-batches (megatron-core passes `is_first_microbatch`), 2 B more a parameter.
Activations per layer and micro-batch follow Korthikanti et al. 2022 ("Reducing Activation
Recomputation", sec. 4: 34 s b h + 5 a s^2 b bytes with sequence parallelism), generalized to
GQA, SwiGLU, MoE, FP8 (GEMM inputs kept at 1 B), fused attention (which keeps no score matrix
but its output and softmax statistics) and runs without dropout (no masks). The MLP and MoE
blocks' share and the dropout masks are checked against what megatron-core 0.16's own modules
save for backward (tests/unit/lgs/test_activation_memory.py); selective recompute frees what
its modules recompute (`selective_freed_bytes`); full recompute keeps each layer's
input plus one layer's working set; 1F1B holds pp - k micro-batches on stage k, interleaving (1
+ (pp - 1) / (pp v)) times that.
A fixed 10% of the board (its memory as the driver reports it, `gpus` [NVML]) is reserved for
the CUDA context, NCCL buffers and fragmentation.
"""

from __future__ import annotations

from dataclasses import dataclass

from megatron_lgs.lgs.gpus import GPUS
from megatron_lgs.lgs.runspec import Run

RESERVE_FRACTION = 0.10
GB = 1e9


@dataclass(frozen=True)
class MemoryEstimate:
    states_bytes: float
    activation_bytes: float
    limit_bytes: float

    @property
    def peak_bytes(self) -> float:
        return self.states_bytes + self.activation_bytes

    @property
    def fits(self) -> bool:
        return self.peak_bytes <= self.limit_bytes


def grad_bytes(r: Run) -> int:
    return 4 if r.grad_reduce_in_fp32 and r.precision != "fp16" else 2


def states_bytes(r: Run, dense_params: float, expert_params: float) -> float:
    dp = r.dp * r.cp
    edp = r.expert_dp if r.num_experts else 1
    params = dense_params + expert_params
    sharded = dense_params / dp + expert_params / edp
    # ZeRO 3 holds the gathered weights of the layer in use and of the one prefetched.
    gathered = 2 * 2 * params / (r.num_layers // r.pp) if r.zero >= 3 else 0.0
    weights = 2 * (sharded if r.zero >= 3 else params) + gathered
    if r.precision == "fp8" and not r.fp8_params:
        weights += 2 * params  # TE's cached FP8 weight and transpose, every local layer
    grads = grad_bytes(r) * (sharded if r.zero >= 2 else params)
    optim = r.optimizer_state_bytes * (sharded if r.zero >= 1 else params)
    return weights + grads + optim


def saved_input_bytes(r: Run) -> int:
    """Bytes of an element of a GEMM input kept for the weight gradient: FP8 when the GEMM runs
    in FP8 (Transformer Engine keeps the quantized input: `linear.py`, `layernorm_linear.py`,
    `layernorm_mlp.py` of v2.7), else BF16/FP16."""
    return 1 if r.precision == "fp8" else 2


def mlp_block_bytes(r: Run) -> float:
    """Bytes per token of the micro-batch that the MLP or MoE block keeps for backward on one
    GPU: its input as its first GEMM (or the router) keeps it, and its experts' GEMM inputs
    and activation input. megatron-core 0.16 applies the router's probabilities inside the
    experts' fused activation (`weighted_bias_swiglu_impl`, which keeps its input and the
    probabilities) and unpermutes without them, so no expert output is kept."""
    t = r.tp
    sp = t if r.sequence_parallel else 1
    h = r.hidden
    x = saved_input_bytes(r)
    mats = 2 if r.swiglu else 1
    if not r.num_experts:
        f = r.ffn_hidden / t
        return x * h / sp + 2 * f * mats + x * f
    f = r.expert_ffn / r.etp
    expert_tokens = r.moe_topk / t * r.etp
    # The router keeps its BF16 input, FP32 logits, top-k indices and probabilities; the
    # dispatcher its routing map: 7 E + 30 k bytes a token, measured on megatron-core 0.16.
    routing = 2 * h + 7 * r.num_experts + 30 * r.moe_topk
    return routing / sp + expert_tokens * (x * h + 2 * f * mats + x * f)


def layer_activation_bytes(r: Run) -> tuple[float, float, float]:
    """(all bytes kept for backward, of which the score matrices, the layer input alone) of one
    layer, one micro-batch, one GPU."""
    t = r.tp
    sp = t if r.sequence_parallel else 1
    tok = r.micro_batch * r.seq_length / r.cp
    h, kv = r.hidden, r.kv_dim
    # Norm inputs, QKV / fc1 inputs, dropout masks (1 B) are sequence-sharded with SP; Q, K, V,
    # the projection input and the MLP activations are head-sharded.
    x = saved_input_bytes(r)
    mask = 1 if r.dropout > 0 else 0  # torch's dropout keeps no mask at p = 0
    attn = (2 * h + x * h + mask * h) / sp + (2 * r.q_dim + 4 * kv + x * r.q_dim) / t
    if r.qk_layernorm:  # each norm keeps its input, BF16
        attn += 2 * (r.q_dim + kv) / t
    scores = 0.0
    if r.flash_attention:
        # Fused attention keeps Q, K, V, its BF16 output and FP32 softmax statistics, 4 B a head
        # (TE v2.7-2.17 `FusedAttnFunc`); with BF16 GEMMs that output is the projection's saved
        # input, with FP8 ones the projection keeps its own FP8 copy beside it.
        attn += (2 * r.q_dim if x == 1 else 0) / t + 4 * r.heads / t
    else:
        # The softmax output and, with dropout, the mask and the dropped output: 5 B a score.
        scores = (2 + 3 * mask) * (r.heads / t) * r.seq_length
    mlp = (2 * h + mask * h) / sp + mlp_block_bytes(r)  # + the MLP norm's input, the mask
    return tok * (attn + scores + mlp), tok * scores, tok * 2 * h / sp


def selective_freed_bytes(r: Run, layer: tuple[float, float, float]) -> float:
    """Bytes of one layer, one micro-batch, one GPU that selective recompute does not keep, by
    module (`Run.recompute_modules`), of the layer's `layer_activation_bytes` (all kept, the
    score matrices, the layer input): core_attn the score matrices (fused attention keeps none);
    moe all the MoE block keeps but its BF16 input, hidden-sized like the layer's (megatron-core
    0.16 `moe_layer.py` checkpoints the block); moe_act the experts' second GEMM input, which
    megatron-core 0.16 discards after that GEMM's forward and recomputes (`experts.py`,
    CheckpointWithoutOutput; with FP8 the GEMM keeps the original BF16 input, discarded the same
    way); layernorm an MoE layer's pre-MLP norm output, the router's saved input or, with moe,
    the block's (the attention and dense MLP norms are fused into the next GEMM)."""
    _, scores, block_input = layer
    modules = r.recompute_modules
    freed = scores if "core_attn" in modules else 0.0
    if not r.num_experts:
        return freed
    tok = r.micro_batch * r.seq_length / r.cp
    if "moe" in modules:
        freed += tok * mlp_block_bytes(r) - block_input
    elif "moe_act" in modules:
        freed += tok * r.moe_topk / r.tp * r.etp * saved_input_bytes(r) * r.expert_ffn / r.etp
    if "layernorm" in modules:
        freed += block_input
    return freed


def activation_bytes(r: Run, stage: int) -> float:
    per_stage = r.stage_layers[stage]
    layer = layer_activation_bytes(r)
    full, _, inp = layer
    kept = full - selective_freed_bytes(r, layer) if r.recompute == "selective" else full
    recomputed = r.recomputed_layers(stage)
    inflight = min(r.num_micro_batches, r.pp - stage)
    if r.vpp > 1:
        inflight *= 1 + (r.pp - 1) / (r.pp * r.vpp)
    act = ((per_stage - recomputed) * kept + recomputed * inp) * inflight
    if recomputed:
        act += full  # the layer being recomputed
    tok = r.micro_batch * r.seq_length / r.cp
    if stage == r.pp - 1:
        act += tok * r.padded_vocab / r.tp * 4 * 2  # FP32 logits and their gradient
    return act


def estimate_memory(r: Run, stage_params: list[tuple[float, float]]) -> MemoryEstimate:
    """Heaviest stage's states + activations; `stage_params[k]` = (dense, expert) per GPU."""
    worst_states, worst_act = 0.0, 0.0
    for k, (dense, expert) in enumerate(stage_params):
        s, a = states_bytes(r, dense, expert), activation_bytes(r, k)
        if s + a > worst_states + worst_act:
            worst_states, worst_act = s, a
    limit = GPUS[r.gpu].memory_gb * GB * (1 - RESERVE_FRACTION)
    return MemoryEstimate(worst_states, worst_act, limit)
