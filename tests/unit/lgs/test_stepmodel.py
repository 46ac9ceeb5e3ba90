"""Whole-step model: each term against a hand calculation, and the model's invariants."""

from __future__ import annotations

from dataclasses import replace

import pytest

from megatron_lgs.lgs import stepmodel, timeline
from megatron_lgs.lgs.costmodel import all_gather_time, reduce_scatter_time, ring_allreduce_time
from megatron_lgs.lgs.flops import layer_flops_per_token
from megatron_lgs.lgs.gpus import HBM_EFFICIENCY, get_gpu, link_profile, slowest_gpu
from megatron_lgs.lgs.kernels import all_to_all_time, gemm_time
from megatron_lgs.lgs.layercost import layer_cost
from megatron_lgs.lgs.runspec import RunError, run_from_dict
from megatron_lgs.lgs.stepmemory import layer_activation_bytes, states_bytes
from megatron_lgs.lgs.stepmodel import (
    compute_phase,
    predict_run,
    stage_costs,
    stage_params,
    sync_workload,
)
from megatron_lgs.lgs.timeline import chunk_ops
from megatron_lgs.lgs.tpcomm import tp_gemm_parts
from megatron_lgs.lgs.workload import stage_backward, stage_numel

A100 = get_gpu("a100-80gb")
BASE = {"id": "t", "gpu": "a100-80gb", "num_gpus": 64, "num_layers": 16, "hidden": 4096,
        "heads": 32, "vocab": 32000, "seq_length": 2048, "tp": 4, "pp": 2, "micro_batch": 1,
        "global_batch": 256}


def run(**kw):
    return run_from_dict({**BASE, **kw})


def test_tp_comm_term_by_hand() -> None:
    r = run()
    hw = link_profile(A100)
    nbytes = 2048 * 4096 * 2
    pair = reduce_scatter_time(nbytes, 4, hw.intra) + all_gather_time(nbytes, 4, hw.intra)
    c = layer_cost(r, A100, hw)
    assert c.fwd["tp_comm"] == pytest.approx(2 * pair)
    # Backward: the row-parallel output gradients' all-gathers block; each column-parallel
    # layer's input all-gather runs beside its data gradient and its reduce-scatter beside
    # its weight gradient (TE 1.8, async_op=True).
    ag, rs = all_gather_time(nbytes, 4, hw.intra), reduce_scatter_time(nbytes, 4, hw.intra)
    tok, h = 2048, 4096
    qkv = tp_gemm_parts(r, tok, 3 * h / 4, h, A100, column=True)
    fc1 = tp_gemm_parts(r, tok, 4 * h / 4, h, A100, column=True)
    # NCCL's 16 CTAs hold 16 of the A100's 108 SMs beside each GEMM [NCCL689].
    def nccl(comm, gemm):
        return max(comm - gemm, min(comm * 16 / 108, gemm * 16 / 92))

    beside = sum(nccl(ag, d) + nccl(rs, w) for _, d, w in (qkv, fc1))
    assert c.bwd["tp_comm"] == pytest.approx(2 * ag + beside)
    assert beside > sum(max(0.0, ag - d) + max(0.0, rs - w) for _, d, w in (qkv, fc1))
    # Without SP: 2 all-reduces forward, the 2 column input-gradient ones beside the weight
    # gradients backward; blocking as in 2021's Megatron-LM with tp_async_backward false.
    ar = ring_allreduce_time(nbytes, 4, hw.intra)
    nosp = layer_cost(replace(r, sequence_parallel=False), A100, hw)
    assert nosp.fwd["tp_comm"] == pytest.approx(2 * ar)
    assert nosp.bwd["tp_comm"] == pytest.approx(sum(nccl(ar, w) for _, _, w in (qkv, fc1)))
    old = layer_cost(replace(r, sequence_parallel=False, tp_async_backward=False), A100, hw)
    assert old.bwd["tp_comm"] == pytest.approx(2 * ar)
    # Across nodes the ring runs on the NIC.
    wide = layer_cost(run(tp=16, num_gpus=64, pp=1, heads=32), A100, hw)
    assert wide.fwd["tp_comm"] == pytest.approx(
        2 * (reduce_scatter_time(nbytes, 16, hw.inter) + all_gather_time(nbytes, 16, hw.inter)))


