"""Tensor-parallel linear layers and their collectives, paired the way the code pairs them.

Each TP linear layer of a transformer layer is one GEMM forward, a data-gradient and a
weight-gradient GEMM backward, and the collectives that come with it (one collective moves
the tok x h activation, BF16, except that under FP8 with sequence parallelism Transformer
Engine gathers the GEMM inputs already quantized, 1 byte each: the norm output, the saved
input re-gathered for the weight gradient and the output gradient; v1.8 gathers the FP8
`ln_out` the norm kernel wrote, v2.x passes its quantizer to `gather_along_first_dim`; the
reduce-scatters and all-reduces stay BF16):

- without sequence parallelism: the row-parallel output is all-reduced after the forward
  (blocking), and the column-parallel input gradient after the data gradient; Transformer
  Engine's Linear / LayerNormLinear (v1.8, `backward`) launch that all-reduce asynchronously
  beside the weight-gradient GEMM (`tp_async_backward`), Megatron-LM of 2021 ran it blocking
  in autograd (`copy_to_tensor_model_parallel_region`);
- with sequence parallelism: the column-parallel input is all-gathered before the forward and
  the row-parallel output reduce-scattered after it (both blocking); backward, the
  row-parallel output gradient is all-gathered first (blocking, `grad_output_preprocess`),
  and each column-parallel layer all-gathers its saved input for the weight gradient beside
  the data-gradient GEMM and reduce-scatters the input gradient beside the weight-gradient
  GEMM (`async_op=True` in TE 1.8), so a layer has 4 collectives forward and 6 backward; an
  asynchronous NCCL collective beside a GEMM holds `gpus.NCCL_COMM_SMS` SMs while both run;
- with `tp_comm_overlap` (TE 1.8's userbuffers, `initialize_ub` defaults, the version of
  Megatron-Core r0.8): the column forward's all-gather and the row data gradient's all-gather
  are ring exchanges, one GEMM chunk per TP rank, so the first chunk runs on local data and
  (tp - 1) / tp of the GEMM hides the exchange; the row forward's reduce-scatter is pipelined
  in 4 splits, the last split's share exposed; the column backward's all-gather and
  reduce-scatter overlap in bulk with the whole data- and weight-gradient GEMMs. The pipelined
  and bulk kernels hold 16 SMs beside their GEMM, which ends late by them or, where the
  collective outlasts it, hides behind it (`kernels.beside`).

Every time is a prediction.
"""

from __future__ import annotations

from megatron_lgs.lgs.costmodel import HardwareProfile
from megatron_lgs.lgs.gpus import GpuProfile
from megatron_lgs.lgs.kernels import (
    beside,
    gemm_time,
    nccl_beside,
    sm_contention,
    tp_collective_time,
)
from megatron_lgs.lgs.runspec import Run

# TE 1.8 `initialize_ub`: pipelined reduce-scatter splits; its userbuffers kernels for the
# pipelined and bulk overlaps run on 16 SMs (`add_ub`'s num_sm=16 with set_sm_margin=0, and
# `UbufCommOverlap` sets use_ce=0: the GEMM is still launched on every SM and shares the GPU
# with them); the ring exchanges copy with the copy engines (use_ce=True) and take no SM.
UB_PIPELINE_SPLITS = 4
UB_COMM_SMS = 16

Parts = tuple[float, float, float]  # (forward, data gradient, weight gradient) seconds


def tp_link(r: Run, hw: HardwareProfile):
    return hw.intra if r.tp <= r.gpus_per_node else hw.inter


def tp_gemm_parts(r: Run, m: float, n: float, k: float, gpu: GpuProfile, column: bool
                  ) -> Parts:
    """(forward, data gradient, weight gradient) of a TP linear layer y = x W, x (m x k),
    W (k x n). With `tp_comm_overlap` its GEMMs run at the chunk shapes of TE's overlap."""
    fwd_split = dgrad_split = 1
    if r.tp_comm_overlap and r.tp > 1:
        fwd_split, dgrad_split = (r.tp, 1) if column else (UB_PIPELINE_SPLITS, r.tp)
    p = r.precision
    fwd = fwd_split * gemm_time(m / fwd_split, n, k, gpu, p)
    dgrad = dgrad_split * gemm_time(m / dgrad_split, k, n, gpu, p)
    return fwd, dgrad, gemm_time(k, n, m, gpu, p)


