"""Whole-step model: megatron-core's EP all-to-all overlap, its flex dispatcher, selective
recompute's modules and Megatron-FSDP beside expert parallelism against hand calculations, and
their one-line errors."""

from __future__ import annotations

from dataclasses import replace

import pytest

from megatron_lgs.lgs.costmodel import all_gather_time
from megatron_lgs.lgs.gpus import HBM_EFFICIENCY, get_gpu, link_profile
from megatron_lgs.lgs.layercost import layer_cost
from megatron_lgs.lgs.moecost import flex_dispatch_time, moe_mlp
from megatron_lgs.lgs.runspec import Run, RunError, run_from_dict
from megatron_lgs.lgs.stepmemory import (
    activation_bytes,
    layer_activation_bytes,
    mlp_block_bytes,
    selective_freed_bytes,
    states_bytes,
)
from megatron_lgs.lgs.stepmodel import compute_phase, predict_run, stage_params

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


def test_selective_recompute_modules_by_hand() -> None:
    """Per module of Megatron-LM's --recompute-modules: moe_act runs the experts' SwiGLU again
    (3 passes of the expert width, BF16, per routed token copy), layernorm an MoE layer's
    pre-MLP norm (a read and a write of the hidden state), core_attn the attention forward;
    a dense layer has neither of the first two to recompute."""
    hw = link_profile(A100)
    hbm = 2039e9 * HBM_EFFICIENCY
    tok, h, f, k = 2048, 4096, 4 * 4096, 2

    def recompute(modules: list[str], **kw) -> float:
        r = run(recompute="selective", recompute_modules=modules, **kw)
        return layer_cost(r, A100, hw).bwd["recompute"]

    act, norm = recompute(["moe_act"]), recompute(["layernorm"])
    assert act == pytest.approx(tok * k * 3 * f * 2 / hbm)
    assert norm == pytest.approx(2 * tok * h * 2 / hbm)
    attn = layer_cost(run(), A100, hw).fwd["attention"]
    assert recompute(["core_attn"]) == pytest.approx(attn)
    assert recompute(["core_attn", "moe_act", "layernorm"]) == pytest.approx(attn + act + norm)
    assert recompute(["moe_act", "layernorm"], num_experts=0, ep=1) == 0.0
    # moe: the whole block's forward again, router, experts, permutes and both all-to-alls.
    plain = run()
    mf, _, elem_f, _, a2a = moe_mlp(plain, A100, hw, tok)
    assert recompute(["moe"]) == pytest.approx(mf + elem_f / hbm + a2a)
    assert recompute(["moe", "moe_act"]) == recompute(["moe"])
    for modules in (["moe_act"], ["layernorm"], ["moe"], ["core_attn", "moe_act", "layernorm"]):
        steps = [predict_run(run(**kw)).step_time_s for kw in (
            {}, {"recompute": "selective", "recompute_modules": modules}, {"recompute": "full"})]
        assert steps[0] < steps[1] < steps[2], modules


def test_selective_recompute_frees_what_its_modules_recompute() -> None:
    """moe_act frees each routed token copy's second-GEMM input (BF16, 1 B under FP8),
    layernorm the router's BF16 input; the peak of a one-stage run falls by that per layer."""
    tok, h, f, k = 2048, 4096, 4 * 4096, 2

    def freed(modules: list[str], **kw) -> float:
        r = run(recompute="selective", recompute_modules=modules, **kw)
        return selective_freed_bytes(r, layer_activation_bytes(r))

    assert freed(["moe_act"]) == tok * k * 2 * f
    assert freed(["moe_act"], gpu="h100-sxm", precision="fp8") == tok * k * 1 * f
    assert freed(["layernorm"]) == tok * 2 * h
    assert freed(["core_attn"]) == 0.0  # fused attention keeps no scores
    assert freed(["moe_act", "layernorm"], num_experts=0, ep=1) == 0.0
    # moe keeps the block's BF16 input alone; with layernorm not even that.
    assert freed(["moe"]) == pytest.approx(tok * (mlp_block_bytes(run()) - 2 * h))
    assert freed(["moe", "layernorm"]) == pytest.approx(tok * mlp_block_bytes(run()))
    plain = run()
    sel = run(recompute="selective", recompute_modules=["moe_act", "layernorm"])
    assert activation_bytes(plain, 0) - activation_bytes(sel, 0) == pytest.approx(
        plain.num_layers * (tok * k * 2 * f + tok * 2 * h))


