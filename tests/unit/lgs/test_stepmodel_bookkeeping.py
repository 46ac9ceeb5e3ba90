"""Whole-step model: TE's overlap kernels sharing the SMs, the gradient bookkeeping and the
optimizer's passes, each against a hand calculation."""

from __future__ import annotations

from dataclasses import replace

import pytest

from megatron_lgs.lgs import stepmodel
from megatron_lgs.lgs.costmodel import all_gather_time, reduce_scatter_time
from megatron_lgs.lgs.gpus import HBM_EFFICIENCY, get_gpu, link_profile
from megatron_lgs.lgs.gradbuffer import accumulate_bytes, optimizer_bytes_per_param, step_bytes
from megatron_lgs.lgs.kernels import sm_contention
from megatron_lgs.lgs.layercost import layer_cost
from megatron_lgs.lgs.runspec import run_from_dict
from megatron_lgs.lgs.stepmodel import predict_run, stage_costs, stage_params
from megatron_lgs.lgs.tpcomm import UB_COMM_SMS, UB_PIPELINE_SPLITS, tp_gemm_parts

H100 = get_gpu("h100-sxm")
A100 = get_gpu("a100-80gb")
BASE = {"id": "t", "gpu": "h100-sxm", "num_gpus": 16, "num_layers": 4, "hidden": 4096,
        "heads": 32, "vocab": 32768, "seq_length": 4096, "tp": 8, "pp": 1, "micro_batch": 1,
        "global_batch": 8}


def run(**kw):
    return run_from_dict({**BASE, **kw})


def test_sm_contention_by_hand() -> None:
    # 16 of 132 SMs busy for 1 ms beside a 4 ms GEMM: it loses 16/132 of that millisecond.
    assert sm_contention(4e-3, 1e-3, H100, 16) == pytest.approx(1e-3 * 16 / 132)
    # A comm kernel outlasting the GEMM slows all of it to 116/132 of its rate.
    assert sm_contention(1e-3, 5e-3, H100, 16) == pytest.approx(1e-3 * 132 / 116 - 1e-3)
    assert sm_contention(1e-3, 5e-3, A100, 16) == pytest.approx(1e-3 * 108 / 92 - 1e-3)
    assert sm_contention(1e-3, 5e-3, A100, 8) == pytest.approx(1e-3 * 108 / 100 - 1e-3)


def test_layer_tp_comm_with_te_overlap_by_hand() -> None:
    r = run(tp_comm_overlap=True)
    hw = link_profile(H100)
    tok, h, t, f = 4096, 4096, 8, 4 * 4096
    qkv = tp_gemm_parts(r, tok, 3 * h / t, h, H100, column=True)
    proj = tp_gemm_parts(r, tok, h, h / t, H100, column=False)
    fc1 = tp_gemm_parts(r, tok, f / t, h, H100, column=True)
    fc2 = tp_gemm_parts(r, tok, h, f / t, H100, column=False)
    ag = all_gather_time(tok * h * 2, t, hw.intra)
    rs = reduce_scatter_time(tok * h * 2, t, hw.intra)
    s = UB_PIPELINE_SPLITS
    # Forward: ring-exchange all-gathers hide behind 7 of the 8 GEMM chunks; the pipelined
    # reduce-scatters expose their last split, and beyond it whichever ends later: what
    # outlasts the GEMM, or the row-parallel GEMM slowed by the pipelined kernels' 16 SMs.
    def later(comm_over: float, gemm: float, comm: float) -> float:
        return max(comm_over, sm_contention(gemm, comm, H100, UB_COMM_SMS))

    fwd = (sum(max(0.0, ag - p[0] * 7 / 8) for p in (qkv, fc1))
           + sum(rs / s + later((s - 1) / s * max(0.0, rs - p[0]), p[0], rs)
                 for p in (proj, fc2)))
    # Backward: the row data gradients' ring exchanges, the column bulk all-gather beside the
    # data gradient and reduce-scatter beside the weight gradient (with their 16 SMs).
    bwd = (sum(max(0.0, ag - p[1] * 7 / 8) for p in (proj, fc2))
           + sum(later(ag - p[1], p[1], ag) + later(rs - p[2], p[2], rs) for p in (qkv, fc1)))
    c = layer_cost(r, H100, hw)
    assert c.fwd["gemm"] == pytest.approx(sum(p[0] for p in (qkv, proj, fc1, fc2)))
    assert c.fwd["tp_comm"] == pytest.approx(fwd) and c.bwd["tp_comm"] == pytest.approx(bwd)
    # On this shape the projection's exchange outlasts its 1/8-wide GEMM, so the pairing
    # exposes time that pooling all the layer's GEMMs would have hidden.
    assert ag > proj[1] * 7 / 8
    assert c.fwd["tp_comm"] > 0 and c.bwd["tp_comm"] > 0


