"""The data-parallel group as nodes x ranks per node: how many ranks share a node, the two
sub-groups LGS reduces over (inside a node, across nodes), and the reduce-scatter it issues on
them. Used by the engine (`sync`) and the calibration probe (`calibrate`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from megatron.core.distributed.reduce_scatter_with_fp32_accumulation import (
    reduce_scatter_with_fp32_accumulation,
)


def gpus_per_node(flag: int | None) -> tuple[int, str]:
    """Ranks per node and where that number came from."""
    if flag:
        return flag, "--lgs-gpus-per-node"
    for name in ("LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE"):
        value = os.environ.get(name, "").split("(")[0]  # Slurm may write "4(x2)"
        if value.isdigit() and int(value) > 0:
            return int(value), name
    return dist.get_world_size(), "default: one node"


@dataclass(frozen=True)
class Levels:
    """A data-parallel group seen as N nodes x g ranks, with its two sub-groups."""

    size: int
    nodes: int
    per_node: int
    rank: int
    intra: dist.ProcessGroup | None  # None when g == 1
    inter: dist.ProcessGroup | None  # None when N == 1
    # Plain DDP's closing intra-node all-gather runs on the inter-node thread, beside the next
    # buckets' reduce-scatters: a group of its own keeps each group's collectives in one order.
    intra_gather: dist.ProcessGroup | None = None

    @property
    def name(self) -> str:
        if self.nodes > 1 and self.per_node > 1:
            return "intra+inter"
        return "inter" if self.nodes > 1 else "intra"


def build_levels(groups: list[dist.ProcessGroup], per_node: int) -> list[Levels]:
    """Levels for each of this rank's data-parallel `groups`. Collective over the world: every
    rank creates every sub-group, in the same order."""
    mine = [dist.get_process_group_ranks(g) for g in groups]
    gathered: list[list[list[int]]] = [None] * dist.get_world_size()  # type: ignore[list-item]
    dist.all_gather_object(gathered, mine)
    distinct = sorted({tuple(ranks) for per_rank in gathered for ranks in per_rank})

    def split(ranks: tuple[int, ...]) -> tuple[list[list[int]], list[list[int]]]:
        nodes: dict[int, list[int]] = {}
        for r in ranks:
            nodes.setdefault(r // per_node, []).append(r)
        members = list(nodes.values())
        g = len(members[0])
        # Two levels only when every node holds the same number of consecutive members.
        if any(len(m) != g for m in members) or [r for m in members for r in m] != list(ranks):
            return [], []
        return members, [[m[i] for m in members] for i in range(g)]

    made: dict[tuple[int, ...], list[dist.ProcessGroup | None]] = {}
    for ranks in distinct:
        intra, inter = split(ranks)
        made[ranks] = []
        for sub in (intra, inter, intra):
            useful = [s for s in sub if len(s) > 1]
            made[ranks].append(dist.new_subgroups_by_enumeration(useful)[0] if useful else None)

    levels = []
    for group, ranks in zip(groups, mine, strict=True):
        intra_lists, _ = split(tuple(ranks))
        nodes = len(intra_lists) or len(ranks)
        per = len(ranks) // nodes
        intra, inter, gather = made[tuple(ranks)]
        levels.append(Levels(len(ranks), nodes, per, dist.get_rank(group),
                             intra if per > 1 else None, inter if nodes > 1 else None,
                             gather if per > 1 else None))
    return levels


def reduce_scatter(out: torch.Tensor, inp: torch.Tensor, group: dist.ProcessGroup | None, *,
                   all_to_all: bool) -> None:
    """Sum-reduce-scatter `inp` into `out`: the backend's own collective, or megatron-core's
    all-to-all + local FP32 sum (`--reduce-scatter-with-fp32-accumulation`)."""
    if not all_to_all:
        dist.reduce_scatter_single(out, inp, group=group)
    elif out.dtype == inp.dtype == torch.float32:
        # megatron-core's algorithm, summed straight into `out`: its version sums into a new
        # tensor and copies that, one more pass over the shard beside the backward (tested
        # bit-equal to it in tests/distributed/test_lgs_sync.py).
        received = torch.empty_like(inp)
        dist.all_to_all_single(received, inp, group=group)
        torch.sum(received.view(dist.get_world_size(group), -1), dim=0, out=out)
    else:
        reduce_scatter_with_fp32_accumulation(out, inp, dist.ReduceOp.SUM, group, False)