def test_fp8_tp_all_gathers_carry_one_byte() -> None:
    """Under FP8 with SP, TE gathers quantized GEMM inputs (1 B); reduce-scatters stay BF16."""
    r = run(gpu="h100-sxm", precision="fp8")
    h100 = get_gpu("h100-sxm")
    hw = link_profile(h100)
    act = 2048 * 4096
    ag, rs = all_gather_time(act, 4, hw.intra), reduce_scatter_time(2 * act, 4, hw.intra)
    c = layer_cost(r, h100, hw)
    assert c.fwd["tp_comm"] == pytest.approx(2 * (ag + rs))
    bf16 = layer_cost(replace(r, precision="bf16"), h100, hw)
    assert bf16.fwd["tp_comm"] == pytest.approx(
        2 * (all_gather_time(2 * act, 4, hw.intra) + rs))
    assert c.fwd["tp_comm"] < bf16.fwd["tp_comm"]


def test_cp_ring_by_hand() -> None:
    r = run(cp=2, tp=2, heads=32)
    hw = link_profile(A100)
    c = layer_cost(r, A100, hw)
    tok = 2048 / 2
    kv = tok * 2 * 4096 / 2 * 2  # K and V of this rank's chunk, TP-sharded, BF16
    ring = 1 * (hw.intra.alpha_s + kv / hw.intra.bandwidth_Bps)
    assert c.fwd["cp_comm"] == pytest.approx(max(0.0, ring - c.fwd["attention"]))
    assert c.bwd["cp_comm"] == pytest.approx(max(0.0, 2 * ring - c.bwd["attention"]))


def test_moe_all_to_all_by_hand() -> None:
    hw = link_profile(A100)
    # 8 ranks, 4 inside the node: 3 NVLink peers, 4 network peers, 1/8 of the bytes each.
    t = all_to_all_time(8e6, 8, 3, hw.intra, hw.inter)
    assert t == pytest.approx(max(3 * (hw.intra.alpha_s + 1e6 / hw.intra.bandwidth_Bps),
                                  4 * hw.inter.alpha_s + 4e6 / hw.inter.bandwidth_Bps))
    r = run(num_experts=16, moe_topk=2, ep=4, tp=2, pp=1, num_gpus=16, heads=32)
    c = layer_cost(r, A100, hw)
    sent = 2048 / 2 * 2 * 4096 * 2  # SP-sharded tokens x topk x h x BF16
    assert c.fwd["moe_all_to_all"] == pytest.approx(2 * all_to_all_time(sent, 4, 3, hw.intra,
                                                                        hw.inter))


def test_expert_tp_gather_by_hand() -> None:
    """etp > 1: the received tokens (every top-k copy) are all-gathered over the expert-TP
    group before the experts and reduce-scattered after; etp = 1 routes without them."""
    hw = link_profile(A100)
    r = run(num_experts=16, moe_topk=2, ep=4, tp=2, pp=1, num_gpus=16, heads=32)
    out = 2048 / 2 * 2 * 2 * 4096 * 2  # SP-sharded tokens x topk x etp x h x BF16
    expert = all_gather_time(out, 2, hw.intra) + reduce_scatter_time(out, 2, hw.intra)
    with_etp, without = layer_cost(r, A100, hw), layer_cost(replace(r, etp=1), A100, hw)
    assert with_etp.fwd["tp_comm"] - without.fwd["tp_comm"] == pytest.approx(expert)
    assert with_etp.bwd["tp_comm"] - without.bwd["tp_comm"] == pytest.approx(expert)
    assert without.fwd["tp_comm"] > 0  # the attention's TP collectives stay


