"""Context parallelism for megatron-core's local spec (CPU), where megatron-core has none.

megatron-core runs CP only inside Transformer Engine's attention; its own DotProductAttention
asserts CP == 1. Everything else in megatron-core is CP-aware already: the batch is split along
the sequence by `get_batch_on_this_cp_rank` (2 x CP chunks, rank r keeping chunks r and
2CP-1-r to balance causal work), DDP averages gradients over data x context parallel ranks, and
the pipeline divides its activation shapes by CP. What is missing is attention across the
shards, added here: each rank all-gathers K and V over the CP group, puts the chunks back in
sequence order and masks causally by global position. The backward of the all-gather sums the
K/V gradients of every rank's queries (an all-reduce). The math is exact; the memory
saving of a ring exchange (K/V never whole on one rank) is not reproduced — this exists so that
a CP layout can be run and debugged on a CPU.
"""

from __future__ import annotations

import copy
import dataclasses

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.transformer import ModuleSpec, TransformerConfig
from megatron.core.transformer.dot_product_attention import DotProductAttention


class _GatherFromGroup(torch.autograd.Function):
    """All-gather along dim 0 whose backward sums every rank's gradient and keeps this rank's
    part. (torch.distributed.nn's all_gather cannot be used: on gloo its backward scatters from
    group-local ranks as if they were global ones, which fails in any subgroup but the first.)"""

    @staticmethod
    def forward(ctx, local: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.group, ctx.size = group, local.size(0)
        parts = [torch.empty_like(local) for _ in range(group.size())]
        dist.all_gather(parts, local.contiguous(), group=group)
        return torch.cat(parts, dim=0)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        rank = ctx.group.rank()
        return grad[rank * ctx.size:(rank + 1) * ctx.size], None


def _sequence_order(chunks_by_rank: list[torch.Tensor], cp: int) -> torch.Tensor:
    """[s_local, ...] of each rank (its chunks r and 2cp-1-r) -> [s, ...] in sequence order."""
    ordered: list[torch.Tensor | None] = [None] * (2 * cp)
    for rank, local in enumerate(chunks_by_rank):
        first, second = local.chunk(2, dim=0)
        ordered[rank], ordered[2 * cp - 1 - rank] = first, second
    return torch.cat(ordered, dim=0)


def local_positions(seq_local: int, cp: int, rank: int) -> torch.Tensor:
    """Global sequence positions of this rank's tokens, as get_batch_on_this_cp_rank cut them."""
    chunk = seq_local // 2
    return torch.cat([torch.arange(rank * chunk, (rank + 1) * chunk),
                      torch.arange((2 * cp - 1 - rank) * chunk, (2 * cp - rank) * chunk)])


class ContextParallelDotProductAttention(DotProductAttention):
    """megatron-core's local core attention over K/V gathered from the whole CP group."""

    def __init__(self, config: TransformerConfig, *args: object, **kwargs: object) -> None:
        # The parent refuses CP > 1 only because it cannot see other shards; this class can.
        single = copy.copy(config)
        single.context_parallel_size = 1
        super().__init__(single, *args, **kwargs)
        self.config = config

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                attention_mask: torch.Tensor | None, *args: object,
                **kwargs: object) -> torch.Tensor:
        if attention_mask is not None:
            raise NotImplementedError("context parallelism on the local spec is causal-only")
        group = parallel_state.get_context_parallel_group()
        cp, rank = group.size(), group.rank()
        key = _sequence_order(_GatherFromGroup.apply(key, group).chunk(cp), cp)
        value = _sequence_order(_GatherFromGroup.apply(value, group).chunk(cp), cp)
        q_pos = local_positions(query.size(0), cp, rank).to(query.device)
        k_pos = torch.arange(key.size(0), device=query.device)
        causal = (k_pos[None, :] > q_pos[:, None])[None, None]  # True: masked, [1, 1, sq, sk]
        return super().forward(query, key, value, causal, *args, **kwargs)


def with_context_parallel_attention(layer: ModuleSpec) -> ModuleSpec:
    """The local layer spec with its core attention replaced."""
    attention = layer.submodules.self_attention
    attention = dataclasses.replace(attention, submodules=dataclasses.replace(
        attention.submodules, core_attention=ContextParallelDotProductAttention))
    return dataclasses.replace(layer, submodules=dataclasses.replace(
        layer.submodules, self_attention=attention))
