"""Whole-step model under ZeRO 2 and 3 (Megatron-FSDP): the per-micro-batch gathers and
reduce-scatters against a hand calculation, and how the last micro-batch's reduction shares
the links with its gathers."""

from __future__ import annotations

from dataclasses import replace

import pytest

from megatron_lgs.lgs.costmodel import all_gather_time
from megatron_lgs.lgs.gpus import get_gpu, link_profile
from megatron_lgs.lgs.runspec import run_from_dict
from megatron_lgs.lgs.stepmodel import compute_phase, predict_run, stage_params

A100 = get_gpu("a100-80gb")
# 16 A100 at 25 Gb/s a GPU: the backward's gathers and reduce-scatters outlast its compute.
SLOW_ZERO3 = {"id": "z", "gpu": "a100-80gb", "num_gpus": 16, "num_layers": 16, "hidden": 4096,
              "heads": 32, "vocab": 32000, "seq_length": 2048, "tp": 1, "pp": 1,
              "micro_batch": 1, "global_batch": 64, "zero": 3, "nic_gbit_per_gpu": 25}


def run(**kw):
    return run_from_dict({**SLOW_ZERO3, **kw})


def beside(comm: float, work: float) -> float:
    """NCCL beside work on an A100: the work slowed by 16 of its 108 SMs while both run, or the
    collective where it outlasts that."""
    return max(comm - work, min(comm * 16 / 108, work * 16 / 92))


def gather_time(r) -> float:
    """The BF16 weights' all-gather over the 16 data-parallel ranks: 8 a node, then 2 nodes."""
    hw = link_profile(A100, 8, 25)
    dense = stage_params(r)[0][0]
    return all_gather_time(dense * 2, 8, hw.intra) + all_gather_time(dense * 2 / 8, 2, hw.inter)


def test_zero3_gathers_per_micro_batch() -> None:
    r = run()
    costs, _, _ = compute_phase(r)
    ag = gather_time(r)
    fwd = costs[0].fwd_s - costs[0].fwd["param_all_gather"]
    assert costs[0].fwd["param_all_gather"] == pytest.approx(beside(ag, fwd))
    # FP32 gradients reduce-scattered after each backward; the last micro-batch's reduction is
    # the replay's, the other 3 of 4 are charged here (spread over the 4). In those the
    # backward's gathers and reduce-scatters share the links, so they hide behind it together.
    rs = ag * 2
    bwd = costs[0].bwd_s - costs[0].bwd["dp_grad_sync"] - costs[0].bwd["param_all_gather"]
    assert r.num_micro_batches == 4
    assert costs[0].bwd["param_all_gather"] == pytest.approx(beside(ag, bwd))
    assert costs[0].bwd["dp_grad_sync"] == pytest.approx(
        3 / 4 * (beside(rs + ag, bwd) - beside(ag, bwd)))
    # The shared-links case, the collectives outlasting even the backward their SMs slow.
    assert rs + ag > bwd / (1 - 16 / 108)
    assert predict_run(r).memory.states_bytes < predict_run(replace(r, zero=1)).memory.states_bytes


def test_the_last_reduction_hides_only_behind_compute_its_gathers_leave() -> None:
    """Network-bound, the last micro-batch's gathers hold the links for all its backward, so
    its reduce-scatter is exposed whole: with one micro-batch a step, the step is at least
    every gather and reduction back to back. It once hid behind the gathers' own time as if
    it were compute, so fewer micro-batches a step made each cheaper (one a step 22% cheaper
    than 32 on a 126-layer model)."""
    one = run(global_batch=16)
    assert one.num_micro_batches == 1
    ag = gather_time(one)
    est = predict_run(one)
    links = 2 * ag + 2 * ag  # forward and backward gathers, FP32 reduce-scatter
    assert est.step_time_s > links
    assert est.breakdown["dp_grad_sync"] >= 2 * ag
    per_sample = [predict_run(run(global_batch=b)).step_time_s / b for b in (16, 32, 64, 256)]
    assert per_sample == sorted(per_sample, reverse=True), per_sample