def test_pipeline_p2p_bubble_recompute_by_hand() -> None:
    r = run(pp=4, vpp=2, num_gpus=64, tp=4, global_batch=256, overlap_p2p_comm=False)
    costs, end, crit = compute_phase(r)
    hw = link_profile(A100)
    # Stage neighbours are 16 ranks apart: across nodes; s b h / tp bytes per send, 2 chunks.
    one = hw.inter.alpha_s + 2048 * 4096 * 2 / 4 / hw.inter.bandwidth_Bps
    assert costs[0].fwd["pp_p2p"] == pytest.approx(2 * one) == costs[0].bwd["pp_p2p"]
    # Overlapped (interleaved): each chunk's send is exposed only beyond one chunk's compute,
    # here 16 / 4 / 2 = 2 layers; a slow network (1 Gb/s) makes it outlast them.
    slow = replace(r, overlap_p2p_comm=True, nic_gbit_per_gpu=1.0)
    hw1 = link_profile(A100, nic_gbit_per_gpu=1.0)
    one1 = hw1.inter.alpha_s + 2048 * 4096 * 2 / 4 / hw1.inter.bandwidth_Bps
    layer1 = layer_cost(slow, slowest_gpu(A100, slow.num_gpus), hw1)
    c1 = compute_phase(slow)[0][0]
    assert c1.fwd["pp_p2p"] == pytest.approx(2 * (one1 - 2 * layer1.fwd_s))
    assert c1.bwd["pp_p2p"] == pytest.approx(2 * max(0.0, one1 - 2 * layer1.bwd_s))
    assert c1.fwd["pp_p2p"] > 0
    assert compute_phase(replace(r, overlap_p2p_comm=True))[0][0].fwd["pp_p2p"] == 0.0
    # Without SP: megatron-core sends the whole s b h; 2021's scatter-gather sends 1 / tp and
    # all-gathers it over the TP group (NVLink) after receiving.
    whole = replace(r, sequence_parallel=False)
    full = 2048 * 4096 * 2
    assert compute_phase(whole)[0][0].fwd["pp_p2p"] == pytest.approx(
        2 * (hw.inter.alpha_s + full / hw.inter.bandwidth_Bps))
    sg = replace(whole, p2p_scatter_gather=True)
    assert compute_phase(sg)[0][0].fwd["pp_p2p"] == pytest.approx(
        2 * (one + all_gather_time(full, 4, hw.intra)))
    per_mb = [c.fwd_s + c.bwd_s for c in costs]
    m = r.num_micro_batches
    assert end == pytest.approx(m * max(per_mb) + (sum(per_mb) - max(per_mb)) / 2)
    est = predict_run(r)
    assert est.breakdown["pipeline_bubble"] == pytest.approx(end - m * max(per_mb))
    layer = layer_cost(r, A100, hw)
    full = layer_cost(replace(r, recompute="full"), A100, hw)
    sel = layer_cost(replace(r, recompute="selective", flash_attention=True), A100, hw)
    assert full.bwd["recompute"] == pytest.approx(layer.fwd_s)
    assert sel.bwd["recompute"] == pytest.approx(layer.fwd["attention"])


