"""The whole-step model's MLP and MoE activation memory against what megatron-core's own modules
save for backward: a real GPTModel (local spec, BF16, one process) runs one forward while
autograd's saved-tensor hooks record every tensor the first layer's MLP block (for dropout, the
whole layer) keeps, counted once per storage and without parameters. The fused activation is
switched on, as on a GPU (the local spec leaves it off on CPU); the attention block and the
norms are Transformer Engine's on a GPU and differ on CPU, so they are not compared here."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from megatron_lgs.arguments import parse_args
from megatron_lgs.lgs.runspec import Run, run_from_dict
from megatron_lgs.lgs.stepmemory import layer_activation_bytes, mlp_block_bytes
from megatron_lgs.model import local_block_spec, transformer_config

# isort: split
# megatron-core only after megatron_lgs, whose import installs the platform layer first.
from megatron.core.models.gpt import GPTModel
from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
from megatron.core.transformer.module import Float16Module

HIDDEN, HEADS, SEQ, MICRO_BATCH, VOCAB = 256, 4, 128, 2, 1024
BASE = ["--num-layers", "1", "--hidden-size", str(HIDDEN), "--num-attention-heads", str(HEADS),
        "--seq-length", str(SEQ), "--micro-batch-size", str(MICRO_BATCH), "--bf16",
        "--vocab-size", str(VOCAB), "--swiglu", "--disable-bias-linear",
        "--normalization", "RMSNorm"]


def saved_bytes(flags: list[str], platform, block: str = "mlp") -> float:
    """Bytes layer 0 (`block` "layer") or its MLP block ("mlp") keeps for backward in one
    forward, per token."""
    cfg = parse_args([*BASE, *flags], world_size=1)
    torch.manual_seed(3)
    model_parallel_cuda_manual_seed(3)
    config = dataclasses.replace(transformer_config(cfg, platform), bias_activation_fusion=True)
    model = Float16Module(config, GPTModel(
        config=config, transformer_layer_spec=local_block_spec(cfg, config, None),
        vocab_size=VOCAB, max_sequence_length=SEQ))
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    kept: dict[int, int] = {}
    inside = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if inside and storage.data_ptr() not in params:
            kept[storage.data_ptr()] = storage.nbytes()
        return t

    layer = model.module.decoder.layers[0]
    watched = layer.mlp if block == "mlp" else layer
    watched.register_forward_pre_hook(lambda *_: inside.append(True))
    watched.register_forward_hook(lambda *_: inside.pop() and None)
    tokens = torch.randint(0, VOCAB, (MICRO_BATCH, SEQ))
    positions = torch.arange(SEQ).expand(MICRO_BATCH, -1)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(tokens, positions, None)
    assert kept, f"the hooks saw nothing in {block}"
    return sum(kept.values()) / (MICRO_BATCH * SEQ)


def described(ffn: int, experts: int = 0, topk: int = 2, **extra: object) -> Run:
    return run_from_dict({"id": "x", "gpu": "a100-80gb", "num_gpus": 1, "num_layers": 1,
                       "hidden": HIDDEN, "ffn_hidden": ffn, "heads": HEADS, "vocab": VOCAB,
                       "seq_length": SEQ, "tp": 1, "pp": 1, "micro_batch": MICRO_BATCH,
                       "global_batch": MICRO_BATCH, "swiglu": True, "num_experts": experts,
                       "moe_topk": topk, **extra})


def modelled(ffn: int, experts: int = 0, topk: int = 2) -> float:
    return mlp_block_bytes(described(ffn, experts, topk))


@pytest.mark.parametrize(("flags", "ffn", "experts", "topk"), [
    (["--ffn-hidden-size", "1024"], 1024, 0, 2),
    (["--ffn-hidden-size", "512", "--num-experts", "4", "--moe-router-topk", "2"], 512, 4, 2),
    (["--ffn-hidden-size", "384", "--num-experts", "8", "--moe-router-topk", "3",
      "--moe-token-dispatcher-type", "alltoall"], 384, 8, 3),
], ids=["dense", "moe-allgather", "moe-alltoall"])
def test_mlp_block_keeps_what_megatron_core_saves(one_process, flags, ffn, experts, topk):
    """Within 1%. An expert output kept per routed token for applying the probabilities at
    unpermute (2 h k bytes a token, which the model counted until 2026-12-04) would be 13-17%
    over; megatron-core 0.16 applies them in the fused activation instead."""
    measured = saved_bytes(flags, one_process)
    assert modelled(ffn, experts, topk) == pytest.approx(measured, rel=0.01)


def test_dropout_keeps_a_mask_per_residual_add_and_none_at_zero(one_process):
    """Hidden dropout keeps a mask in each of the layer's two bias-dropout-adds; at p = 0
    torch's dropout returns its input and keeps nothing (the model's `dropout` 0.0). On a CPU
    the mask is the BF16 noise tensor (2 B an element), on a GPU `native_dropout`'s bool mask
    (1 B), which the model counts."""
    flags = ["--ffn-hidden-size", "1024", "--attention-dropout", "0.0"]
    with_masks = saved_bytes([*flags, "--hidden-dropout", "0.1"], one_process, "layer")
    without = saved_bytes([*flags, "--hidden-dropout", "0.0"], one_process, "layer")
    tokens = MICRO_BATCH * SEQ
    modelled_masks = (layer_activation_bytes(described(1024, dropout=0.1))[0]
                      - layer_activation_bytes(described(1024, dropout=0.0))[0]) / tokens
    assert with_masks - without == pytest.approx(2 * modelled_masks) == 2 * 2 * HIDDEN
