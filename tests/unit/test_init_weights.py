"""Layout-independent initialization, in one process: its table of distributions is the one
megatron-core itself uses, its tensor-parallel slices are megatron's, and the result depends on
the seed and the parameter's name only. (Equality of the full model across real TP/PP/EP/VPP
layouts: tests/distributed/test_parallel_equivalence.py.)"""

from __future__ import annotations

import math

import pytest
import torch

from megatron_lgs.arguments import parse_args
from megatron_lgs.init_weights import full_tensor, global_names, init_kind, shard_of
from megatron_lgs.model import build_model, local_block_spec, transformer_config

# isort: split
# megatron-core only after megatron_lgs, whose import installs the platform layer first.
from megatron.core.models.gpt import GPTModel
from megatron.core.tensor_parallel.layers import _initialize_affine_weight_cpu
from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

DENSE = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
         "--vocab-size", "512"]
MOE = [*DENSE, "--num-experts", "4", "--disable-bias-linear"]
GLU = [*DENSE, "--swiglu", "--normalization", "RMSNorm", "--untie-embeddings-and-output-weights"]


def megatron_initialized(flags: list[str], platform, seed: int = 5) -> GPTModel:
    """The model exactly as megatron-core initializes it (no re-initialization)."""
    cfg = parse_args(flags, world_size=1)
    torch.manual_seed(seed)
    model_parallel_cuda_manual_seed(seed)
    config = transformer_config(cfg, platform)
    return GPTModel(config=config, transformer_layer_spec=local_block_spec(cfg, config, None),
                    vocab_size=512, max_sequence_length=cfg.model.seq_length,
                    share_embeddings_and_output_weights=not
                    cfg.model.untie_embeddings_and_output_weights)


@pytest.mark.parametrize("flags", [DENSE, MOE, GLU], ids=["dense", "moe", "swiglu-rmsnorm"])
def test_the_table_gives_megatrons_own_distribution_for_every_parameter(one_process, flags):
    model = megatron_initialized(flags, one_process)
    config = model.config
    expected_std = {"init": config.init_method_std, "embedding": config.init_method_std,
                    "output": config.init_method_std / math.sqrt(2 * config.num_layers)}
    kinds = set()
    for name, param in model.named_parameters():
        kind = init_kind(name)
        kinds.add(kind)
        value = param.detach().float()
        if kind in ("ones", "zeros"):
            assert torch.equal(value, torch.full_like(value, 1.0 if kind == "ones" else 0.0)), name
        else:
            std = expected_std[kind]
            assert abs(value.std().item() / std - 1) < 0.15, (name, kind, value.std().item())
            assert abs(value.mean().item()) < 5 * std / math.sqrt(value.numel()), name
    assert {"init", "output", "embedding", "ones"} <= kinds


def test_an_unknown_parameter_is_an_error_not_a_guess():
    with pytest.raises(ValueError, match="no initialization rule"):
        init_kind("decoder.layers.0.mystery.scale")


@pytest.mark.parametrize(("dim", "stride", "size"), [(0, 1, 2), (1, 1, 2), (0, 2, 2), (0, 2, 4),
                                                      (1, 1, 4)])
def test_tensor_parallel_slices_are_megatrons(dim, stride, size):
    full = torch.randn(16, 24)
    for rank in range(size):
        shape = list(full.shape)
        shape[dim] //= size
        expected = torch.empty(shape)
        _initialize_affine_weight_cpu(
            expected, full.shape[0], full.shape[1], shape[dim], dim,
            lambda t: t.copy_(full), stride=stride, rank=rank, world_size=size,
            skip_set_tensor_parallel_attributes=True)
        assert torch.equal(shard_of(full, dim, stride, rank, size), expected)


def test_weights_depend_on_seed_and_name_not_on_build_order_or_global_rng(one_process):
    cfg = parse_args([*MOE, "--seed", "11"], world_size=1)
    torch.manual_seed(0)
    first = build_model(cfg, one_process, 512)
    torch.manual_seed(99)  # megatron's own draws differ; ours must not
    second = build_model(cfg, one_process, 512)
    other = build_model(parse_args([*MOE, "--seed", "12"], world_size=1), one_process, 512)
    names = global_names(first)
    for (name, a), b, c in zip(first.named_parameters(), second.parameters(),
                               other.parameters(), strict=True):
        assert torch.equal(a, b), name
        assert torch.equal(a, full_tensor(names[name], a.shape, first.config, 11)), name
        if init_kind(name) not in ("ones", "zeros"):
            assert not torch.equal(a, c), name
    # Different names draw different values (no two layers or experts start alike).
    layer0 = dict(first.named_parameters())["decoder.layers.0.mlp.experts.local_experts.0"
                                            ".linear_fc1.weight"]
    layer1 = dict(first.named_parameters())["decoder.layers.1.mlp.experts.local_experts.1"
                                            ".linear_fc1.weight"]
    assert not torch.equal(layer0, layer1)