def test_sync_gather_optimizer_terms_by_hand() -> None:
    r = run(distributed_optimizer=True, overlap_param_gather=False)
    est = predict_run(r)
    w = sync_workload(r, link_profile(A100))
    # The gradient sync is what the LGS replay exposes beyond the end of compute; the replay
    # slows the backward beside each reduction by the 16 SMs NCCL's CTAs hold [NCCL689].
    assert est.breakdown["dp_grad_sync"] == pytest.approx(
        max(0.0, est.sync.step_time_s - est.sync.compute_end_s))
    assert link_profile(A100).overlap == pytest.approx(1 - 16 / 108)
    assert link_profile(get_gpu("h100-sxm")).overlap == pytest.approx(1 - 16 / 132)
    dense = max(stage_params(r))[0]
    g, m = w.layout.group_shape("dense")  # TP4: 2 DP ranks per node x 4 nodes
    assert (g, m) == (2, 4)
    hw = link_profile(A100)
    gather = all_gather_time(dense * 2, g, hw.intra) + all_gather_time(dense * 2 / g, m, hw.inter)
    # Grad norm 4, FusedAdam 28, master -> BF16 copy 6 bytes per parameter of the shard.
    opt = dense / 8 * 38 / (2039e9 * HBM_EFFICIENCY)
    assert est.breakdown["param_all_gather"] == pytest.approx(gather, rel=1e-6)
    assert est.breakdown["optimizer"] == pytest.approx(opt, rel=1e-6)
    assert sum(est.breakdown.values()) == pytest.approx(est.step_time_s)
    # Overlapped with the next forward (PP1: behind the first micro-batch's whole forward), the
    # gather exposes what outlasts it and takes 16 SMs from it while both run.
    one = replace(r, pp=1, num_gpus=32, overlap_param_gather=True)
    fwd = compute_phase(one)[0][0].fwd_s
    assert sync_workload(one, hw).layout.group_shape("dense") == (g, m)
    n1 = stage_params(one)[0][0] * 2
    gather1 = all_gather_time(n1, g, hw.intra) + all_gather_time(n1 / g, m, hw.inter)
    assert gather1 > fwd
    assert predict_run(one).breakdown["param_all_gather"] == pytest.approx(
        gather1 - fwd + fwd * 16 / 108, rel=1e-6)
    no_overlap = predict_run(replace(r, overlap_grad_reduce=False))
    assert no_overlap.breakdown["dp_grad_sync"] > est.breakdown["dp_grad_sync"]
    # BF16 gradients (grad_reduce_in_fp32 off) halve the bytes the replay reduces.
    bf16 = predict_run(replace(r, grad_reduce_in_fp32=False))
    assert sync_workload(bf16.run, hw).layout.grad_bytes == 2
    assert bf16.sync.comm_s < 0.6 * est.sync.comm_s


def test_memory_by_hand_and_params_match_workload() -> None:
    # Korthikanti et al.: 34 s b h / t + 5 a s^2 b / t per layer with SP, unfused attention.
    r = run(flash_attention=False)
    s, b, h, a, t = 2048, 1, 4096, 32, 4
    full, scores, inp = layer_activation_bytes(r)
    assert full == pytest.approx(s * b * h * 34 / t + 5 * a * s * s * b / t)
    assert scores == pytest.approx(5 * a * s * s * b / t) and inp == pytest.approx(2 * s * h / t)
    # FP8 keeps the four GEMM inputs (QKV, projection, FC1, FC2: h, h, h, 4h) at 1 B, not 2.
    fp8_full, _, _ = layer_activation_bytes(replace(r, precision="fp8"))
    assert full - fp8_full == pytest.approx(s * b * (h + h + h + 4 * h) / t)
    # Without dropout: no masks (h and h per token) and 2 B per score, the softmax output.
    no_drop, no_drop_scores, _ = layer_activation_bytes(replace(r, dropout=0.0))
    assert full - no_drop == pytest.approx(s * b * 2 * h / t + 3 * a * s * s * b / t)
    assert no_drop_scores == pytest.approx(2 * a * s * s * b / t)
    dense, expert = 1e9, 0.0
    assert states_bytes(r, dense, expert) == pytest.approx(1e9 * (2 + 4 + 12))
    bf16_grads = replace(r, grad_reduce_in_fp32=False)
    assert states_bytes(bf16_grads, dense, expert) == pytest.approx(1e9 * (2 + 2 + 12))
    assert states_bytes(replace(r, zero=1), dense, expert) == pytest.approx(1e9 * (6 + 12 / 8))
    # Apex's DistributedFusedAdam with BF16 state (NeMo 1's `dtype: bf16`): 4 B a parameter.
    assert states_bytes(replace(r, zero=1, optimizer_state_bytes=4), dense, expert) == (
        pytest.approx(1e9 * (6 + 4 / 8)))
    # FP8: FP8 parameters hold 2 B a weight (data and transpose); BF16 weights keep TE's cached
    # FP8 copy and transpose beside them, 2 B more.
    fp8 = replace(r, precision="fp8")
    assert states_bytes(fp8, dense, expert) == pytest.approx(1e9 * (2 + 4 + 12))
    assert states_bytes(replace(fp8, fp8_params=False), dense, expert) == \
        pytest.approx(1e9 * (2 + 2 + 4 + 12))
    assert states_bytes(replace(r, fp8_params=False), dense, expert) == \
        pytest.approx(1e9 * (2 + 4 + 12))  # read only under FP8
    moe = run(num_experts=16, ep=4, pp=2, swiglu=True, kv_heads=8)
    w = sync_workload(moe, link_profile(A100))
    for k, (d, e) in enumerate(stage_params(moe)):
        n = stage_numel(stage_backward(w.model, w.layout, k))
        assert (d, e) == (n["dense"], n["expert"])


