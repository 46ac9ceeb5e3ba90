"""Which of our models map onto which transformers architecture, and what is refused (no model
is built: the table alone)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from transformers import (
    GPT2Config,
    LlamaConfig,
    MixtralConfig,
    OPTConfig,
    Qwen2Config,
    Qwen3Config,
    Qwen3MoeConfig,
)

import megatron_lgs  # noqa: F401
from megatron_lgs.convert import hf_mapping
from megatron_lgs.convert.errors import ConvertError
from megatron_lgs.run_config import ModelConfig

GPT2 = ModelConfig()
LLAMA = ModelConfig(position_embedding_type="rope", normalization="RMSNorm", swiglu=True)
MIXTRAL = replace(LLAMA, add_bias_linear=False, num_experts=4)
QWEN2 = replace(LLAMA, add_bias_linear=False, add_qkv_bias=True, rotary_base=1000000,
                norm_epsilon=1e-6)
# Qwen3's shape: query/key norms, heads wider than hidden / heads, its theta and epsilon.
QWEN3 = replace(LLAMA, add_bias_linear=False, qk_layernorm=True, kv_channels=64,
                rotary_base=1000000, norm_epsilon=1e-6, group_query_attention=True,
                num_query_groups=2)
# Qwen3-MoE's shape: Qwen3's attention, experts narrower than the hidden size, top-4.
QWEN3_MOE = replace(QWEN3, num_experts=8, moe_ffn_hidden_size=32, moe_router_topk=4,
                    moe_aux_loss_coeff=1e-3)
# Llama 3.1's RoPE: period 500000, low frequencies scaled (Llama 3.2 1B/3B take factor 32).
LLAMA31 = replace(LLAMA, rotary_base=500000, use_rope_scaling=True, rope_scaling_factor=32.0)


@pytest.mark.parametrize("model, family", [
    (GPT2, "gpt2"),
    (replace(GPT2, untie_embeddings_and_output_weights=True), "gpt2"),
    (LLAMA, "llama"),
    (replace(LLAMA, add_bias_linear=False, group_query_attention=True, num_query_groups=2),
     "llama"),
    (MIXTRAL, "mixtral"),
    (QWEN2, "qwen2"),
    (QWEN3, "qwen3"),
    (QWEN3_MOE, "qwen3_moe"),
])
def test_mapped(model, family):
    assert hf_mapping.family(model) == family


@pytest.mark.parametrize("model, reason", [
    (replace(GPT2, position_embedding_type="rope"), "no transformers architecture"),
    (replace(GPT2, normalization="RMSNorm"), "no transformers architecture"),
    (replace(GPT2, swiglu=True), "no transformers architecture"),
    (replace(GPT2, add_bias_linear=False), "no transformers architecture"),
    (replace(GPT2, group_query_attention=True, num_query_groups=2), "grouped-query"),
    (replace(LLAMA, normalization="LayerNorm"), "no transformers architecture"),
    (replace(MIXTRAL, moe_expert_capacity_factor=1.0), "dropless"),
    (replace(MIXTRAL, moe_router_load_balancing_type="sinkhorn"), "sigmoid"),
    (replace(MIXTRAL, add_bias_linear=True), "Mixtral"),
    (replace(MIXTRAL, normalization="LayerNorm"), "Mixtral"),
    (replace(GPT2, kv_channels=64), "GPT-2's heads are hidden / heads wide"),
    (replace(QWEN3, add_bias_linear=True), "onto Qwen3 and Qwen3-MoE only"),
    (replace(QWEN3_MOE, add_bias_linear=True), "onto Qwen3 and Qwen3-MoE only"),
    (replace(QWEN3_MOE, moe_expert_capacity_factor=1.0), "dropless"),
    (replace(GPT2, qk_layernorm=True), "onto Qwen3 and Qwen3-MoE only"),
    (replace(QWEN2, add_bias_linear=True), "Qwen2 only"),
    (replace(QWEN2, qk_layernorm=True), "Qwen2 only"),
    (replace(QWEN2, num_experts=4), "MoE experts"),
])
def test_refused_in_one_line(model, reason):
    with pytest.raises(ConvertError, match=reason) as info:
        hf_mapping.family(model)
    assert "\n" not in str(info.value)


def _llama(**kwargs) -> LlamaConfig:
    return LlamaConfig(**{"rms_norm_eps": 1e-5, **kwargs})


def _mixtral(**kwargs) -> MixtralConfig:
    return MixtralConfig(rms_norm_eps=1e-5, rope_parameters={"rope_type": "default",
                                                             "rope_theta": 10000.0}, **kwargs)


@pytest.mark.parametrize("config, reason", [
    (OPTConfig(), "model type 'opt'"),
    (GPT2Config(activation_function="relu"), "activation_function 'relu'"),
    (_llama(rope_parameters={"rope_type": "default", "rope_theta": 10000.5}), "an integer"),
    (_llama(rope_parameters={"rope_type": "linear", "rope_theta": 500000.0, "factor": 8.0}),
     "unscaled or scaled as Llama 3.1's"),
    (_llama(rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                             **{**hf_mapping.LLAMA3_ROPE, "high_freq_factor": 2.0}}),
     "unscaled or scaled as Llama 3.1's"),
    (_llama(attention_bias=True, mlp_bias=False), "all or none"),
    (_llama(hidden_act="gelu"), "hidden_act"),
    (_mixtral(router_jitter_noise=0.1), "jitter"),
    (_mixtral(sliding_window=4096), "sliding window"),
    (Qwen3Config(rms_norm_eps=1e-6, use_sliding_window=True), "sliding window"),
    (Qwen2Config(use_sliding_window=True), "sliding window"),
    (Qwen3Config(rms_norm_eps=1e-6, attention_bias=True), "attention biases"),
    (Qwen3MoeConfig(norm_topk_prob=False), "norm_topk_prob false"),
    (Qwen3MoeConfig(norm_topk_prob=True, mlp_only_layers=[0]), "dense MLP layers"),
    (Qwen3MoeConfig(norm_topk_prob=True, decoder_sparse_step=2), "dense MLP layers"),
])
def test_import_refuses(config, reason):
    with pytest.raises(ConvertError, match=reason):
        hf_mapping.model_config_from_hf(config)


@pytest.mark.parametrize("model", [GPT2, LLAMA, replace(LLAMA, group_query_attention=True,
                                                        num_query_groups=2), MIXTRAL,
                                   replace(LLAMA, kv_channels=64, rotary_base=500000),
                                   LLAMA31, replace(QWEN3, use_rope_scaling=True), QWEN3_MOE,
                                   replace(MIXTRAL, kv_channels=16, norm_epsilon=1e-6),
                                   replace(GPT2, norm_epsilon=1e-6),
                                   replace(GPT2, openai_gelu=True), QWEN2, QWEN3])
def test_config_round_trip(model):
    """Our flags -> transformers config -> our flags is the identity (dropout aside)."""
    config = hf_mapping.hf_config(model, 512, 0, "float32")
    assert hf_mapping.model_config_from_hf(config) == model


def test_import_takes_rope_theta_and_norm_epsilon():
    config = _llama(rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
                    rms_norm_eps=1e-6)
    m = hf_mapping.model_config_from_hf(config)
    assert (m.rotary_base, m.norm_epsilon) == (500000, 1e-6)
    gpt2 = GPT2Config(activation_function="gelu", layer_norm_epsilon=1e-6)
    assert hf_mapping.model_config_from_hf(gpt2).norm_epsilon == 1e-6


@pytest.mark.parametrize("activation, tanh", [("gelu", False), ("gelu_new", True),
                                              ("gelu_pytorch_tanh", True)])
def test_gpt2_gelu_imports_as_computed(activation, tanh):
    """OpenAI's GPT-2 (`gelu_new`, GPT2Config's default) and torch's tanh GELU import as
    --openai-gelu, the exact GELU as the default."""
    config = GPT2Config(activation_function=activation)
    assert hf_mapping.model_config_from_hf(config).openai_gelu is tanh


def test_rope_scaling_rotates_as_transformers():
    """megatron-core's Llama 3.1 scaling fixes every parameter but the factor (LLAMA3_ROPE):
    its frequencies equal transformers' on the config we export, and the scaling moves them."""
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = hf_mapping.hf_config(LLAMA31, 512, 0, "float32")
    assert config.rope_parameters["rope_type"] == "llama3"
    theirs, _ = ROPE_INIT_FUNCTIONS["llama3"](config, "cpu")
    ours = RotaryEmbedding(kv_channels=LLAMA31.head_dim, rotary_percent=1.0,
                           rotary_base=LLAMA31.rotary_base, rope_scaling=True,
                           rope_scaling_factor=LLAMA31.rope_scaling_factor,
                           use_cpu_initialization=True)
    torch.testing.assert_close(ours.inv_freq, theirs.to(ours.inv_freq.dtype), rtol=1e-6, atol=0)
    plain = RotaryEmbedding(kv_channels=LLAMA31.head_dim, rotary_percent=1.0,
                            rotary_base=LLAMA31.rotary_base, use_cpu_initialization=True)
    assert (plain.inv_freq / ours.inv_freq).max().item() == pytest.approx(32.0)


