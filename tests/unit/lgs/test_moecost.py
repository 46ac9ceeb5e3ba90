"""Whole-step model: megatron-core's EP all-to-all overlap against a hand calculation, and its
one-line errors."""

from __future__ import annotations

from dataclasses import replace

import pytest

from megatron_lgs.lgs.gpus import get_gpu, link_profile
from megatron_lgs.lgs.layercost import layer_cost
from megatron_lgs.lgs.runspec import RunError, run_from_dict
from megatron_lgs.lgs.stepmodel import predict_run

A100 = get_gpu("a100-80gb")
# 16 GPUs, EP8 over two nodes, 8 experts top-2: 4 micro-batches of one sequence per rank.
BASE = {"id": "t", "gpu": "a100-80gb", "num_gpus": 16, "num_layers": 8, "hidden": 4096,
        "heads": 32, "vocab": 32000, "seq_length": 2048, "tp": 1, "pp": 1, "micro_batch": 1,
        "global_batch": 64, "num_experts": 8, "moe_topk": 2, "ep": 8, "swiglu": True}


def run(**kw):
    return run_from_dict({**BASE, **kw})


def _beside(comm: float, compute: float) -> float:
    """NCCL beside compute on an A100: what outlasts it, plus 16 of its 108 SMs meanwhile."""
    return max(0.0, comm - compute) + min(comm * 16 / 108, compute * 16 / 92)


def test_all_to_all_overlap_by_hand() -> None:
    hw = link_profile(A100)
    plain = layer_cost(run(), A100, hw)
    both = layer_cost(run(moe_a2a_overlap=True), A100, hw)
    a2a = plain.fwd["moe_all_to_all"]
    busy_f, busy_b = plain.fwd_s - a2a, plain.bwd_s - plain.bwd["moe_all_to_all"]
    assert plain.fwd["host_overhead"] == plain.bwd["host_overhead"] == 0.0
    assert a2a == plain.bwd["moe_all_to_all"] > 0
    # 4 micro-batches: the first forward and the last backward run alone (1/4 of each).
    alone = 1 / run().num_micro_batches
    assert alone == 1 / 4
    assert both.fwd["moe_all_to_all"] == pytest.approx(
        alone * a2a + (1 - alone) * _beside(a2a, busy_b))
    assert both.bwd["moe_all_to_all"] == pytest.approx(
        alone * a2a + (1 - alone) * _beside(a2a, busy_f))
    assert both.fwd["moe_all_to_all"] < a2a and both.bwd["moe_all_to_all"] < a2a
    for term in ("gemm", "attention", "elementwise"):
        assert both.fwd[term] == plain.fwd[term] and both.bwd[term] == plain.bwd[term]


def test_interleaved_warm_up_keeps_its_all_to_all() -> None:
    # PP2 VP2 over 32 micro-batch chunks: the first stage runs 2 (pp - 1) + (vp - 1) pp + 1 = 5
    # forwards alone, the schedule's warm-up and the one more the overlap adds.
    hw = link_profile(A100)
    r = run(pp=2, vpp=2, num_gpus=32, global_batch=256)
    assert r.num_micro_batches * r.vpp == 32
    plain, both = layer_cost(r, A100, hw), layer_cost(replace(r, moe_a2a_overlap=True), A100, hw)
    a2a = plain.fwd["moe_all_to_all"]
    busy_b = plain.bwd_s - plain.bwd["moe_all_to_all"]
    assert both.fwd["moe_all_to_all"] == pytest.approx(
        5 / 32 * a2a + 27 / 32 * _beside(a2a, busy_b))


def test_all_to_all_overlap_never_slows_the_step() -> None:
    for kw in ({}, {"pp": 2, "vpp": 2, "num_gpus": 32, "global_batch": 256},
               {"recompute": "selective"}):
        r = run(**kw)
        assert (predict_run(replace(r, moe_a2a_overlap=True)).step_time_s
                < predict_run(r).step_time_s)


@pytest.mark.parametrize("kw", [
    {"ep": 1},
    {"recompute": "full"},
    {"pp": 2, "num_gpus": 32, "global_batch": 256},  # pp > 1 without virtual stages
])
def test_all_to_all_overlap_refuses_what_megatron_core_refuses(kw) -> None:
    with pytest.raises(RunError, match="moe_a2a_overlap") as info:
        run(moe_a2a_overlap=True, **kw)
    assert "\n" not in str(info.value)
