"""Model FLOPs of one training step, counted as Megatron-LM counts them for its TFLOP/s and MFU.

Megatron-LM's `num_floating_point_operations` (megatron/training/training.py, the form of
mid-2024 that produced the README's H100 table, and the one `megatron_lgs.model` logs): every
GEMM runs 3 times (forward, data gradient, weight gradient) at 2 FLOPs per multiply-add, so a
weight of N elements costs 6N per token; attention adds QK^T and AV over the full (not
causally halved) s x s score matrix, 12 s h_q per token and layer; SwiGLU's gate is a third
MLP matrix; GQA shrinks K and V; MoE counts moe_topk experts per token (the router and
capacity padding are not counted); the logits GEMM counts, the embedding lookup does not.
Recompute is never counted (model FLOPs, not hardware FLOPs).
"""

from __future__ import annotations

from megatron_lgs.lgs.runspec import Run


def layer_flops_per_token(r: Run) -> tuple[float, float]:
    """(GEMM FLOPs, attention-score FLOPs) of one transformer layer per token, fwd + bwd."""
    h, q = r.hidden, r.q_dim
    attn_proj = 2 * h * q + 2 * h * r.kv_dim  # Q and out; K and V
    mats = 3 if r.swiglu else 2
    if r.num_experts:
        mlp = mats * h * r.expert_ffn * r.moe_topk
    else:
        mlp = mats * h * r.ffn_hidden
    return 6.0 * (attn_proj + mlp), 12.0 * r.seq_length * q


def logits_flops_per_token(r: Run) -> float:
    return 6.0 * r.hidden * r.padded_vocab


def model_flops_per_step(r: Run, causal: bool = False) -> float:
    """Megatron-LM's count for one global batch (no recompute). `causal`: the score FLOPs
    halved by the causal mask, as Megatron-LM counts them since 2025 (`attn_layer_flops` of
    megatron/training/training.py, dev branch of 2026-08, commit 9c5258f109)."""
    gemm, attn = layer_flops_per_token(r)
    if causal:
        attn /= 2
    tokens = r.global_batch * r.seq_length
    return tokens * (r.num_layers * (gemm + attn) + logits_flops_per_token(r))


def flops_with_full_recompute(r: Run) -> float:
    """Narayanan et al. 2021's count (its Table 1): full recompute adds one more forward of every
    transformer layer, 96 B s l h^2 (1 + s / 6h + V / 16lh) for a GPT with 4h MLP."""
    gemm, attn = layer_flops_per_token(r)
    tokens = r.global_batch * r.seq_length
    return tokens * (r.num_layers * (gemm + attn) * 4 / 3 + logits_flops_per_token(r))