def test_import_takes_head_dim():
    # transformers' head_dim where it is not hidden / heads becomes --kv-channels.
    config = _llama(hidden_size=64, num_attention_heads=4, head_dim=32, intermediate_size=128)
    assert hf_mapping.model_config_from_hf(config).kv_channels == 32
    same = _llama(hidden_size=64, num_attention_heads=4, head_dim=16, intermediate_size=128)
    assert hf_mapping.model_config_from_hf(same).kv_channels is None


def test_qkv_split_join_inverse_with_wide_heads():
    s = hf_mapping.Shape(1, 64, 4, 2, 256, None, 512, True, True, kv_channels=32)
    w = torch.randn((4 + 2 * 2) * 32, 64)
    q, k, v = hf_mapping._split_qkv(w, s)
    assert (q.shape[0], k.shape[0], v.shape[0]) == (128, 64, 64)
    assert torch.equal(hf_mapping._join_qkv(q, k, v, s), w)


def test_qkv_split_join_inverse():
    s = hf_mapping.Shape(1, 64, 8, 2, 256, None, 512, True, True)
    w = torch.randn((8 + 2 * 2) * 8, 64)
    q, k, v = hf_mapping._split_qkv(w, s)
    assert (q.shape[0], k.shape[0], v.shape[0]) == (64, 16, 16)
    # group 1's first query head is the 5th query head, after group 0's 4 heads + k + v
    assert torch.equal(q[4 * 8:5 * 8], w[6 * 8:7 * 8])
    assert torch.equal(hf_mapping._join_qkv(q, k, v, s), w)
