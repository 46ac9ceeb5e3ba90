"""Time of one kernel on one GPU: GEMMs on a roofline with a shape-dependent efficiency,
fused attention, memory-bound element-wise work, and the collectives of the model-parallel
groups. Constants come from the profile (`gpus`); every time is a prediction.
"""

from __future__ import annotations

import math

from megatron_lgs.lgs.costmodel import all_gather_time, reduce_scatter_time, ring_allreduce_time
from megatron_lgs.lgs.gpus import GEMM_HALF_DIM, HBM_EFFICIENCY, NCCL_COMM_SMS, GpuProfile

GB = 1e9


def tile_factor(*dims: float) -> float:
    """Each dimension d costs a factor d / (d + GEMM_HALF_DIM): under-filled tiles and waves
    at small d (a dimension of one 128-wide tile runs at half speed)."""
    f = 1.0
    for d in dims:
        f *= d / (d + GEMM_HALF_DIM)
    return f


def gemm_efficiency(m: float, n: float, k: float, gpu: GpuProfile,
                    precision: str = "bf16") -> float:
    """Fraction of the precision's peak a GEMM of (m x k) @ (k x n) reaches when compute-bound:
    the tile factor of its three dimensions times the profile's sustained ceiling measured on
    large GEMMs."""
    return gpu.gemm_ceiling(precision) * tile_factor(m, n, k)


def gemm_time(m: float, n: float, k: float, gpu: GpuProfile, precision: str,
              count: float = 1.0) -> float:
    """Roofline time of `count` GEMMs (m x k) @ (k x n): max(compute, operand traffic)."""
    if min(m, n, k) <= 0 or count <= 0:
        return 0.0
    flops = 2.0 * m * n * k
    width = 1.0 if precision == "fp8" else 2.0
    compute = flops / (gpu.gemm_tflops(precision) * 1e12
                       * gemm_efficiency(m, n, k, gpu, precision))
    traffic = width * (m * k + k * n) + 2.0 * m * n
    memory = traffic / (gpu.hbm_gbps * GB * HBM_EFFICIENCY)
    return count * max(compute, memory)


def gemm_parts(m: float, n: float, k: float, gpu: GpuProfile, precision: str
               ) -> tuple[float, float, float]:
    """(forward, data gradient, weight gradient) of one linear layer: y = x W with x (m x k),
    W (k x n); the data gradient is (m x n) @ (n x k), the weight gradient (k x m) @ (m x n)."""
    return (gemm_time(m, n, k, gpu, precision), gemm_time(m, k, n, gpu, precision),
            gemm_time(k, n, m, gpu, precision))


def gemm_fwd_bwd(m: float, n: float, k: float, gpu: GpuProfile, precision: str
                 ) -> tuple[float, float]:
    """(forward, backward) of one linear layer (`gemm_parts`)."""
    fwd, dgrad, wgrad = gemm_parts(m, n, k, gpu, precision)
    return fwd, dgrad + wgrad


def flash_attention_time(flops_fwd: float, gpu: GpuProfile, q_len: float, kv_len: float
                         ) -> tuple[float, float]:
    """(forward, backward) of fused attention kernels given the forward's real FLOPs, over
    blocks of q_len queries against kv_len keys.

    The profile's efficiency is what the kernel reaches on long sequences ([FA2], [FA3] report
    their best); shorter blocks lose the tile factor of both sequence dimensions, as GEMMs do.
    The backward recomputes QK^T and P inside the kernel: 5 score-sized GEMMs against the
    forward's 2, i.e. 2.5x the forward's FLOPs ([FA2]).
    """
    rate = gpu.peak_tflops * 1e12 * gpu.attention_efficiency * tile_factor(q_len, kv_len)
    return flops_fwd / rate, 2.5 * flops_fwd / rate


def memory_time(nbytes: float, gpu: GpuProfile) -> float:
    """A memory-bound kernel moving `nbytes` through HBM."""
    return nbytes / (gpu.hbm_gbps * GB * HBM_EFFICIENCY)


def sm_contention(compute_s: float, comm_s: float, gpu: GpuProfile, sms: int) -> float:
    """Time compute of `compute_s` (on every SM) loses to a communication kernel that holds
    `sms` of the GPU's SMs for `comm_s` beside it: while both run the compute advances at
    (S - c) / S, so it ends at min(compute + comm c / S, compute S / (S - c))."""
    f = sms / gpu.sm_count
    return min(compute_s + comm_s * f, compute_s / (1.0 - f)) - compute_s


