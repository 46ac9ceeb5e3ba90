"""Which `transformers` architecture each of our models is, and the tensor maps both ways.

    ours (megatron-core, local spec)          transformers
    learned + LayerNorm + GELU + biases, MHA  GPT2LMHeadModel    (tied or untied)
    RoPE + RMSNorm + SwiGLU (biases or none)  LlamaForCausalLM   (GQA, tied or untied)
    the same with Q/K/V biases only           Qwen2ForCausalLM
    the same with query/key norms, no biases  Qwen3ForCausalLM
    the Llama row with MoE experts, no biases MixtralForCausalLM (softmax top-k router)
    the Qwen3 row with MoE experts            Qwen3MoeForCausalLM (top-k renormalized)

Heads of any width (--kv-channels, transformers' head_dim; not GPT-2), any RoPE period
(--rotary-base, rope_theta), Llama 3.1's RoPE scaling (--use-rope-scaling and its factor,
rope_type "llama3") and norm epsilon (--norm-epsilon) map both ways.

Everything else has no faithful target and is refused in one line (see `refusal`): the model
would compute something else in `transformers`. Names are megatron's at TP = 1 (see
checkpoint_io) and transformers' in-memory ones; `save_pretrained` writes its own file format.

megatron's fused QKV weight holds, for each query group, that group's query heads, then its key
head, then its value head; transformers keeps q, k and v apart (GPT-2: one [q; k; v] Conv1D
with [in, out] weights). SwiGLU's fc1 is [gate; up], as is Mixtral's gate_up_proj.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import (
    GPT2Config,
    LlamaConfig,
    MixtralConfig,
    PretrainedConfig,
    Qwen2Config,
    Qwen3Config,
    Qwen3MoeConfig,
)

from megatron_lgs.convert.errors import ConvertError
from megatron_lgs.run_config import ModelConfig

# megatron-core's Llama 3.1 RoPE scaling (`RotaryEmbedding._apply_scaling`, 0.16) fixes all its
# parameters but the factor; an HF config with other values would rotate differently.
LLAMA3_ROPE = {"low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}
MAPPED = ("GPT-2 (learned positions + LayerNorm + GELU, exact or tanh, + biases, multi-head "
          "attention), "
          "Llama (RoPE + RMSNorm + SwiGLU), Qwen2 (Llama's with Q/K/V biases only), "
          "Qwen3 (Llama's with query/key norms, no biases), "
          "Mixtral (Llama's with MoE experts, no biases), Qwen3-MoE (Qwen3's with MoE experts)")
# transformers' names of GELU's tanh approximation (--openai-gelu): GPT-2's own, and torch's.
TANH_GELU = ("gelu_new", "gelu_pytorch_tanh")
# Families whose layers carry per-head query/key norms, and whose MLPs are experts.
QK_NORM_FAMILIES = ("qwen3", "qwen3_moe")
MOE_FAMILIES = ("mixtral", "qwen3_moe")


@dataclass(frozen=True)
class Shape:
    """The dimensions the maps need."""
    layers: int
    hidden: int
    heads: int
    groups: int
    ffn: int
    experts: int | None
    vocab: int  # the tokenizer's vocabulary (no padding)
    tied: bool
    bias: bool
    kv_channels: int | None = None  # one head's width; hidden / heads when None
    qkv_bias: bool = False  # biases on Q, K and V even without `bias` (Qwen2)

    @property
    def head_dim(self) -> int:
        return self.kv_channels or self.hidden // self.heads


def shape_of(m: ModelConfig, vocab: int) -> Shape:
    ffn = (m.moe_ffn_hidden_size or m.ffn_size) if m.num_experts else m.ffn_size
    return Shape(m.num_layers, m.hidden_size, m.num_attention_heads, m.query_groups, ffn,
                 m.num_experts, vocab, not m.untie_embeddings_and_output_weights,
                 m.add_bias_linear, m.kv_channels, m.add_qkv_bias)


def family(m: ModelConfig) -> str:
    """gpt2 | llama | qwen2 | qwen3 | mixtral | qwen3_moe, or ConvertError naming the option that
    has no target."""
    rope, rms, swiglu = (m.position_embedding_type == "rope", m.normalization == "RMSNorm",
                         m.swiglu)
    gqa = m.group_query_attention and m.num_query_groups not in (None, m.num_attention_heads)
    llama_like = rope and rms and swiglu and not m.add_bias_linear and not m.num_experts
    if m.add_qkv_bias:
        if not llama_like or m.qk_layernorm:
            raise ConvertError("cannot export: Q/K/V-only biases map onto Qwen2 only, which "
                               "needs RoPE, RMSNorm, SwiGLU, no other biases, no experts and no "
                               "query/key norms; this model has " + _describe(m))
        return "qwen2"
    if m.num_experts:
        if m.moe_expert_capacity_factor is not None:
            raise ConvertError("cannot export: --moe-expert-capacity-factor drops tokens in the "
                               "forward pass; transformers' MoE models are dropless")
        if m.moe_router_load_balancing_type == "sinkhorn":
            raise ConvertError("cannot export: the sinkhorn router scores experts with a "
                               "sigmoid at inference; Mixtral's router is a softmax top-k")
    if m.qk_layernorm:
        if not (rope and rms and swiglu and not m.add_bias_linear):
            raise ConvertError("cannot export: query/key norms map onto Qwen3 and Qwen3-MoE "
                               "only, which need RoPE, RMSNorm, SwiGLU and no linear biases; "
                               "this model has " + _describe(m))
        return "qwen3_moe" if m.num_experts else "qwen3"
    if m.num_experts:
        if not (rope and rms and swiglu and not m.add_bias_linear):
            raise ConvertError("cannot export: MoE maps onto Mixtral, which needs RoPE, RMSNorm, "
                               "SwiGLU experts and no linear biases; this model has "
                               + _describe(m))
        return "mixtral"
    if rope and rms and swiglu:
        return "llama"
    if not rope and not rms and not swiglu and m.add_bias_linear and not gqa:
        if m.head_dim * m.num_attention_heads != m.hidden_size:
            raise ConvertError(f"cannot export: GPT-2's heads are hidden / heads wide; this "
                               f"model's are {m.head_dim} (--kv-channels)")
        return "gpt2"
    raise ConvertError(f"cannot export: no transformers architecture computes {_describe(m)}; "
                       f"mapped are {MAPPED}")


def _describe(m: ModelConfig) -> str:
    gqa = m.group_query_attention and m.num_query_groups not in (None, m.num_attention_heads)
    return (f"{'RoPE' if m.position_embedding_type == 'rope' else 'learned positions'} + "
            f"{m.normalization} + {'SwiGLU' if m.swiglu else 'GELU'} + "
            f"{'biases' if m.add_bias_linear else 'no biases'}"
            f"{' + Q/K/V biases' if m.add_qkv_bias else ''}"
            f"{' + query/key norms' if m.qk_layernorm else ''}"
            f"{' + grouped-query attention' if gqa else ''}"
            f"{' + MoE experts' if m.num_experts else ''}")


def _rope_parameters(m: ModelConfig) -> dict:
    theta = {"rope_theta": float(m.rotary_base)}
    if not m.use_rope_scaling:
        return {"rope_type": "default", **theta}
    return {"rope_type": "llama3", **theta, "factor": float(m.rope_scaling_factor),
            **LLAMA3_ROPE}


def hf_config(m: ModelConfig, vocab: int, eod_id: int | None, dtype: str) -> PretrainedConfig:
    s, kind = shape_of(m, vocab), family(m)
    max_positions = m.max_position_embeddings or m.seq_length
    common = dict(vocab_size=vocab, bos_token_id=eod_id, eos_token_id=eod_id,
                  tie_word_embeddings=s.tied, dtype=dtype)
    if kind == "gpt2":
        return GPT2Config(n_positions=max_positions, n_embd=s.hidden, n_layer=s.layers,
                          n_head=s.heads, n_inner=s.ffn,
                          activation_function="gelu_new" if m.openai_gelu else "gelu",
                          resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                          layer_norm_epsilon=m.norm_epsilon, **common)
    llama = dict(hidden_size=s.hidden, intermediate_size=s.ffn, num_hidden_layers=s.layers,
                 num_attention_heads=s.heads, num_key_value_heads=s.groups, head_dim=s.head_dim,
                 hidden_act="silu", max_position_embeddings=max_positions,
                 rms_norm_eps=m.norm_epsilon,
                 rope_parameters=_rope_parameters(m), attention_dropout=0.0, **common)
    if kind == "llama":
        return LlamaConfig(attention_bias=s.bias, mlp_bias=s.bias, **llama)
    if kind == "qwen2":
        return Qwen2Config(use_sliding_window=False, **llama)
    if kind == "qwen3":
        return Qwen3Config(attention_bias=False, use_sliding_window=False, **llama)
    if kind == "qwen3_moe":
        # megatron-core's router takes the softmax over the top-k logits: Qwen3-MoE's softmax
        # over all experts with the top k renormalized (norm_topk_prob). Every layer is sparse.
        return Qwen3MoeConfig(num_experts=s.experts, num_experts_per_tok=m.moe_router_topk,
                              moe_intermediate_size=s.ffn, norm_topk_prob=True,
                              decoder_sparse_step=1, mlp_only_layers=[],
                              router_aux_loss_coef=m.moe_aux_loss_coeff, attention_bias=False,
                              use_sliding_window=False, **llama)
    return MixtralConfig(num_local_experts=s.experts, num_experts_per_tok=m.moe_router_topk,
                         router_aux_loss_coef=m.moe_aux_loss_coeff, router_jitter_noise=0.0,
                         sliding_window=None, **llama)


# -- ours -> transformers -------------------------------------------------------------------------

def _split_qkv(w: torch.Tensor, s: Shape) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    per_group = s.heads // s.groups
    grouped = w.reshape(s.groups, (per_group + 2) * s.head_dim, *w.shape[1:])
    q, k, v = grouped.split([per_group * s.head_dim, s.head_dim, s.head_dim], dim=1)
    return (q.reshape(s.heads * s.head_dim, *w.shape[1:]),
            k.reshape(s.groups * s.head_dim, *w.shape[1:]),
            v.reshape(s.groups * s.head_dim, *w.shape[1:]))


def _join_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, s: Shape) -> torch.Tensor:
    per_group = s.heads // s.groups
    rest = q.shape[1:]
    grouped = torch.cat([q.reshape(s.groups, per_group * s.head_dim, *rest),
                         k.reshape(s.groups, s.head_dim, *rest),
                         v.reshape(s.groups, s.head_dim, *rest)], dim=1)
    return grouped.reshape(-1, *rest)


def to_hf(ours: dict[str, torch.Tensor], m: ModelConfig, vocab: int) -> dict[str, torch.Tensor]:
    """megatron's full tensors -> transformers' state dict (vocabulary padding removed)."""
    s, kind = shape_of(m, vocab), family(m)
    hf: dict[str, torch.Tensor] = {}
    embed = ours["embedding.word_embeddings.weight"][:vocab]
    output = None if s.tied else ours["output_layer.weight"][:vocab]
    for i in range(s.layers):
        src = f"decoder.layers.{i}."
        if kind == "gpt2":
            _gpt2_layer(ours, src, f"transformer.h.{i}.", s, hf)
        else:
            _llama_layer(ours, src, f"model.layers.{i}.", s, kind, hf)
    if kind == "gpt2":
        hf["transformer.wte.weight"] = embed
        hf["transformer.wpe.weight"] = ours["embedding.position_embeddings.weight"]
        hf["transformer.ln_f.weight"] = ours["decoder.final_layernorm.weight"]
        hf["transformer.ln_f.bias"] = ours["decoder.final_layernorm.bias"]
    else:
        hf["model.embed_tokens.weight"] = embed
        hf["model.norm.weight"] = ours["decoder.final_layernorm.weight"]
    hf["lm_head.weight"] = embed if output is None else output
    return {k: v.contiguous() for k, v in hf.items()}


# GPT-2's per-layer names beside ours (both directions use them; its Linear-like modules are
# Conv1D, stored [in, out], so their weights are transposed on the way).
_GPT2_NORMS = (("input_layernorm", "ln_1"), ("pre_mlp_layernorm", "ln_2"))
_GPT2_LINEARS = (("self_attention.linear_proj", "attn.c_proj"), ("mlp.linear_fc1", "mlp.c_fc"),
                 ("mlp.linear_fc2", "mlp.c_proj"))


def _gpt2_layer(ours: dict, src: str, dst: str, s: Shape, hf: dict) -> None:
    for a, b in _GPT2_NORMS:
        hf[f"{dst}{b}.weight"] = ours[f"{src}{a}.weight"]
        hf[f"{dst}{b}.bias"] = ours[f"{src}{a}.bias"]
    qkv_w, qkv_b = (torch.cat(_split_qkv(ours[f"{src}self_attention.linear_qkv.{p}"], s))
                    for p in ("weight", "bias"))
    hf[f"{dst}attn.c_attn.weight"] = qkv_w.t()  # Conv1D: [in, out]
    hf[f"{dst}attn.c_attn.bias"] = qkv_b
    for a, b in _GPT2_LINEARS:
        hf[f"{dst}{b}.weight"] = ours[f"{src}{a}.weight"].t()
        hf[f"{dst}{b}.bias"] = ours[f"{src}{a}.bias"]


def _qkv_params(s: Shape) -> tuple[str, ...]:
    return ("weight", "bias") if s.bias or s.qkv_bias else ("weight",)


# Qwen3's per-head query and key norms beside ours.
_QK_NORMS = (("q_layernorm", "q_norm"), ("k_layernorm", "k_norm"))


def _llama_layer(ours: dict, src: str, dst: str, s: Shape, kind: str, hf: dict) -> None:
    hf[f"{dst}input_layernorm.weight"] = ours[f"{src}input_layernorm.weight"]
    hf[f"{dst}post_attention_layernorm.weight"] = ours[f"{src}pre_mlp_layernorm.weight"]
    for p in _qkv_params(s):
        for name, t in zip(("q_proj", "k_proj", "v_proj"),
                           _split_qkv(ours[f"{src}self_attention.linear_qkv.{p}"], s),
                           strict=True):
            hf[f"{dst}self_attn.{name}.{p}"] = t
    for p in ("weight", "bias") if s.bias else ("weight",):
        hf[f"{dst}self_attn.o_proj.{p}"] = ours[f"{src}self_attention.linear_proj.{p}"]
        if not s.experts:
            gate, up = ours[f"{src}mlp.linear_fc1.{p}"].chunk(2, dim=0)
            hf[f"{dst}mlp.gate_proj.{p}"], hf[f"{dst}mlp.up_proj.{p}"] = gate, up
            hf[f"{dst}mlp.down_proj.{p}"] = ours[f"{src}mlp.linear_fc2.{p}"]
    for ours_name, hf_name in _QK_NORMS if kind in QK_NORM_FAMILIES else ():
        hf[f"{dst}self_attn.{hf_name}.weight"] = ours[f"{src}self_attention.{ours_name}.weight"]
    if s.experts:
        experts = f"{src}mlp.experts.local_experts."
        hf[f"{dst}mlp.gate.weight"] = ours[f"{src}mlp.router.weight"]
        hf[f"{dst}mlp.experts.gate_up_proj"] = torch.stack(
            [ours[f"{experts}{e}.linear_fc1.weight"] for e in range(s.experts)])
        hf[f"{dst}mlp.experts.down_proj"] = torch.stack(
            [ours[f"{experts}{e}.linear_fc2.weight"] for e in range(s.experts)])


# -- transformers -> ours -------------------------------------------------------------------------

def model_config_from_hf(config: PretrainedConfig) -> ModelConfig:
    """Our model flags for a transformers config, or ConvertError for what we cannot express."""
    kind = config.model_type
    if kind not in ("gpt2", "llama", "qwen2", *QK_NORM_FAMILIES, *MOE_FAMILIES):
        archs = ", ".join(getattr(config, "architectures", None) or [kind])
        raise ConvertError(f"cannot import {archs}: model type {kind!r} has no megatron-lgs "
                           f"mapping; mapped are {MAPPED}")
    if kind == "gpt2":
        c = config
        _require(c.activation_function in ("gelu", *TANH_GELU), "gpt2", f"activation_function "
                 f"{c.activation_function!r} (the trainer's GELUs are the exact one, 'gelu', and "
                 f"its tanh approximation, {' or '.join(map(repr, TANH_GELU))}: --openai-gelu)")
        _require(not c.scale_attn_by_inverse_layer_idx and c.scale_attn_weights, "gpt2",
                 "attention scaled other than by 1/sqrt(head_dim)")
        return ModelConfig(
            num_layers=c.n_layer, hidden_size=c.n_embd, ffn_hidden_size=_ffn(c.n_inner, c.n_embd),
            num_attention_heads=c.n_head, seq_length=c.n_positions,
            norm_epsilon=c.layer_norm_epsilon, hidden_dropout=0.0, attention_dropout=0.0,
            untie_embeddings_and_output_weights=not c.tie_word_embeddings,
            openai_gelu=c.activation_function in TANH_GELU)
    c = config
    rope = c.rope_parameters or {}
    theta = float(rope.get("rope_theta", ModelConfig.rotary_base))
    scaled = rope.get("rope_type", "default") == "llama3"
    _require(rope.get("rope_type", "default") in ("default", "llama3") and theta.is_integer()
             and (not scaled or all(float(rope.get(k, -1)) == v for k, v in LLAMA3_ROPE.items())),
             kind, f"rope parameters {dict(rope)} (the trainer's RoPE is unscaled or scaled as "
             f"Llama 3.1's with {LLAMA3_ROPE}, and its --rotary-base is an integer)")
    _require(c.hidden_act == "silu", kind, f"hidden_act {c.hidden_act!r} (SwiGLU needs 'silu')")
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    bias = bool(getattr(c, "attention_bias", False))
    _require(bias == bool(getattr(c, "mlp_bias", bias)), kind,
             "attention_bias != mlp_bias (the trainer's biases are all or none)")
    if kind in QK_NORM_FAMILIES:
        _require(not bias, kind, "attention biases (Qwen3's MLP has none; the trainer's biases "
                 "are all or none)")
    if kind in ("qwen2", *QK_NORM_FAMILIES):
        _require(not c.use_sliding_window, kind, "a sliding window")
    if kind == "qwen3_moe":
        _require(c.norm_topk_prob, kind, "norm_topk_prob false (megatron-core's router "
                 "renormalizes the top-k probabilities)")
        _require(c.decoder_sparse_step == 1 and not c.mlp_only_layers, kind,
                 "dense MLP layers between the sparse ones (decoder_sparse_step, "
                 "mlp_only_layers)")
    if kind == "mixtral":
        _require(not bias and not c.router_jitter_noise, kind, "router jitter or biases")
        _require(getattr(c, "sliding_window", None) is None, kind, "a sliding window")
    groups, moe = c.num_key_value_heads, kind in MOE_FAMILIES
    experts = expert_ffn = None
    if kind == "mixtral":
        experts, expert_ffn = c.num_local_experts, c.intermediate_size
    elif kind == "qwen3_moe":
        experts, expert_ffn = c.num_experts, c.moe_intermediate_size
    return ModelConfig(
        num_layers=c.num_hidden_layers, hidden_size=c.hidden_size,
        ffn_hidden_size=None if moe else _ffn(c.intermediate_size, c.hidden_size),
        num_attention_heads=c.num_attention_heads,
        group_query_attention=groups != c.num_attention_heads,
        num_query_groups=groups if groups != c.num_attention_heads else None,
        kv_channels=None if head_dim * c.num_attention_heads == c.hidden_size else head_dim,
        seq_length=c.max_position_embeddings,
        position_embedding_type="rope", rotary_base=int(theta), use_rope_scaling=scaled,
        rope_scaling_factor=float(rope["factor"]) if scaled else ModelConfig.rope_scaling_factor,
        normalization="RMSNorm",
        norm_epsilon=c.rms_norm_eps, qk_layernorm=kind in QK_NORM_FAMILIES, swiglu=True,
        add_qkv_bias=kind == "qwen2",
        add_bias_linear=bias, untie_embeddings_and_output_weights=not c.tie_word_embeddings,
        hidden_dropout=0.0, attention_dropout=0.0,
        num_experts=experts,
        moe_ffn_hidden_size=_ffn(expert_ffn, c.hidden_size) if moe else None,
        moe_router_topk=c.num_experts_per_tok if moe else 2,
        moe_aux_loss_coeff=c.router_aux_loss_coef if moe else 1e-2)


def _ffn(size: int | None, hidden: int) -> int | None:
    """None where it is the trainer's default (4 x hidden), so the flags stay short."""
    return None if size in (None, 4 * hidden) else size


