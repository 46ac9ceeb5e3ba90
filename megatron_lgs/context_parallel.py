"""Context parallelism for the local (non-Transformer-Engine) layer spec, so CP runs on a CPU.

megatron-core 0.16.1 implements CP only inside Transformer Engine's attention; its local
`DotProductAttention` refuses `context_parallel_size > 1`. Everything else in megatron already
handles CP: the batch is split with `get_batch_on_this_cp_rank` (2 x CP chunks, rank r keeps
chunks r and 2CP-1-r, which balances causal work), rotary embeddings are sliced the same way,
and DDP averages gradients over the data x context group.

`ContextParallelAttention` is the local attention with one change: keys and values of the whole
sequence are all-gathered over the CP group (autograd-aware: the backward reduce-scatters their
gradients, as Transformer Engine's `all_gather` CP scheme does), and the causal mask is built
from the global positions of this rank's queries and of the gathered keys. The math is then
exactly full causal attention.
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.utils import get_batch_on_this_cp_rank


class _GatherSequence(torch.autograd.Function):
    """All-gather along dim 0 over a group; backward: reduce-scatter of the gradient."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.group = group
        out = torch.empty(group.size() * x.shape[0], *x.shape[1:], dtype=x.dtype,
                          device=x.device)
        dist.all_gather_into_tensor(out, x.contiguous(), group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        group = ctx.group
        out = torch.empty(grad.shape[0] // group.size(), *grad.shape[1:], dtype=grad.dtype,
                          device=grad.device)
        dist.reduce_scatter_single(out, grad.contiguous(), group=group)
        return out, None


def local_positions(seq_length: int, cp_size: int, cp_rank: int) -> torch.Tensor:
    """Global positions of the tokens CP rank `cp_rank` holds (chunks r and 2CP-1-r)."""
    chunk = seq_length // (2 * cp_size)
    first = torch.arange(cp_rank * chunk, (cp_rank + 1) * chunk)
    second = torch.arange((2 * cp_size - 1 - cp_rank) * chunk, (2 * cp_size - cp_rank) * chunk)
    return torch.cat([first, second])


class ContextParallelAttention(DotProductAttention):
    """megatron's local core attention over keys/values gathered from the whole CP group."""

    def __init__(self, config, *args, **kwargs) -> None:
        # The parent refuses CP; it needs the config only for per-partition sizes.
        local = copy.copy(config)
        local.context_parallel_size = 1
        super().__init__(local, *args, **kwargs)
        self.config = config

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                attention_mask: torch.Tensor | None, attn_mask_type=None,
                attention_bias=None, packed_seq_params=None) -> torch.Tensor:
        group = parallel_state.get_context_parallel_group()
        size, rank = group.size(), group.rank()
        key = _GatherSequence.apply(key, group)
        value = _GatherSequence.apply(value, group)
        seq_length = key.shape[0]
        q_pos = local_positions(seq_length, size, rank)
        k_pos = torch.cat([local_positions(seq_length, size, r) for r in range(size)])
        # megatron's mask convention: True = masked out; [b=1, heads=1, sq, sk].
        mask = (k_pos[None, :] > q_pos[:, None]).to(query.device)[None, None]
        return super().forward(query, key, value, mask, attn_mask_type=attn_mask_type,
                               attention_bias=attention_bias,
                               packed_seq_params=packed_seq_params)


def use_context_parallel_attention(spec) -> None:
    """Swap the local spec's core attention for the CP one (in place)."""
    spec.submodules.self_attention.submodules.core_attention = ContextParallelAttention


def batch_on_this_rank(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """This CP rank's part of a [batch, sequence] batch (megatron's own split)."""
    if parallel_state.get_context_parallel_world_size() == 1:
        return batch
    return get_batch_on_this_cp_rank(dict(batch))