def beside(comm_s: float, compute_s: float, gpu: GpuProfile, sms: int) -> float:
    """What a communication kernel of `comm_s` holding `sms` SMs adds to `compute_s` of work
    launched beside it: the work ends late by the SMs the kernel takes from it while both run
    (`sm_contention`), and the pair ends when the later of the two does. (The sum of the
    kernel's overhang and the SMs' toll, as the model charged until 2026-12-07, counted the
    work's slowdown a second time where the kernel outlasts the work and hides it.)"""
    return max(comm_s - compute_s, sm_contention(compute_s, comm_s, gpu, sms))


def nccl_beside(comm_s: float, compute_s: float, gpu: GpuProfile) -> float:
    """`beside` for an NCCL collective, whose CTAs hold `NCCL_COMM_SMS` SMs."""
    return beside(comm_s, compute_s, gpu, NCCL_COMM_SMS)


def tp_collective_time(kind: str, nbytes: float, p: int, link) -> float:
    """One collective of a model-parallel group of p ranks over `link` (a costmodel.Link)."""
    if p <= 1 or nbytes <= 0:
        return 0.0
    if kind == "all_reduce":
        return ring_allreduce_time(nbytes, p, link)
    if kind == "all_gather":
        return all_gather_time(nbytes, p, link)
    if kind == "reduce_scatter":
        return reduce_scatter_time(nbytes, p, link)
    raise ValueError(f"unknown collective {kind!r}")


def all_to_all_time(nbytes_per_rank: float, p: int, intra_peers: int, intra, inter) -> float:
    """All-to-all where each of p ranks sends nbytes_per_rank in total, evenly to all peers.

    `intra_peers` of the p - 1 peers share the node (NVLink), the rest are across the
    network; both parts run at once, so the slower sets the time.
    """
    if p <= 1 or nbytes_per_rank <= 0:
        return 0.0
    per_peer = nbytes_per_rank / p
    inter_peers = p - 1 - intra_peers
    t_intra = intra_peers * (intra.alpha_s + per_peer / intra.bandwidth_Bps)
    t_inter = inter_peers * inter.alpha_s + inter_peers * per_peer / inter.bandwidth_Bps
    return max(t_intra, t_inter)


# NCCL's own latency model of its LL protocol (src/graph/tuning.cc, the same constants from
# 2.18.1, d97a32fa of 2023-04, to master 5067397c of 2026-06), in us: a base per algorithm,
# then per hop 0.6 over NVLink and, between nodes, 5.0 a tree level or 2.7 a ring step, each
# ring step a node sends also paying the host's network post overhead (`getNetOverhead`,
# 1.0 on Intel CPUs). NCCL runs a collective of a few KB with the algorithm its model puts
# fastest, so this is what it expects such a collective to take. Not `costmodel`'s alpha-beta
# links: their per-hop alphas are those of bulk transfers (NCCL's Simple protocol, 3 and 15 us),
# several times what a few-KB message pays on the LL protocol NCCL picks for it.
NCCL_LL_BASE_US = {"tree": 6.8, "ring": 6.6}
NCCL_LL_NVLINK_US = 0.6
NCCL_LL_NET_US = {"tree": 5.0, "ring": 2.7}
NCCL_NET_OVERHEAD_US = 1.0


def small_allreduce_time(ranks: int, ranks_per_node: int) -> float:
    """Latency of an all-reduce of a few KB over `ranks` ranks packed `ranks_per_node` to a node:
    the smaller of NCCL's tree and ring LL latencies (the bytes' own time is negligible)."""
    if ranks <= 1:
        return 0.0
    nodes = -(-ranks // max(1, min(ranks_per_node, ranks)))
    per_node = ranks // nodes
    tree = NCCL_LL_BASE_US["tree"] + 2 * ((per_node - 1) * NCCL_LL_NVLINK_US
                                          + int(math.log2(nodes)) * NCCL_LL_NET_US["tree"])
    steps, inter = 2 * (ranks - 1), (2 * nodes if nodes > 1 else 0)
    intra = NCCL_LL_NVLINK_US if nodes == 1 else max(NCCL_LL_NVLINK_US, NCCL_NET_OVERHEAD_US)
    ring = NCCL_LL_BASE_US["ring"] + (steps - inter) * intra + inter * NCCL_LL_NET_US["ring"]
    return min(tree, ring) * 1e-6
