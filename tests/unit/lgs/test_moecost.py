"""Whole-step model: megatron-core's EP all-to-all overlap, its flex dispatcher, selective
recompute's modules and Megatron-FSDP beside expert parallelism against hand calculations, and
their one-line errors."""

from __future__ import annotations

import importlib
import inspect
import re
from dataclasses import replace

import pytest

from megatron_lgs.lgs.costmodel import all_gather_time, reduce_scatter_time
from megatron_lgs.lgs.gpus import HBM_EFFICIENCY, get_gpu, link_profile
from megatron_lgs.lgs.kernels import gemm_time
from megatron_lgs.lgs.layercost import layer_cost
from megatron_lgs.lgs.moecost import _layer_pair, flex_dispatch_time, moe_mlp
from megatron_lgs.lgs.runspec import Run, RunError, run_from_dict
from megatron_lgs.lgs.stepmemory import (
    activation_bytes,
    layer_activation_bytes,
    mlp_block_bytes,
    selective_freed_bytes,
    states_bytes,
)
from megatron_lgs.lgs.stepmodel import compute_phase, predict_run, stage_params
from megatron_lgs.lgs.tpcomm import expert_tp_comm

A100 = get_gpu("a100-80gb")
# 16 GPUs, EP8 over two nodes, 8 experts top-2: 4 micro-batches of one sequence per rank.
BASE = {"id": "t", "gpu": "a100-80gb", "num_gpus": 16, "num_layers": 8, "hidden": 4096,
        "heads": 32, "vocab": 32000, "seq_length": 2048, "tp": 1, "pp": 1, "micro_batch": 1,
        "global_batch": 64, "num_experts": 8, "moe_topk": 2, "ep": 8, "swiglu": True}


def run(**kw):
    return run_from_dict({**BASE, **kw})


def _beside(comm: float, compute: float) -> float:
    """NCCL beside compute on an A100: the compute slowed by 16 of its 108 SMs meanwhile, or
    the collective where it outlasts that."""
    return max(comm - compute, min(comm * 16 / 108, compute * 16 / 92))


def test_fine_grained_layer_pair_by_hand() -> None:
    """megatron-core's fine-grained 1F1B on two streams, one layer: the backward's combine (3)
    beside the attention forward (1); the forward's dispatch (1.5) beside the experts' data
    gradients (2), which wait for that combine; the backward's dispatch (3) after them, beside
    the experts' weight gradients (1) and forward (2); the forward's combine (1.5) beside the
    attention backward (2) and its weight gradients (0.5)."""
    parts = (1.0, 2.0, 2.0, 0.5, 2.0, 1.0)  # a_f, m_f, a_b, a_dw, m_b, m_dw
    # cb 0-3, af 0-1, df 3-4.5, mb 3-5, db 5-8, m_dw 5-6, mf 6-8, cf 8-9.5, ab 8-10, a_dw -10.5
    assert _layer_pair(*parts, 1.5, 3.0, 1) == 10.5
    # The next layer starts at the last one's combine (9.5) and attention backward (10): cb
    # 10-13, af 10.5-11.5, df 13-14.5, mb 13-15, db 15-18, mf 16-18, cf 18-19.5, ab 18-20, a_dw
    # 20-20.5.
    assert _layer_pair(*parts, 1.5, 3.0, 2) == pytest.approx(20.5 / 2)
    assert _layer_pair(*parts, 0.0, 0.0, 3) == pytest.approx(sum(parts))
    assert _layer_pair(0, 0, 0, 0, 0, 0, 1.5, 3.0, 2) == pytest.approx(2 * (1.5 + 3.0))