def tp_gemm(r: Run, m: float, n: float, k: float, gpu: GpuProfile, column: bool
            ) -> tuple[float, float]:
    """(forward, backward) of a TP linear layer (`tp_gemm_parts`)."""
    fwd, dgrad, wgrad = tp_gemm_parts(r, m, n, k, gpu, column)
    return fwd, dgrad + wgrad


def _beside(comm_s: float, gemm_s: float) -> float:
    return max(0.0, comm_s - gemm_s)


def tp_comm_exposed(r: Run, gpu: GpuProfile, hw: HardwareProfile, tok: float,
                    column: list[Parts], row: list[Parts]) -> tuple[float, float]:
    """(forward, backward) TP communication time on the layer's critical path: what each
    collective adds beyond the GEMM it is paired with, plus the SM sharing of the overlapped
    kernels."""
    if r.tp <= 1:
        return 0.0, 0.0
    link, nbytes = tp_link(r, hw), tok * r.hidden * 2
    gathered = nbytes / 2 if r.precision == "fp8" else nbytes
    if not r.sequence_parallel:
        ar = tp_collective_time("all_reduce", nbytes, r.tp, link)
        fwd = ar * len(row)
        if r.tp_async_backward:
            bwd = sum(nccl_beside(ar, w, gpu) for _, _, w in column)
        else:
            bwd = ar * len(column)
        return fwd, bwd
    ag = tp_collective_time("all_gather", gathered, r.tp, link)
    rs = tp_collective_time("reduce_scatter", nbytes, r.tp, link)
    if not r.tp_comm_overlap:
        fwd = ag * len(column) + rs * len(row)
        bwd = ag * len(row) + sum(nccl_beside(ag, d, gpu) + nccl_beside(rs, w, gpu)
                                  for _, d, w in column)
        return fwd, bwd
    hidden = (r.tp - 1) / r.tp  # ring exchange: all chunks but the first hide the exchange
    s = UB_PIPELINE_SPLITS
    fwd = (sum(_beside(ag, f * hidden) for f, _, _ in column)
           + sum(rs / s + max((s - 1) / s * _beside(rs, f), sm_contention(f, rs, gpu, UB_COMM_SMS))
                 for f, _, _ in row))
    bwd = (sum(_beside(ag, d * hidden) for _, d, _ in row)
           + sum(beside(ag, d, gpu, UB_COMM_SMS) + beside(rs, w, gpu, UB_COMM_SMS)
                 for _, d, w in column))
    return fwd, bwd


def expert_tp_comm(r: Run, hw: HardwareProfile, tok: float) -> float:
    """One direction of an MoE layer's expert-tensor-parallel traffic, blocking: megatron-core's
    all-to-all dispatcher (0.16, `token_dispatcher.py`) all-gathers the tokens it received
    over the expert-TP group before the experts and reduce-scatters their output after
    (backward: the reverse), BF16. None with etp = 1: each rank routes its own tokens; none
    under the allgather dispatcher, whose gather spans the expert-TP ranks already
    (`moecost.allgather_dispatch_time`)."""
    if not r.num_experts or r.etp <= 1 or r.moe_dispatcher == "allgather":
        return 0.0
    sp = r.tp if r.sequence_parallel else 1
    out = tok / sp * r.moe_topk * r.etp * r.hidden * 2  # gathered tokens, every copy
    link = hw.intra if r.etp <= r.gpus_per_node else hw.inter
    return (tp_collective_time("all_gather", out, r.etp, link)
            + tp_collective_time("reduce_scatter", out, r.etp, link))


def tp_collectives(r: Run) -> tuple[int, int]:
    """TP collective kernels a dense layer launches (forward, backward)."""
    if r.tp <= 1:
        return 0, 0
    return (4, 6) if r.sequence_parallel else (2, 2)