@pytest.mark.parametrize(("kw", "says"), [
    ({"recompute": "selective", "recompute_modules": ["mlp"]}, "non-empty list"),
    ({"recompute": "selective", "recompute_modules": []}, "non-empty list"),
    ({"recompute_modules": ["moe_act"]}, "takes recompute"),
])
def test_recompute_modules_errors(kw, says) -> None:
    with pytest.raises(RunError, match="recompute_modules") as info:
        run(**kw)
    assert says in str(info.value) and "\n" not in str(info.value)


def test_flex_dispatcher_by_hand() -> None:
    """DeepEP/HybridEP send a token once to each GPU holding any of its experts and across
    nodes once per node: with 8 experts top-2 on EP8 inside a node a GPU holds 1 expert, so a
    token reaches it with probability 1 - (7/8)(6/7) = 1/4, each of the 7 peers; across two
    nodes (EP16, 16 experts) a node holds 8, reached with probability 1 - (8/16)(7/15)."""
    hw = link_profile(A100)
    tok, row = 2048, 4096 * 2
    one_node = run(moe_dispatcher="flex")
    nvlink = tok * 7 * (1 / 4) * row
    expected = 7 * hw.intra.alpha_s + nvlink / hw.intra.bandwidth_Bps
    assert flex_dispatch_time(one_node, hw, tok) == pytest.approx(expected)
    two = run(moe_dispatcher="flex", ep=16, num_experts=16, num_gpus=32, global_batch=128)
    on_gpu, on_node = 1 - (15 / 16) * (14 / 15), 1 - (8 / 16) * (7 / 15)
    t_intra = 7 * hw.intra.alpha_s + tok * 2 * 7 * on_gpu * row / hw.intra.bandwidth_Bps
    t_inter = hw.inter.alpha_s + tok * on_node * row / hw.inter.bandwidth_Bps
    assert flex_dispatch_time(two, hw, tok) == pytest.approx(max(t_intra, t_inter))
    # The all-to-all dispatcher sends a copy per routed expert: the same traffic where a GPU
    # holds one expert and a node one GPU's worth, more where a token's experts share either.
    def a2a(r: Run) -> float:
        return layer_cost(r, A100, hw).fwd["moe_all_to_all"]

    assert a2a(one_node) == pytest.approx(a2a(replace(one_node, moe_dispatcher="alltoall")))
    assert 0 < a2a(two) < a2a(replace(two, moe_dispatcher="alltoall"))


@pytest.mark.parametrize(("kw", "says"), [
    ({"moe_dispatcher": "allgather"}, "not modelled"),
    ({"moe_dispatcher": "flex", "ep": 1}, "ep > 1"),
    ({"moe_dispatcher": "flex", "tp": 2, "etp": 2}, "etp 1"),
    ({"moe_dispatcher": "flex", "ep": 4, "gpus_per_node": 3, "num_gpus": 12,
      "global_batch": 48}, "whole nodes"),
])
def test_moe_dispatcher_errors(kw, says) -> None:
    with pytest.raises(RunError, match="moe_dispatcher") as info:
        run(**kw)
    assert says in str(info.value) and "\n" not in str(info.value)


def test_megatron_fsdp_beside_tp_and_ep_by_hand() -> None:
    """ZeRO-3 with TP2 EP8 (expert TP 1) on two nodes: each micro-batch gathers the dense
    weights over the 8 data-parallel ranks (4 a node, 2 nodes) and the experts over their 2
    expert-data-parallel ranks (one a node); the states shrink to those shards."""
    r = run(tp=2, etp=1, zero=3, global_batch=32)
    assert (r.dp, r.num_micro_batches) == (8, 4)
    hw = link_profile(A100)
    (dense, expert), = stage_params(r)
    ag = (all_gather_time(dense * 2, 4, hw.intra) + all_gather_time(dense * 2 / 4, 2, hw.inter)
          + all_gather_time(expert * 2, 2, hw.inter))
    costs, _, _ = compute_phase(r)
    fwd = costs[0].fwd_s - costs[0].fwd["param_all_gather"]
    assert costs[0].fwd["param_all_gather"] == pytest.approx(_beside(ag, fwd))
    assert states_bytes(r, dense, expert) < states_bytes(replace(r, zero=1), dense, expert)
    with pytest.raises(RunError, match="zero") as info:
        run(tp=2, etp=1, zero=3, pp=2, global_batch=32, num_gpus=32)
    assert "pipeline" in str(info.value) and "\n" not in str(info.value)