def _require(ok: bool, kind: str, what: str) -> None:
    if not ok:
        raise ConvertError(f"cannot import this {kind} model faithfully: {what}")


def from_hf(hf: dict[str, torch.Tensor], m: ModelConfig, vocab: int,
            padded_vocab: int) -> dict[str, torch.Tensor]:
    """transformers' state dict -> megatron's full tensors. The padded vocabulary rows that an
    export dropped come back as zeros."""
    s, kind = shape_of(m, vocab), family(m)
    ours: dict[str, torch.Tensor] = {}

    def pad(t: torch.Tensor) -> torch.Tensor:
        return torch.cat([t, t.new_zeros(padded_vocab - t.shape[0], *t.shape[1:])])

    pre = "transformer." if kind == "gpt2" else "model."
    embed = hf[f"{pre}wte.weight" if kind == "gpt2" else f"{pre}embed_tokens.weight"]
    ours["embedding.word_embeddings.weight"] = pad(embed)
    if not s.tied:
        ours["output_layer.weight"] = pad(hf["lm_head.weight"])
    for i in range(s.layers):
        dst = f"decoder.layers.{i}."
        if kind == "gpt2":
            _gpt2_layer_back(hf, f"transformer.h.{i}.", dst, s, ours)
        else:
            _llama_layer_back(hf, f"model.layers.{i}.", dst, s, kind, ours)
    if kind == "gpt2":
        ours["embedding.position_embeddings.weight"] = hf["transformer.wpe.weight"]
        ours["decoder.final_layernorm.weight"] = hf["transformer.ln_f.weight"]
        ours["decoder.final_layernorm.bias"] = hf["transformer.ln_f.bias"]
    else:
        ours["decoder.final_layernorm.weight"] = hf["model.norm.weight"]
    return {k: v.contiguous() for k, v in ours.items()}


