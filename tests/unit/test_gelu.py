"""The MLP computes the GELU its flags name, with the settings of a GPU as of a CPU: exact by
default, the tanh approximation under --openai-gelu. megatron-core's fused bias-GeLU kernel,
which `model.mlp_activation` takes for the tanh form on a GPU, computes that form; a
megatron-core whose kernel changed would fail here."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from megatron_lgs.arguments import parse_args
from megatron_lgs.model import local_block_spec, mlp_activation, transformer_config

# isort: split
# megatron-core only after megatron_lgs, whose import installs the platform layer first.
from megatron.core.models.gpt import GPTModel
from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

HIDDEN, SEQ, VOCAB = 64, 16, 512
FLAGS = ["--num-layers", "1", "--hidden-size", str(HIDDEN), "--num-attention-heads", "4",
         "--seq-length", str(SEQ), "--vocab-size", str(VOCAB), "--init-method-std", "0.5"]


@pytest.mark.parametrize("on_gpu", [False, True])
@pytest.mark.parametrize("openai_gelu", [False, True])
def test_the_mlp_computes_the_gelu_its_flags_name(one_process, openai_gelu, on_gpu):
    cfg = parse_args([*FLAGS, *(["--openai-gelu"] if openai_gelu else [])], world_size=1)
    func, fused = mlp_activation(cfg.model, on_gpu)
    assert fused == (on_gpu and openai_gelu)  # the fused kernel serves the tanh form only
    config = dataclasses.replace(transformer_config(cfg, one_process), activation_func=func,
                                 bias_activation_fusion=fused)
    torch.manual_seed(0)
    model_parallel_cuda_manual_seed(0)
    mlp = GPTModel(config=config, transformer_layer_spec=local_block_spec(cfg, config, None),
                   vocab_size=VOCAB, max_sequence_length=SEQ).decoder.layers[0].mlp
    x = torch.randn(SEQ, 2, HIDDEN)
    with torch.no_grad():
        out, bias = mlp(x)
        fc1, fc2 = mlp.linear_fc1, mlp.linear_fc2
        pre = x @ fc1.weight.T + fc1.bias
        named, other = ("tanh", "none") if openai_gelu else ("none", "tanh")
        got = out + bias if bias is not None else out
        want = F.gelu(pre, approximate=named) @ fc2.weight.T + fc2.bias
        wrong = F.gelu(pre, approximate=other) @ fc2.weight.T + fc2.bias
    assert (got - want).abs().max().item() < 1e-5
    assert (got - wrong).abs().max().item() > 1e-3  # the two GELUs differ at this scale


def test_a_resume_keeps_its_gelu_and_older_runs_their_fingerprint() -> None:
    """The GELU is part of what a resume must not change; at its default the flag stays out
    of what the fingerprint hashes, so runs saved before it existed resume as they did."""
    from megatron_lgs.run_state import config_fingerprint, fingerprinted

    cfg = parse_args(FLAGS, world_size=1)
    tanh = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, openai_gelu=True))
    assert config_fingerprint(tanh) != config_fingerprint(cfg)
    assert "openai_gelu" not in fingerprinted(cfg)["model"]
    assert fingerprinted(tanh)["model"]["openai_gelu"] is True
