"""megatron-core GPTModel from the model/parallel/precision configs.

The layer spec follows the platform: Transformer Engine modules where TE runs, megatron-core's
local modules elsewhere (CPU). Parameter names differ between the two; only the sharded
dist_checkpointing format maps between them.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from collections.abc import Callable

import torch
import torch.nn.functional as F
from megatron.core import parallel_state
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import (
    get_gpt_layer_local_spec,
    get_gpt_layer_with_transformer_engine_spec,
)
from megatron.core.transformer import ModuleSpec, TransformerConfig
from megatron.core.transformer.module import Float16Module
from megatron.core.transformer.transformer_block import (
    TransformerBlockSubmodules,
    get_num_layers_to_build,
)
from megatron.core.transformer.transformer_layer import TransformerLayer

from megatron_lgs.context_parallel import use_context_parallel_attention
from megatron_lgs.init_weights import initialize_layout_independent
from megatron_lgs.platform import Platform
from megatron_lgs.run_config import Config, ModelConfig
from megatron_lgs.vocab_padding import padded_vocab_size


def fused_softmax_kernels_available() -> bool:
    """Megatron-LM's compiled softmax extensions, which megatron-core's FusedScaleMaskSoftmax
    imports by name; no wheel carries them."""
    return all(importlib.util.find_spec(name) is not None for name in
               ("scaled_masked_softmax_cuda", "scaled_upper_triang_masked_softmax_cuda"))


def use_transformer_engine(cfg: Config, platform: Platform) -> bool:
    impl = cfg.model.transformer_impl
    return impl == "transformer_engine" or (impl == "auto" and platform.te_available)


def rope_fusion(cfg: Config, platform: Platform) -> bool:
    """Transformer Engine's fused RoPE kernel, as Megatron-LM runs it unless told
    --no-rope-fusion: only on a GPU with TE, the one place the kernel exists (megatron-core
    refuses the fusion without it); elsewhere megatron-core's torch ops, which compute the same
    rotation in 12 kernels forward instead of one."""
    m = cfg.model
    return (m.apply_rope_fusion and m.position_embedding_type == "rope" and platform.is_cuda
            and platform.te_available)


def params_dtype(cfg: Config) -> torch.dtype:
    return torch.bfloat16 if cfg.precision.bf16 else torch.float16 if cfg.precision.fp16 \
        else torch.float32


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """GELU's tanh approximation: OpenAI's GPT-2 (Hugging Face's `gelu_new`), --openai-gelu."""
    return F.gelu(x, approximate="tanh")


def mlp_activation(m: ModelConfig, on_gpu: bool) -> tuple[Callable, bool]:
    """(activation_func, bias_activation_fusion) of megatron-core's MLP. Its fused bias-GeLU
    (`fusions.fused_bias_gelu`, which the MLP takes whenever the fusion is on and the
    activation is F.gelu) computes the tanh approximation, so it serves --openai-gelu alone:
    the exact GELU runs unfused on a GPU as on a CPU, so a model computes the function its
    flags name wherever it runs, and exports as what it computed. (Until 2026-12-07 a GELU
    model's GPU runs took the fused kernel: they trained the tanh form and exported the exact
    one.)"""
    if m.swiglu:
        return F.silu, False
    if m.openai_gelu and on_gpu and m.add_bias_linear:
        return F.gelu, True
    return (gelu_tanh if m.openai_gelu else F.gelu), False


def transformer_config(cfg: Config, platform: Platform) -> TransformerConfig:
    m, par = cfg.model, cfg.parallel
    dtype = params_dtype(cfg)
    on_gpu = platform.is_cuda
    activation_func, fused_activation = mlp_activation(m, on_gpu)
    return TransformerConfig(
        num_layers=m.num_layers,
        hidden_size=m.hidden_size,
        ffn_hidden_size=m.ffn_size,
        num_attention_heads=m.num_attention_heads,
        num_query_groups=m.num_query_groups if m.group_query_attention else None,
        kv_channels=m.kv_channels,
        init_method_std=m.init_method_std,
        hidden_dropout=m.hidden_dropout,
        attention_dropout=m.attention_dropout,
        add_bias_linear=m.add_bias_linear,
        add_qkv_bias=m.add_qkv_bias,
        normalization=m.normalization,
        layernorm_epsilon=m.norm_epsilon,
        qk_layernorm=m.qk_layernorm,
        gated_linear_unit=m.swiglu,
        activation_func=activation_func,
        tensor_model_parallel_size=par.tensor_model_parallel_size,
        pipeline_model_parallel_size=par.pipeline_model_parallel_size,
        context_parallel_size=par.context_parallel_size,
        expert_model_parallel_size=par.expert_model_parallel_size,
        expert_tensor_parallel_size=par.expert_tensor_parallel_size,
        sequence_parallel=par.sequence_parallel,
        virtual_pipeline_model_parallel_size=par.virtual_pipeline_size(m.num_layers),
        num_layers_in_first_pipeline_stage=par.decoder_first_pipeline_num_layers,
        num_layers_in_last_pipeline_stage=par.decoder_last_pipeline_num_layers,
        account_for_embedding_in_pipeline_split=par.account_for_embedding_in_pipeline_split,
        account_for_loss_in_pipeline_split=par.account_for_loss_in_pipeline_split,
        # Batched isend/irecv gives silently wrong gradients on gloo when both pipeline
        # neighbours are the same rank (PP=2); separate sends and receives are correct.
        batch_p2p_comm=on_gpu,
        recompute_granularity=m.recompute_granularity,
        recompute_method=m.recompute_method,
        recompute_num_layers=m.recompute_num_layers,
        num_moe_experts=m.num_experts,
        moe_ffn_hidden_size=m.moe_ffn_hidden_size or (m.ffn_size if m.num_experts else None),
        moe_router_topk=m.moe_router_topk,
        moe_router_load_balancing_type=m.moe_router_load_balancing_type,
        moe_aux_loss_coeff=m.moe_aux_loss_coeff if m.num_experts else 0.0,
        moe_z_loss_coeff=m.moe_z_loss_coeff,
        moe_expert_capacity_factor=m.moe_expert_capacity_factor,
        moe_token_drop_policy=m.moe_token_drop_policy,
        moe_token_dispatcher_type=m.moe_token_dispatcher_type,
        moe_grouped_gemm=m.moe_grouped_gemm,
        overlap_moe_expert_parallel_comm=m.overlap_moe_expert_parallel_comm,
        params_dtype=dtype,
        pipeline_dtype=dtype,
        bf16=cfg.precision.bf16,
        fp16=cfg.precision.fp16,
        fp8=cfg.precision.fp8_format,
        fp8_recipe=cfg.precision.fp8_recipe,
        fp8_margin=cfg.precision.fp8_margin,
        fp8_amax_history_len=cfg.precision.fp8_amax_history_len,
        fp8_amax_compute_algo=cfg.precision.fp8_amax_compute_algo,
        tp_only_amax_red=cfg.precision.tp_only_amax_red,
        # Full weights built once then split; init_weights then redraws every parameter from
        # its global name, so the layout never changes the model.
        use_cpu_initialization=True,
        # Fused kernels exist only on GPU; unfused math elsewhere. The softmax fusion needs
        # Megatron-LM's compiled softmax kernels (megatron-core imports them on the first
        # fp16/bf16 forward and fails without them); megatron-core's fused bias-GeLU refuses a
        # model without linear biases; the persistent layer norm is Apex's, and the torch norm
        # of the local spec asserts it off (TE's norm does not read it).
        masked_softmax_fusion=on_gpu and fused_softmax_kernels_available(),
        bias_activation_fusion=fused_activation,
        bias_dropout_fusion=on_gpu,
        apply_rope_fusion=rope_fusion(cfg, platform),
        gradient_accumulation_fusion=False,
        persist_layer_norm=False,
    )


class SequenceParallelNorm:
    """torch's LayerNorm/RMSNorm for the local spec with sequence parallelism: megatron-core's
    WrappedTorchNorm refuses SP, yet a norm acts per token, so it is correct on a sequence shard
    as long as its weight gradients, partial over this rank's tokens, are summed over the
    tensor-parallel group. Marking the weights `sequence_parallel` makes megatron-core's
    finalize_model_grads do exactly that. The query and key norms (`--qk-layernorm`) act per
    head on this rank's heads; their gradients are summed over the group by name, once."""

    def __new__(cls, config: TransformerConfig, hidden_size: int, eps: float = 1e-5,
                **_: object) -> torch.nn.Module:
        norm_cls = torch.nn.RMSNorm if config.normalization == "RMSNorm" else torch.nn.LayerNorm
        norm = norm_cls(normalized_shape=hidden_size, eps=eps)
        for param in norm.parameters():
            param.sequence_parallel = config.sequence_parallel
        return norm


def local_block_spec(cfg: Config, config: TransformerConfig,
                     vp_stage: int | None) -> ModuleSpec | TransformerBlockSubmodules:
    """megatron-core's local layer spec; with context parallelism, its core attention replaced
    by ContextParallelAttention; with sequence parallelism, its norms (and the final norm)
    replaced by SequenceParallelNorm."""
    m = cfg.model
    layer = get_gpt_layer_local_spec(num_experts=m.num_experts,
                                     moe_grouped_gemm=m.moe_grouped_gemm,
                                     normalization=m.normalization,
                                     qk_layernorm=m.qk_layernorm)
    if config.context_parallel_size > 1:
        use_context_parallel_attention(layer)
    if not config.sequence_parallel:
        return layer
    layer = dataclasses.replace(layer, submodules=dataclasses.replace(
        layer.submodules, input_layernorm=SequenceParallelNorm,
        pre_mlp_layernorm=SequenceParallelNorm))
    if m.qk_layernorm:
        attention = layer.submodules.self_attention
        layer.submodules.self_attention = dataclasses.replace(
            attention, submodules=dataclasses.replace(
                attention.submodules, q_layernorm=SequenceParallelNorm,
                k_layernorm=SequenceParallelNorm))
    return TransformerBlockSubmodules(
        layer_specs=[layer] * get_num_layers_to_build(config, vp_stage=vp_stage),
        layer_norm=SequenceParallelNorm)


def build_model(cfg: Config, platform: Platform, vocab_size: int,
                vp_stage: int | None = None) -> torch.nn.Module:
    """One model chunk: this rank's pipeline stage, or its virtual stage `vp_stage` under the
    interleaved schedule. Weights follow init_weights (the same full model on any layout). In
    BF16/FP16 wrapped, as Megatron-LM does, in Float16Module, which casts inputs and outputs at
    the chunk's boundary."""
    config = transformer_config(cfg, platform)
    m = cfg.model
    if use_transformer_engine(cfg, platform):
        spec = get_gpt_layer_with_transformer_engine_spec(
            num_experts=m.num_experts, moe_grouped_gemm=m.moe_grouped_gemm,
            qk_layernorm=m.qk_layernorm)
    else:
        spec = local_block_spec(cfg, config, vp_stage)
    model = GPTModel(
        config=config,
        transformer_layer_spec=spec,
        vocab_size=padded_vocab_size(vocab_size, cfg.model.make_vocab_size_divisible_by,
                                     cfg.parallel.tensor_model_parallel_size),
        max_sequence_length=cfg.model.max_position_embeddings or cfg.model.seq_length,
        pre_process=parallel_state.is_pipeline_first_stage(ignore_virtual=False,
                                                           vp_stage=vp_stage),
        post_process=parallel_state.is_pipeline_last_stage(ignore_virtual=False,
                                                           vp_stage=vp_stage),
        share_embeddings_and_output_weights=not cfg.model.untie_embeddings_and_output_weights,
        position_embedding_type=cfg.model.position_embedding_type,
        rotary_base=cfg.model.rotary_base,
        rope_scaling=cfg.model.use_rope_scaling,
        rope_scaling_factor=cfg.model.rope_scaling_factor,
        vp_stage=vp_stage,
    )
    initialize_layout_independent(model, config, cfg.training.seed)
    model = model.to(platform.device)
    if cfg.precision.bf16 or cfg.precision.fp16:
        model = Float16Module(config, model)
    return model


def num_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def num_transformer_layers(chunks: list[torch.nn.Module]) -> int:
    """Transformer layers this rank holds (its pipeline stage's share, any wrapper)."""
    return sum(isinstance(mod, TransformerLayer) for chunk in chunks for mod in chunk.modules())


def flops_per_token(cfg: Config, vocab_size: int) -> float:
    """Training FLOPs per token (forward + backward = 3x forward), Megatron-LM's formula for
    dense GPT: 6 x parameters in matmuls plus attention's sequence-length term."""
    m = cfg.model
    h, layers, s = m.hidden_size, m.num_layers, m.seq_length
    q = m.num_attention_heads * m.head_dim
    ffn_mult = 3 if m.swiglu else 2
    attention_proj = 2 * h * q + 2 * h * m.query_groups * m.head_dim  # q, out; k, v (GQA)
    per_layer = attention_proj + ffn_mult * h * m.ffn_size
    attention_scores = 2 * s * q  # QK^T and AV, per token, per layer
    return 6.0 * (layers * (per_layer + attention_scores) + h * vocab_size)