def test_grad_accumulation_bytes_by_hand() -> None:
    # megatron-core: only the word embedding's gradient goes through the hook, plus its
    # zero-filled dense gradient: 2 (zero) + 4 + 2 + 4 (main_grad += grad) bytes per element.
    r = run(tp=2, num_gpus=8, global_batch=16)  # dp 4, 4 micro-batches
    emb = 32768 * 4096 / 2
    assert accumulate_bytes(r, 1e9, emb) == pytest.approx(12 * emb)
    # 2021: autograd adds each later micro-batch's FP16 gradient in place (3 x 2 bytes), 3 of
    # the 4 micro-batches; the embedding's dense gradient is still zero-filled (2 bytes).
    old = replace(r, grad_buffer=False, precision="fp16")
    assert accumulate_bytes(old, 1e9, emb) == pytest.approx(2 * emb + 6 * 1e9 * 3 / 4)
    # The stage's cost carries it on stage 0's backward as memory-bound time.
    c = stage_costs(r, H100, link_profile(H100))[0]
    dense, expert = stage_params(r)[0]
    hbm = 3350e9 * HBM_EFFICIENCY
    assert c.bwd["grad_buffer"] == pytest.approx(accumulate_bytes(r, dense + expert, emb) / hbm)


def test_step_passes_and_optimizer_bytes_by_hand() -> None:
    r = run(tp=2, num_gpus=8, global_batch=16, distributed_optimizer=True)
    # Zero the FP32 buffer (4), read it for the NaN check (4) and scale it by 1/dp before the
    # reduce-scatter (4 + 4).
    assert step_bytes(r, 1e9) == pytest.approx(16e9)
    assert step_bytes(replace(r, dp=1), 1e9) == pytest.approx(8e9)  # no collective, no scale
    # 2021: flatten (2 + 2), divide (2 + 2), copy back (2 + 2) the FP16 gradients.
    old = replace(r, grad_buffer=False, precision="fp16")
    assert step_bytes(old, 1e9) == pytest.approx(12e9)
    # Grad norm 4 + FusedAdam 28 + master -> model copy 6; FP16 unscale 8; FP16 -> FP32 cast 6.
    assert optimizer_bytes_per_param(r) == 38
    assert optimizer_bytes_per_param(replace(r, precision="fp16")) == 46
    assert optimizer_bytes_per_param(old) == 52
    # FusedAdam reads and writes the state it keeps: 10 B (BF16 weights' FP32 remainders) saves 4.
    assert optimizer_bytes_per_param(replace(r, optimizer_state_bytes=10)) == 34
    # In the step: one stage, the optimizer on the dp shard, the buffer passes on all of it.
    est = predict_run(r)
    dense = stage_params(r)[0][0]
    hbm = 3350e9 * HBM_EFFICIENCY
    assert est.breakdown["optimizer"] == pytest.approx(dense / 4 * 38 / hbm)
    per_mb = stage_costs(r, H100, link_profile(H100))[0].bwd["grad_buffer"]
    assert est.breakdown["grad_buffer"] == pytest.approx(4 * per_mb + 16 * dense / hbm)
    assert sum(est.breakdown.values()) == pytest.approx(est.step_time_s)


def test_tied_embedding_gradient_all_reduce_by_hand(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tied embeddings under a pipeline: after the data-parallel sync, the first and the last
    stage all-reduce the whole vocab x hidden / tp gradient slice, over the network when the
    job spans nodes; before the optimizer, so the step grows by exactly that."""
    tied = run(pp=2, tp=4, num_gpus=16, untie_embeddings=False, grad_reduce_in_fp32=True)
    hw = link_profile(H100)
    n = 32768 * 4096 / 4 * 4  # FP32 main grads
    by_hand = 2 * hw.inter.alpha_s + n / hw.inter.bandwidth_Bps  # two ranks: each sends n / 2
    est = predict_run(tied)
    assert est.breakdown["embedding_grad_sync"] == pytest.approx(by_hand)
    monkeypatch.setattr(stepmodel, "tied_embedding_sync", lambda r, hw: 0.0)
    assert est.step_time_s - predict_run(tied).step_time_s == pytest.approx(by_hand)
    monkeypatch.undo()
    # One node: NVLink. Untied, or no pipeline: nothing to all-reduce.
    one_node = run(pp=2, tp=4, num_gpus=8, untie_embeddings=False, grad_reduce_in_fp32=True)
    assert predict_run(one_node).breakdown["embedding_grad_sync"] == pytest.approx(
        2 * hw.intra.alpha_s + n / hw.intra.bandwidth_Bps)
    for other in (replace(tied, untie_embeddings=True), run(untie_embeddings=False)):
        assert predict_run(other).breakdown["embedding_grad_sync"] == 0.0