def _gpt2_layer_back(hf: dict, src: str, dst: str, s: Shape, ours: dict) -> None:
    for a, b in _GPT2_NORMS:
        ours[f"{dst}{a}.weight"] = hf[f"{src}{b}.weight"]
        ours[f"{dst}{a}.bias"] = hf[f"{src}{b}.bias"]
    w, b = hf[f"{src}attn.c_attn.weight"].t(), hf[f"{src}attn.c_attn.bias"]
    ours[f"{dst}self_attention.linear_qkv.weight"] = _join_qkv(*w.chunk(3, dim=0), s)
    ours[f"{dst}self_attention.linear_qkv.bias"] = _join_qkv(*b.chunk(3, dim=0), s)
    for a, b_ in _GPT2_LINEARS:
        ours[f"{dst}{a}.weight"] = hf[f"{src}{b_}.weight"].t()
        ours[f"{dst}{a}.bias"] = hf[f"{src}{b_}.bias"]


def _llama_layer_back(hf: dict, src: str, dst: str, s: Shape, kind: str, ours: dict) -> None:
    ours[f"{dst}input_layernorm.weight"] = hf[f"{src}input_layernorm.weight"]
    ours[f"{dst}pre_mlp_layernorm.weight"] = hf[f"{src}post_attention_layernorm.weight"]
    for p in _qkv_params(s):
        ours[f"{dst}self_attention.linear_qkv.{p}"] = _join_qkv(
            *(hf[f"{src}self_attn.{n}.{p}"] for n in ("q_proj", "k_proj", "v_proj")), s)
    for p in ("weight", "bias") if s.bias else ("weight",):
        ours[f"{dst}self_attention.linear_proj.{p}"] = hf[f"{src}self_attn.o_proj.{p}"]
        if not s.experts:
            ours[f"{dst}mlp.linear_fc1.{p}"] = torch.cat(
                [hf[f"{src}mlp.gate_proj.{p}"], hf[f"{src}mlp.up_proj.{p}"]])
            ours[f"{dst}mlp.linear_fc2.{p}"] = hf[f"{src}mlp.down_proj.{p}"]
    for ours_name, hf_name in _QK_NORMS if kind in QK_NORM_FAMILIES else ():
        ours[f"{dst}self_attention.{ours_name}.weight"] = hf[f"{src}self_attn.{hf_name}.weight"]
    if s.experts:
        ours[f"{dst}mlp.router.weight"] = hf[f"{src}mlp.gate.weight"]
        for e in range(s.experts):
            experts = f"{dst}mlp.experts.local_experts.{e}."
            ours[f"{experts}linear_fc1.weight"] = hf[f"{src}mlp.experts.gate_up_proj"][e]
            ours[f"{experts}linear_fc2.weight"] = hf[f"{src}mlp.experts.down_proj"][e]
