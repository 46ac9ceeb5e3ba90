"""The whole-step model's unfused-RoPE traffic and kernels against megatron-core 0.16's own
`_apply_rotary_pos_emb_bshd`: every ATen op it dispatches (views excepted) is counted, one
kernel each, with the bytes it reads and writes, forward and backward, in units of the
query/key tensor it rotates.
The frequency table is [s, 1, 1, d], so at 64 heads and micro-batch 4 its own cos/sin work is
under 1% of the count."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

import megatron_lgs  # noqa: F401  (installs the platform layer before megatron-core)
from megatron_lgs.lgs.layercost import ROPE_KERNELS, ROPE_PASSES

# isort: split
from megatron.core.models.common.embeddings.rope_utils import _apply_rotary_pos_emb_bshd

aten = torch.ops.aten
VIEWS = {aten.view.default, aten._unsafe_view.default, aten.slice.Tensor, aten.split.Tensor,
         aten.split_with_sizes.default, aten.expand.default, aten.detach.default,
         aten.alias.default, aten.unsqueeze.default, aten.transpose.int, aten.t.default,
         aten.as_strided.default}


class TrafficCount(TorchDispatchMode):
    """Bytes read (tensor inputs) and written (tensor outputs) by every non-view op, and the
    number of those ops."""

    def __init__(self) -> None:
        super().__init__()
        self.bytes = 0
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func not in VIEWS:
            self.ops += 1
            self.bytes += sum(x.numel() * x.element_size()
                              for x in tree_leaves((args, kwargs, out))
                              if isinstance(x, torch.Tensor))
        return out


def test_unfused_rope_passes_match_megatron_core() -> None:
    s, b, h, d = 256, 4, 64, 128
    torch.manual_seed(0)
    t = torch.randn(s, b, h, d, dtype=torch.bfloat16, requires_grad=True)
    freqs = torch.randn(s, 1, 1, d)
    one_pass = t.numel() * t.element_size()
    with TrafficCount() as fwd:
        y = _apply_rotary_pos_emb_bshd(t, freqs)
    grad = torch.randn_like(y)
    with TrafficCount() as bwd:
        y.backward(grad)
    model_fwd, model_bwd = ROPE_PASSES[False]
    assert fwd.bytes / one_pass == pytest.approx(model_fwd, rel=0.01)
    assert bwd.bytes / one_pass == pytest.approx(model_bwd, rel=0.01)
    # The model counts the query's and the key's kernels together.
    assert (2 * fwd.ops, 2 * bwd.ops) == ROPE_KERNELS[False]
