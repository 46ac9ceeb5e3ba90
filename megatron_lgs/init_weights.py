"""Layout-independent initialization: the same seed gives the same full model on any layout.

megatron-core draws each weight from the global RNG in build order, and Megatron seeds that RNG
per pipeline stage, so the weights a layer gets depend on which rank builds it. Here every
parameter is drawn again, after the build, from its own generator seeded by (seed, its global
name): the global layer number instead of the stage-local one, the global expert number instead
of the rank-local one, and the full tensor (before any tensor-parallel split) from which this
rank keeps its slice exactly as megatron's `_initialize_affine_weight_cpu` does. A debugging run
on one CPU then starts from the very weights of a TP/PP/EP/VPP cluster run.

The distributions are megatron-core's own: `config.init_method`, `config.output_layer_init_method`
and `config.embedding_init_method` (called with our generator), zeros for linear biases, ones
and zeros for norm weights and biases. `tests/unit/test_init_weights.py` checks that this table
matches what megatron-core itself draws for every parameter of the GPT and MoE models.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable

import torch
from megatron.core import parallel_state
from megatron.core.transformer import TransformerConfig
from megatron.core.utils import unwrap_model

_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.")
_LOCAL_EXPERT = re.compile(r"\.experts\.local_experts\.(\d+)\.")
_GROUPED_EXPERT = re.compile(r"(\.experts\.linear_fc[12]\.(?:weight|bias))(\d+)$")

# (pattern on the global name, which init) in order; the first match wins.
_RULES: list[tuple[re.Pattern, str]] = [
    (re.compile(r"(word|position)_embeddings\.weight$"), "embedding"),
    (re.compile(r"(norm\.weight|layer_norm_weight)$"), "ones"),
    (re.compile(r"(norm\.bias|layer_norm_bias)$"), "zeros"),
    (re.compile(r"router\.(weight|bias)$"), "init"),  # megatron draws the router bias too
    (re.compile(r"(linear_proj|linear_fc2)\.weight\d*$"), "output"),
    (re.compile(r"(linear_qkv|linear_fc1|output_layer)\.weight\d*$"), "init"),
    (re.compile(r"\.bias\d*$"), "zeros"),
]


def init_kind(global_name: str) -> str:
    """'embedding', 'init', 'output', 'ones' or 'zeros': megatron-core's rule for this weight."""
    for pattern, kind in _RULES:
        if pattern.search(global_name):
            return kind
    raise ValueError(f"no initialization rule for parameter {global_name!r}")


def _local_expert_count(module: torch.nn.Module, name: str) -> int:
    experts = module.get_submodule(name.split(".experts.")[0] + ".experts")
    return experts.num_local_experts


def global_names(model: torch.nn.Module) -> dict[str, str]:
    """Each local parameter name of one model chunk -> its name in the full model: global layer
    number (megatron's `layer_number`, which includes the pipeline/virtual-stage offset) and
    global expert number (expert-parallel rank x local experts + local index)."""
    module = unwrap_model(model)
    ep_rank = parallel_state.get_expert_model_parallel_rank()
    names = {}
    for name, _ in module.named_parameters():
        full = name
        match = _LAYER.match(name)
        if match:
            number = module.decoder.layers[int(match.group(1))].layer_number - 1
            full = f"decoder.layers.{number}." + name[match.end():]
        expert = _LOCAL_EXPERT.search(full) or _GROUPED_EXPERT.search(full)
        if expert:
            offset = ep_rank * _local_expert_count(module, name)
            if expert.re is _LOCAL_EXPERT:
                local = int(expert.group(1))
                full = (f"{full[:expert.start()]}.experts.local_experts.{offset + local}."
                        f"{full[expert.end():]}")
            else:
                full = f"{full[:expert.start()]}{expert.group(1)}{offset + int(expert.group(2))}"
        if (name == "output_layer.weight" and module.share_embeddings_and_output_weights
                and not module.pre_process):
            # Megatron ties the last stage's copy to the first stage's word embedding.
            full = "embedding.word_embeddings.weight"
        names[name] = full
    return names


def parameter_seed(seed: int, global_name: str) -> int:
    digest = hashlib.sha256(f"{seed}/{global_name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def _init_function(kind: str, config: TransformerConfig) -> Callable:
    return {"embedding": config.embedding_init_method, "init": config.init_method,
            "output": config.output_layer_init_method}[kind]


def full_tensor(global_name: str, shape: torch.Size, config: TransformerConfig,
                seed: int) -> torch.Tensor:
    """The full (unsplit) fp32 initial value of a parameter."""
    kind = init_kind(global_name)
    if kind == "ones":
        return torch.ones(shape)
    if kind == "zeros":
        return torch.zeros(shape)
    generator = torch.Generator().manual_seed(parameter_seed(seed, global_name))
    tensor = torch.empty(shape)
    _init_function(kind, config)(tensor, generator=generator)
    return tensor


def _tp_split(name: str) -> tuple[int, int]:
    """(rank, size) of the tensor-parallel group that splits this parameter."""
    if ".experts." in name:
        return (parallel_state.get_expert_tensor_parallel_rank(),
                parallel_state.get_expert_tensor_parallel_world_size())
    return (parallel_state.get_tensor_model_parallel_rank(),
            parallel_state.get_tensor_model_parallel_world_size())


def shard_of(full: torch.Tensor, dim: int, stride: int, rank: int, size: int) -> torch.Tensor:
    """This rank's slice, laid out as megatron's `_initialize_affine_weight_cpu` does: `stride`
    interleaved chunks per rank, chunk i kept by rank i % size (stride 2 keeps a GLU's gate and
    up halves together on each rank)."""
    chunks = torch.split(full, full.shape[dim] // (stride * size), dim=dim)
    return torch.cat(chunks[rank::size], dim=dim)


def _stride(name: str, param: torch.nn.Parameter, config: TransformerConfig) -> int:
    """A GLU's fc1 holds [gate_r; up_r] on each rank (megatron's checkpoint layout for it says
    so): stride 2, whatever stride the layer itself records."""
    if config.gated_linear_unit and re.search(r"linear_fc1\.(weight|bias)\d*$", name):
        return 2
    return getattr(param, "partition_stride", 1)


@torch.no_grad()
def initialize_layout_independent(model: torch.nn.Module, config: TransformerConfig,
                                  seed: int) -> None:
    """Overwrite every parameter of this model chunk with its layout-independent value."""
    names = global_names(model)
    for name, param in unwrap_model(model).named_parameters():
        shape = list(param.shape)
        split = getattr(param, "tensor_model_parallel", False)
        rank, size = _tp_split(name) if split else (0, 1)
        dim = getattr(param, "partition_dim", 0)
        shape[dim] *= size
        full = full_tensor(names[name], torch.Size(shape), config, seed)
        if size > 1:
            full = shard_of(full, dim, _stride(name, param, config), rank, size)
        param.copy_(full.to(param.dtype))