def test_fused_attention_memory_by_hand() -> None:
    """Fused attention keeps Q, K, V, its BF16 output (the projection's input with BF16
    GEMMs; beside the projection's FP8 copy with FP8 ones) and FP32 softmax statistics."""
    r = run()
    s, h, a, t = 2048, 4096, 32, 4
    full, scores, _ = layer_activation_bytes(r)
    unfused = layer_activation_bytes(replace(r, flash_attention=False))[0]
    assert scores == 0 and unfused - full == pytest.approx(s * (5 * a * s - 4 * a) / t)
    fp8 = layer_activation_bytes(replace(r, precision="fp8"))[0]
    # QKV, FC1, FC2 inputs at 1 B; the projection's FP8 input (q) on top of the BF16 output.
    assert full - fp8 == pytest.approx(s * (h + h + 4 * h - h) / t)


def test_head_dim_by_hand() -> None:
    """A head wider than hidden / heads (Qwen3: 32 heads of 128 on a hidden of 2048) widens Q,
    the projection and the scores; K and V follow the KV heads. Left out, it is hidden / heads
    and changes nothing."""
    h, q, kv = 2048, 32 * 128, 4 * 128
    r = run(hidden=h, heads=32, kv_heads=4, head_dim=128, tp=2, pp=1, num_experts=16, ep=4,
            swiglu=True, moe_ffn_hidden=768, moe_topk=8)
    assert (r.q_dim, r.kv_dim) == (q, kv)
    gemm, scores = layer_flops_per_token(r)
    assert gemm == pytest.approx(6 * (2 * h * q + 2 * h * kv + 3 * h * 768 * 8))
    assert scores == pytest.approx(12 * 2048 * q)
    tok = 2048
    qkv, proj = (tp_gemm_parts(r, tok, (q + 2 * kv) / 2, h, A100, column=True),
                 tp_gemm_parts(r, tok, h, q / 2, A100, column=False))
    gemm_fwd = layer_cost(r, A100, link_profile(A100)).fwd["gemm"]
    assert gemm_fwd > qkv[0] + proj[0]  # and the experts' GEMMs
    # The parameters the step model counts are the gradients the LGS replay syncs.
    w = sync_workload(r, link_profile(A100))
    assert w.model.q_dim == q
    (d, e), = stage_params(r)
    n = stage_numel(stage_backward(w.model, w.layout, 0))
    assert (d, e) == (n["dense"], n["expert"])
    plain = run()
    assert predict_run(replace(plain, head_dim=4096 // 32)) == predict_run(plain)


def test_more_gpus_never_raise_per_gpu_throughput() -> None:
    """Weak scaling over DP (same micro-batches per GPU): only communication changes, so the
    per-GPU throughput never rises. ZeRO shards the optimizer's own work (and ZeRO 2/3 the
    gradient buffer's) over more GPUs, so there the step without those terms is compared."""
    for layout in ({"tp": 8, "pp": 4}, {"tp": 2, "pp": 1}, {"tp": 8, "pp": 2, "zero": 1},
                   {"tp": 1, "pp": 1, "zero": 3}, {"tp": 8, "pp": 4, "vpp": 2},
                   {"tp": 4, "pp": 2, "vpp": 4, "zero": 1},
                   # FP8 delayed scaling: its amax all-reduce spans the data-parallel ranks too
                   {"tp": 4, "pp": 2, "vpp": 2, "gpu": "h100-sxm", "precision": "fp8"}):
        prev, prev_tput = None, 0.0
        for dp in (1, 2, 4, 8, 16, 64):
            tp, pp = layout["tp"], layout["pp"]
            r = run(**layout, num_gpus=tp * pp * dp, global_batch=8 * dp, num_layers=32,
                    distributed_optimizer=layout.get("zero", 0) > 0)
            est = predict_run(r)
            own = est.breakdown["optimizer"] + est.breakdown["grad_buffer"]
            step = est.step_time_s - (own if r.zero else 0.0)
            if prev is not None:
                assert step >= prev * (1 - 1e-9), (layout, dp)
                if not r.zero:
                    assert est.tflops_per_gpu <= prev_tput * (1 + 1e-9), (layout, dp)
            prev, prev_tput = step, est.tflops_per_gpu


def test_recompute_never_faster() -> None:
    # The last: ZeRO-3 on 25 Gb/s a GPU, its backward's gathers and reduce-scatters longer
    # than its compute (each hidden behind all of it, full recompute had been 4% faster).
    zero3 = {"tp": 1, "pp": 1, "num_gpus": 64, "heads": 32, "zero": 3, "micro_batch": 2,
             "nic_gbit_per_gpu": 25}
    for kw in ({}, {"flash_attention": False}, {"pp": 1, "tp": 8}, {"num_experts": 8, "ep": 2},
               zero3):
        steps = [predict_run(run(**kw, recompute=m)).step_time_s
                 for m in ("none", "selective", "full")]
        assert steps[0] <= steps[1] <= steps[2], kw


def test_elementwise_and_unfused_attention_by_hand() -> None:
    r = run(pp=1, num_gpus=32)  # TP4 with SP, GeLU MLP 4h, fused attention
    hw = link_profile(A100)
    c = layer_cost(r, A100, hw)
    tok, h, t, f = 2048, 4096, 4, 4 * 4096
    hbm = 2039e9 * HBM_EFFICIENCY
    # 11 h-sized passes (norms, bias-dropout-adds) on the SP shard + GeLU read/write, BF16.
    assert c.fwd["elementwise"] == pytest.approx((11 * tok / t * h * 2 + 2 * tok * f / t * 2)
                                                 / hbm)
    assert c.bwd["elementwise"] == pytest.approx((13 * tok / t * h * 2 + 3 * tok * f / t * 2)
                                                 / hbm)
    # Unfused bias-GeLU: the bias added in a read and write of FC1's output of its own.
    apart = layer_cost(replace(r, bias_gelu_fusion=False), A100, hw)
    assert apart.fwd["elementwise"] - c.fwd["elementwise"] == pytest.approx(
        2 * tok * f / t * 2 / hbm)
    assert apart.bwd["elementwise"] == c.bwd["elementwise"]
    u = layer_cost(replace(r, flash_attention=False), A100, hw)
    heads, d, s = 32 / t, h / 32, 2048
    qk = gemm_time(s, s, d, A100, "bf16")
    av = gemm_time(s, d, s, A100, "bf16")
    assert u.fwd["attention"] == pytest.approx(heads * (qk + av))
    score = tok * heads * s * 2
    assert u.fwd["elementwise"] - c.fwd["elementwise"] == pytest.approx(4.5 * score / hbm)


def test_rope_by_hand() -> None:
    """RoPE reads and writes every query and key element, BF16: fused (TE's kernel) 2 passes
    each way; unfused (megatron-core's torch ops) 12 forward, 14 backward. GQA: 8 KV heads."""
    r = run(pp=1, num_gpus=32, kv_heads=8)  # TP4: 8 query heads and 2 KV heads a rank
    hw = link_profile(A100)
    base = layer_cost(r, A100, hw)
    qk = 2048 * (4096 + 8 * 128) / 4 * 2 / (2039e9 * HBM_EFFICIENCY)
    fused = layer_cost(replace(r, position_embedding="rope"), A100, hw)
    assert fused.fwd["elementwise"] - base.fwd["elementwise"] == pytest.approx(2 * qk)
    assert fused.bwd["elementwise"] - base.bwd["elementwise"] == pytest.approx(2 * qk)
    torch_ops = layer_cost(replace(r, position_embedding="rope", rope_fusion=False), A100, hw)
    assert torch_ops.fwd["elementwise"] - base.fwd["elementwise"] == pytest.approx(12 * qk)
    assert torch_ops.bwd["elementwise"] - base.bwd["elementwise"] == pytest.approx(14 * qk)
    assert layer_cost(replace(r, rope_fusion=False), A100, hw).fwd == base.fwd
    with pytest.raises(RunError, match="position_embedding"):
        run(position_embedding="alibi")


def test_fp8_casts_by_hand() -> None:
    """FP8 adds Transformer Engine's casts of the GEMM operands to the element-wise traffic:
    4 B per element (read BF16, write FP8 row- and column-wise), 6 B with current scaling; the
    norm-fed inputs (QKV, FC1) cost nothing with delayed scaling, 4 B with current."""
    h100 = get_gpu("h100-sxm")
    r = run(gpu="h100-sxm", pp=1, num_gpus=32, kv_heads=8)  # TP4 with SP, GeLU MLP 4h, GQA
    hw = link_profile(h100)
    tok, h, t, f, kv = 2048, 4096, 4, 4 * 4096, 1024
    hbm = 3350e9 * HBM_EFFICIENCY
    bf16 = layer_cost(r, h100, hw)
    ins = tok * h / t + tok * f / t  # projection and FC2 inputs
    norm_ins = 2 * tok / t * h  # QKV and FC1 inputs, SP shard
    grads = tok * (h + 2 * kv) / t + tok / t * h + tok * f / t + tok / t * h
    for recipe, q, fused in (("delayed", 4, 0), ("current", 6, 4)):
        fp8 = layer_cost(replace(r, precision="fp8", fp8_recipe=recipe), h100, hw)
        assert fp8.fwd["elementwise"] - bf16.fwd["elementwise"] == pytest.approx(
            (q * ins + fused * norm_ins) / hbm)
        assert fp8.bwd["elementwise"] - bf16.bwd["elementwise"] == pytest.approx(q * grads / hbm)
    with pytest.raises(RunError, match="fp8_recipe"):
        run(fp8_recipe="mxfp8")


def test_block_recompute_by_hand() -> None:
    """Megatron's block method: the first N layers of each model chunk run their forward
    again; their activations shrink to the layer input, the others keep everything."""
    from megatron_lgs.lgs.stepmemory import activation_bytes

    r = run(pp=2, vpp=2, recompute="full", global_batch=512)  # 8 layers a stage, chunks of 4
    block = replace(r, recompute_num_layers=1)
    gpu, hw = A100, link_profile(A100)
    layer = layer_cost(r, gpu, hw)
    full, part = stage_costs(r, gpu, hw)[0], stage_costs(block, gpu, hw)[0]
    assert (r.recomputed_layers(0), block.recomputed_layers(0)) == (8, 2)
    assert full.bwd["recompute"] == pytest.approx(8 * layer.bwd["recompute"])
    assert part.bwd["recompute"] == pytest.approx(2 * layer.bwd["recompute"])
    none = predict_run(replace(r, recompute="none")).step_time_s
    assert none < predict_run(block).step_time_s < predict_run(r).step_time_s
    kept, _, inp = layer_activation_bytes(r)
    inflight = 2 * (1 + 1 / 4)  # stage 0 of 2, interleaved with 2 chunks
    assert activation_bytes(block, 0) == pytest.approx((6 * kept + 2 * inp) * inflight + kept)
    assert activation_bytes(r, 0) == pytest.approx(8 * inp * inflight + kept)
    with pytest.raises(RunError, match="recompute_num_layers"):
        run(recompute_num_layers=2)


def test_ddp_bucket_size_gives_a_bucket_per_tensor() -> None:
    """Megatron-LM's --ddp-bucket-size below a tensor's size closes a bucket at every weight
    tensor (the MLPerf Llama 3.1 configs' 64-200 parameters): one gradient collective each,
    in one message whatever its size; the default, max(40M, 1M x DP) parameters, groups them.
    The first bucket the forward gathers is then the embedding alone."""
    r = run(pp=1, num_layers=4, ddp_bucket_size=64)
    w = sync_workload(r, link_profile(A100))
    tensors = sum(len(op.grads) for op in stage_backward(w.model, w.layout, 0))
    buckets = predict_run(r).sync.stages[0].buckets
    assert len(buckets) == tensors == 6 * 4 + 3  # 6 a layer, the embedding, final norm, output
    assert all(b.inter_messages == 1 and len(b.tensors) == 1 for b in buckets)
    default = predict_run(run(pp=1, num_layers=4)).sync.stages[0].buckets
    assert len(default) < tensors
    assert stepmodel._first_buckets(r, w, 0) == {"dense": 32000 * 4096 / 4, "expert": 0.0}
    with pytest.raises(RunError, match="ddp_bucket_size"):
        run(ddp_bucket_size=0)
    with pytest.raises(RunError, match="ddp_bucket_size.*takes overlap_grad_reduce"):
        run(ddp_bucket_size=64, overlap_grad_reduce=False)


def test_apex_buckets_by_hand() -> None:
    """NeMo 1's Apex DistributedFusedAdam (`dfa_bucket_cap_mb` N): buckets of N MiB of
    gradients with tensors cut across them. Under megatron-core's 1F1B schedule its
    grad_sync_func has the first stage reduce them as they fill in the last backward and the
    others all at once after it, where megatron-core's own DDP reduces a later stage as one
    bucket."""
    r = run(pp=2, dfa_bucket_cap_mb=25, grad_reduce_in_fp32=False)
    first, later = predict_run(r).sync.stages
    cap = 25 * 2**20
    w = sync_workload(r, link_profile(A100))
    for stage, s in enumerate((first, later)):
        numel = sum(stage_numel(stage_backward(w.model, w.layout, stage)).values())
        assert sum(b.nbytes for b in s.buckets) == numel * 2  # every BF16 gradient, once
        assert len(s.buckets) >= numel * 2 // (2 * cap) > 1
        assert max(b.nbytes for b in s.buckets) < 2 * cap
    assert len({b.ready_s for b in first.buckets}) > 1  # as they fill
    assert {b.ready_s for b in later.buckets} == {later.backward_end_s}  # all after
    megatron = predict_run(replace(r, dfa_bucket_cap_mb=0)).sync.stages[1]
    assert len(megatron.buckets) == 1
    with pytest.raises(RunError, match="dfa_bucket_cap_mb"):
        run(dfa_bucket_cap_mb=25, ddp_bucket_size=1000)


def test_apex_interleaved_reduction_waits_for_the_pipeline_rank() -> None:
    """Under the interleaved schedule megatron-core 0.16 calls Apex's grad_sync_func for a
    chunk pp-rank virtual micro-batches after that chunk's last backward, so that every stage
    launches it at once: on stage k, chunk 1's buckets wait for k backwards of chunk 0 (the
    chunk the cooldown runs next), and chunk 0's, the stage's last backward, for none."""
    r = run(pp=2, vpp=2, dfa_bucket_cap_mb=25, grad_reduce_in_fp32=False)
    w = sync_workload(r, link_profile(A100))
    th = stepmodel.ddp_thresholds(r, w)
    bwd_end, tb = 10.0, 4.0
    for k in (0, 1):
        flops = [sum(op.flops for op in ops) for ops in chunk_ops(w.model, w.layout, k, 2)]
        chunk0 = tb * flops[1] / sum(flops)  # the list runs chunk 1 first
        windows = timeline._chunk_windows(w, th, k, bwd_end, tb, 2, False, apex=True)
        (_, start1, _, late1), (_, start0, _, late0) = windows
        assert start0 == pytest.approx(bwd_end - chunk0) and late0 == 0.0
        # Chunk 1's last backward ends pp = 2 backwards of chunk 0 before the stage's end.
        assert start1 == pytest.approx(bwd_end - 2 * chunk0 - (tb - chunk0))
        assert late1 == pytest.approx(k * chunk0)