def _overlapped(r: Run, plain) -> tuple[float, float]:
    """(forward, backward) all-to-all of one layer under the overlap, from the plain layer's
    terms split into the schedule's nodes by hand: the experts' GEMMs and element-wise bytes
    (`moe_mlp`) between dispatch and combine, the rest of the layer the attention node; weight
    gradients apart with delay_wgrad_compute."""
    hw = link_profile(A100, r.gpus_per_node, r.nic_gbit_per_gpu)
    hbm = 2039e9 * HBM_EFFICIENCY
    moe = moe_mlp(r, A100, hw, r.micro_batch * r.seq_length)
    a2a = plain.fwd["moe_all_to_all"]
    busy_f, busy_b = plain.fwd_s - a2a, plain.bwd_s - a2a
    m_f = moe.experts_fwd + moe.elem_f / hbm
    m_b, m_dw = moe.experts_dgrad + moe.elem_b / hbm, moe.experts_wgrad
    # One local expert (8 on EP8) gets a sequence's 2048 tokens x top-2 of the group's 8: 4096.
    assert m_dw == pytest.approx(gemm_time(4096, 2 * 16384, 4096, A100, "bf16")
                                 + gemm_time(16384, 4096, 4096, A100, "bf16"))
    if r.delay_wgrad_compute:
        # The attention node's weight gradients: QKV (4096 -> 3 x 4096) and projection, 2048
        # tokens.
        a_dw = (gemm_time(4096, 3 * 4096, 2048, A100, "bf16")
                + gemm_time(4096, 4096, 2048, A100, "bf16"))
    else:
        a_dw = 0.0
        m_b, m_dw = m_b + m_dw, 0.0
    a_b = busy_b - m_b - m_dw - a_dw
    f = 16 / 108  # NCCL's SMs of an A100's

    def slowed(compute: float, comm: float) -> float:
        return min(compute + comm * f, compute / (1 - f))

    half = a2a / 2
    pair = _layer_pair(slowed(busy_f - m_f, half), slowed(m_dw + m_f, half) - m_dw,
                       slowed(a_b + a_dw, half) - a_dw, a_dw, slowed(m_b, half), m_dw,
                       half, half, r.num_layers // (r.pp * r.vpp))
    exposed = pair - busy_f - busy_b
    return exposed / 2, exposed / 2


# EP8 over two nodes of 4 GPUs at 25 Gb/s a GPU: the all-to-alls outlast the compute beside
# them in some phases.
SLOW = {"gpus_per_node": 4, "nic_gbit_per_gpu": 25}


@pytest.mark.parametrize("kw", [{}, SLOW, {**SLOW, "delay_wgrad_compute": True}])
def test_all_to_all_overlap_by_hand(kw) -> None:
    r = run(**{k: v for k, v in kw.items() if k != "delay_wgrad_compute"})
    hw = link_profile(A100, r.gpus_per_node, r.nic_gbit_per_gpu)
    plain = layer_cost(r, A100, hw)
    both = layer_cost(replace(r, moe_a2a_overlap=True, **kw), A100, hw)
    a2a = plain.fwd["moe_all_to_all"]
    assert plain.fwd["host_overhead"] == plain.bwd["host_overhead"] == 0.0
    assert a2a == plain.bwd["moe_all_to_all"] > 0
    # 4 micro-batches: the first forward and the last backward run alone (1/4 of each).
    alone = 1 / r.num_micro_batches
    assert alone == 1 / 4
    fwd, bwd = _overlapped(replace(r, moe_a2a_overlap=True, **kw), plain)
    assert both.fwd["moe_all_to_all"] == pytest.approx(alone * a2a + (1 - alone) * fwd)
    assert both.bwd["moe_all_to_all"] == pytest.approx(alone * a2a + (1 - alone) * bwd)
    assert both.fwd["moe_all_to_all"] < a2a and both.bwd["moe_all_to_all"] < a2a
    for term in ("gemm", "attention", "elementwise"):
        assert both.fwd[term] == plain.fwd[term] and both.bwd[term] == plain.bwd[term]


def test_interleaved_warm_up_keeps_its_all_to_all() -> None:
    # PP2 VP2 over 32 micro-batch chunks: the first stage runs 2 (pp - 1) + (vp - 1) pp + 1 = 5
    # forwards alone, the schedule's warm-up and the one more the overlap adds.
    r = run(pp=2, vpp=2, num_gpus=32, global_batch=256, **SLOW)
    hw = link_profile(A100, r.gpus_per_node, r.nic_gbit_per_gpu)
    assert r.num_micro_batches * r.vpp == 32
    plain, both = layer_cost(r, A100, hw), layer_cost(replace(r, moe_a2a_overlap=True), A100, hw)
    a2a = plain.fwd["moe_all_to_all"]
    fwd, _ = _overlapped(replace(r, moe_a2a_overlap=True), plain)
    assert fwd > 0
    assert both.fwd["moe_all_to_all"] == pytest.approx(5 / 32 * a2a + 27 / 32 * fwd)


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
    {"moe_dispatcher": "allgather"},
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
    moe = moe_mlp(plain, A100, hw, tok)
    assert recompute(["moe"]) == pytest.approx(moe.fwd + moe.elem_f / hbm + moe.a2a)
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


def test_allgather_dispatcher_by_hand() -> None:
    """megatron-core's allgather dispatcher: each rank gathers every token of its expert-TP x
    EP group (hidden state, BF16, plus a byte and two per expert for the routing map and the
    probabilities) and reduce-scatters the experts' outputs back, over NVLink inside a node
    and over the network beyond; no separate expert-TP gather, which the gather spans."""
    hw = link_profile(A100)
    tok, h = 2048, 4096
    one_node = run(moe_dispatcher="allgather")  # EP8 inside a node, 8 experts
    gathered = tok * 8
    expected = (all_gather_time(gathered * (h * 2 + 8 * 3), 8, hw.intra)
                + reduce_scatter_time(gathered * h * 2, 8, hw.intra))
    c = layer_cost(one_node, A100, hw)
    assert c.fwd["moe_all_to_all"] == pytest.approx(expected) == c.bwd["moe_all_to_all"]
    two = run(moe_dispatcher="allgather", ep=16, num_experts=16, num_gpus=32, global_batch=128)
    gathered = tok * 16
    expected = (all_gather_time(gathered * (h * 2 + 16 * 3), 16, hw.inter)
                + reduce_scatter_time(gathered * h * 2, 16, hw.inter))
    assert layer_cost(two, A100, hw).fwd["moe_all_to_all"] == pytest.approx(expected)
    # With expert TP the group is etp x ep and each rank holds its TP share of the tokens.
    etp = run(moe_dispatcher="allgather", tp=2, etp=2, ep=4, sequence_parallel=True)
    gathered = tok / 2 * 8
    expected = (all_gather_time(gathered * (h * 2 + 8 * 3), 8, hw.intra)
                + reduce_scatter_time(gathered * h * 2, 8, hw.intra))
    assert layer_cost(etp, A100, hw).fwd["moe_all_to_all"] == pytest.approx(expected)
    assert expert_tp_comm(etp, hw, tok) == 0 < expert_tp_comm(
        replace(etp, moe_dispatcher="alltoall"), hw, tok)


@pytest.mark.parametrize(("kw", "says"), [
    ({"moe_dispatcher": "deepep"}, "must be one of"),
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


def test_delayed_weight_gradients_need_the_overlap() -> None:
    with pytest.raises(RunError, match="delay_wgrad_compute") as info:
        run(delay_wgrad_compute=True)
    assert "\n" not in str(info.value)


def test_expert_tp_traffic_joins_the_overlapped_all_to_alls() -> None:
    """Under the overlap the expert-TP gather and scatter run inside dispatch and combine, on
    the communication stream, so they leave the layer's TP term."""
    r = run(tp=2, num_gpus=32, global_batch=128, **SLOW)
    assert r.etp == 2
    hw = link_profile(A100, r.gpus_per_node, r.nic_gbit_per_gpu)
    plain, both = layer_cost(r, A100, hw), layer_cost(replace(r, moe_a2a_overlap=True), A100, hw)
    gathers = expert_tp_comm(r, hw, r.micro_batch * r.seq_length)
    assert gathers > 0
    assert both.fwd["tp_comm"] == pytest.approx(plain.fwd["tp_comm"] - gathers)
    assert both.bwd["tp_comm"] == pytest.approx(plain.bwd["tp_comm"] - gathers)


def test_layer_pair_replays_megatron_cores_order() -> None:
    """`_layer_pair` replays the op order of megatron-core 0.16's
    `TransformerLayerSchedulePlan.run`; when an upgrade reorders it, this fails before the
    model silently pairs the wrong phases. The first attention backward is the
    `ep_overlap_early_attn_memory_release` branch, off by default and not modelled."""
    module = importlib.import_module("megatron.core.models.common.model_chunk_schedule_plan")
    source = inspect.getsource(module.TransformerLayerSchedulePlan.run)
    ops = re.findall(r"\b([fb])_layer\.(attn|mlp|moe_dispatch|moe_combine)\."
                     r"(forward|backward_dw|backward)\(", source)
    assert [f"{d} {node} {op}" for d, node, op in ops] == [
        "b moe_combine backward", "f attn forward", "b mlp backward", "f moe_dispatch forward",
        "b mlp backward_dw", "b moe_dispatch backward", "b attn backward", "f mlp forward",
        "f moe_combine forward", "b attn backward", "b attn backward_dw"]
    assert "if b_layer is not None and b_layer.config.ep_overlap_early_attn_memory_release:" \
        in source
