"""Alpha-beta cost model of NCCL-style collectives, per link, and hardware profiles (the named
built-in ones are in `gpus.PROFILES`).

Every time is a *prediction* from the model t = hops * alpha + bytes_on_the_wire / bandwidth,
where `bandwidth` is the bus bandwidth of the link (what `nccl-tests` reports as busbw), so
that the ring formulas below reproduce NCCL's own accounting.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

GB = 1e9


@dataclass(frozen=True)
class Link:
    """One level of the network: per-hop latency (s) and bus bandwidth (bytes/s)."""

    alpha_s: float
    bandwidth_Bps: float

    def __post_init__(self) -> None:
        if self.alpha_s < 0 or not math.isfinite(self.alpha_s):
            raise ValueError(f"Link.alpha_s must be finite and >= 0, got {self.alpha_s}")
        if self.bandwidth_Bps <= 0 or not math.isfinite(self.bandwidth_Bps):
            raise ValueError(f"Link.bandwidth_Bps must be finite and > 0, got {self.bandwidth_Bps}")


@dataclass(frozen=True)
class HardwareProfile:
    """A GPU type and its two network levels; `source` says where the constants come from."""

    name: str
    intra: Link
    inter: Link
    gpus_per_node: int
    peak_flops: float
    memory_bytes: float
    source: str
    # A measured profile's `peak_flops` is the FLOP rate its probe achieved, so the fraction of
    # it a run reaches is 1.0; None: a data-sheet peak, scaled by the workload's efficiency.
    efficiency: float | None = None
    # Fraction of communication time that runs beside the backward without slowing it: on a
    # built-in GPU the share of SMs NCCL's CTAs leave to compute (`gpus.link_profile`), 1 on a
    # custom profile, measured by the probe where compute and communication share cores (gloo
    # on a CPU): 0 means they take turns.
    # `overlap` is the inter-node hop's; `intra_overlap` the intra-node hop's (None: the same),
    # which differ where one level waits on a wire and the other is CPU work (loopback).
    overlap: float = 1.0
    intra_overlap: float | None = None
    # The `gpus.GPUS` entry whose kernel model times this hardware's compute (the whole-step
    # model's roofline); None (custom, measured): FLOPs at an efficiency.
    gpu: str | None = None

    def __post_init__(self) -> None:
        if self.gpus_per_node < 1:
            raise ValueError(f"gpus_per_node must be >= 1, got {self.gpus_per_node}")
        if self.peak_flops <= 0 or self.memory_bytes <= 0:
            raise ValueError("peak_flops and memory_bytes must be > 0")
        if self.efficiency is not None and not 0 < self.efficiency <= 1:
            raise ValueError(f"efficiency must be in (0, 1], got {self.efficiency}")
        for name, v in (("overlap", self.overlap), ("intra_overlap", self.intra_overlap)):
            if v is not None and not 0 <= v <= 1:
                raise ValueError(f"{name} must be in [0, 1], got {v}")

    @property
    def intra_overlap_or_inter(self) -> float:
        return self.overlap if self.intra_overlap is None else self.intra_overlap


def _check(p: int, n: float) -> None:
    if p < 1:
        raise ValueError(f"group size must be >= 1, got {p}")
    if n < 0:
        raise ValueError(f"message size must be >= 0 bytes, got {n}")


def ring_allreduce_time(n: float, p: int, link: Link) -> float:
    """Ring all-reduce of n bytes over p ranks: 2(p-1) alpha + 2(p-1)/p n/B."""
    _check(p, n)
    return 2 * (p - 1) * link.alpha_s + 2 * (p - 1) / p * n / link.bandwidth_Bps


def reduce_scatter_time(n: float, p: int, link: Link) -> float:
    """Ring reduce-scatter of n bytes (input size) over p ranks: (p-1) alpha + (p-1)/p n/B.
    NCCL has no tree for reduce-scatter or all-gather; its PAT algorithm (2.23) runs only with
    one GPU a node (NVIDIA/nccl#1473), so with several a node rings are what it runs."""
    _check(p, n)
    return (p - 1) * link.alpha_s + (p - 1) / p * n / link.bandwidth_Bps


def all_gather_time(n: float, p: int, link: Link) -> float:
    """Ring all-gather producing n bytes on each of p ranks: same cost as reduce-scatter."""
    return reduce_scatter_time(n, p, link)


def tree_allreduce_time(n: float, p: int, link: Link) -> float:
    """Tree all-reduce: 2 log2(p) alpha + 2 n/B.

    Model: a reduce up a binary tree followed by a broadcast down it, each pipelined in small
    chunks (as NCCL's double binary tree does), so latency grows with the depth log2(p) in
    each phase while every rank sends and receives the whole message once per phase.
    """
    _check(p, n)
    if p == 1:
        return 0.0
    return 2 * math.log2(p) * link.alpha_s + 2 * n / link.bandwidth_Bps


# NCCL's tuner rates a tree all-reduce at 0.92 of the link's bus bandwidth
# (`src/graph/tuning.cc`: `busBw * .92` for NCCL_ALGO_TREE with ncclFuncAllReduce).
NCCL_TREE_BW = 0.92


def inter_node_allreduce_time(n: float, m: int, link: Link) -> float:
    """An all-reduce of n bytes over m ranks on m nodes as NCCL runs it: the faster of its ring
    and its tree by NCCL's own tuning model (`src/graph/tuning.cc`, `ncclTopoTuneModel`: ring
    latency 2(m-1) hops and algorithm bandwidth busBw x m / 2(m-1); tree latency 2 log2(m)
    hops and 0.5 x 0.92 x busBw), which picks the tree where the ring's latency would dominate,
    many nodes and small messages."""
    tree_link = replace(link, bandwidth_Bps=NCCL_TREE_BW * link.bandwidth_Bps)
    return min(ring_allreduce_time(n, m, link), tree_allreduce_time(n, m, tree_link))


def nccl_allreduce_busbw(algbw_Bps: float, p: int) -> float:
    """NCCL's bus bandwidth of an all-reduce: busbw = algbw x 2(p-1)/p (algbw = n / time)."""
    if p < 1:
        raise ValueError(f"group size must be >= 1, got {p}")
    return algbw_Bps * 2 * (p - 1) / p


@dataclass(frozen=True)
class HierarchicalCost:
    """Time of one bucket's two-level reduction and how it splits across the levels."""

    intra_s: float
    inter_s: float
    inter_messages: int
    intra_reduce_scatter_s: float = 0.0  # the part of intra_s before the inter-node hop


    @property
    def total_s(self) -> float:
        return self.intra_s + self.inter_s


def hierarchical_allreduce(
    n: float,
    g: int,
    m: int,
    hw: HardwareProfile,
    inter_message_cap: float | None = None,
    all_gather: bool = True,
) -> HierarchicalCost:
    """Two-level reduction of an n-byte bucket over g ranks per node x m nodes.

    Intra-node reduce-scatter of n, inter-node all-reduce of each rank's n/g shard (NCCL's
    faster of ring and tree, `inter_node_allreduce_time`), then an intra-node all-gather of n.
    With the distributed optimizer (`all_gather=False`) each rank owns its shard: the
    inter-node hop is a reduce-scatter and there is no all-gather.
    `inter_message_cap` splits the inter-node part into ceil((n/g)/cap) equal all-reduces:
    each extra message pays the inter latency again but no extra bandwidth term. That is the
    only thing the cap does in an alpha-beta model; its benefit (bounded NIC queues, less
    incast) is outside the model, so a pure prediction never *prefers* a small cap.
    """
    _check(g, n)
    _check(m, n)
    if inter_message_cap is not None and inter_message_cap <= 0:
        raise ValueError(f"inter_message_cap must be > 0 bytes, got {inter_message_cap}")
    first = reduce_scatter_time(n, g, hw.intra)
    intra = first + (all_gather_time(n, g, hw.intra) if all_gather else 0.0)
    shard = n / g
    if m == 1 or shard == 0:
        return HierarchicalCost(intra, 0.0, 0, first)
    k = 1 if inter_message_cap is None else max(1, math.ceil(shard / inter_message_cap))
    # With the distributed optimizer the inter-node hop is a reduce-scatter (each rank keeps
    # its ZeRO shard), as `sync` issues it; otherwise an all-reduce.
    inter_op = inter_node_allreduce_time if all_gather else reduce_scatter_time
    inter = k * inter_op(shard / k, m, hw.inter)
    return HierarchicalCost(intra, inter, k, first)


def custom(
    intra_bw_GBps: float,
    inter_bw_GBps: float,
    intra_alpha_us: float = 3.0,
    inter_alpha_us: float = 15.0,
    gpus_per_node: int = 8,
    peak_tflops: float = 312.0,
    memory_GB: float = 80.0,
    name: str = "custom",
) -> HardwareProfile:
    """A profile from user-given numbers (bus bandwidths in GB/s, latencies in us)."""
    return HardwareProfile(
        name=name,
        intra=Link(intra_alpha_us * 1e-6, intra_bw_GBps * GB),
        inter=Link(inter_alpha_us * 1e-6, inter_bw_GBps * GB),
        gpus_per_node=gpus_per_node,
        peak_flops=peak_tflops * 1e12,
        memory_bytes=memory_GB * GB,
        source="user-supplied numbers",
    )
