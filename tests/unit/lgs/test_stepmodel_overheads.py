"""Whole-step model: host launch overhead, the cross-entropy passes, query/key norms, TE's
comm-GEMM overlap chunks and FP8's amax all-reduce, each against a hand calculation."""

from __future__ import annotations

from dataclasses import replace

import pytest

from megatron_lgs.lgs.gpus import HBM_EFFICIENCY, HOST_S_PER_KERNEL, get_gpu, link_profile
from megatron_lgs.lgs.kernels import gemm_time, small_allreduce_time
from megatron_lgs.lgs.layercost import current_scaling_amax, layer_cost, logits_cost
from megatron_lgs.lgs.runspec import run_from_dict
from megatron_lgs.lgs.stepmodel import compute_phase, predict_run
from megatron_lgs.lgs.tpcomm import UB_PIPELINE_SPLITS, tp_gemm

H100 = get_gpu("h100-sxm")
BASE = {"id": "t", "gpu": "h100-sxm", "num_gpus": 8, "num_layers": 4, "hidden": 256,
        "heads": 4, "vocab": 1024, "seq_length": 128, "tp": 1, "pp": 1, "micro_batch": 1,
        "global_batch": 8}


def run(**kw):
    return run_from_dict({**BASE, **kw})


def test_host_overhead_by_hand() -> None:
    hw = link_profile(H100)
    # A tiny layer: its kernels run for less than the host needs to issue them.
    c = layer_cost(run(), H100, hw)
    gpu_f = sum(v for k, v in c.fwd.items() if k != "host_overhead")
    gpu_b = sum(v for k, v in c.bwd.items() if k != "host_overhead")
    assert 10 * HOST_S_PER_KERNEL > gpu_f  # the case is host-bound, else the test is moot
    assert c.fwd["host_overhead"] == pytest.approx(10 * HOST_S_PER_KERNEL - gpu_f)
    assert c.bwd["host_overhead"] == pytest.approx(16 * HOST_S_PER_KERNEL - gpu_b)
    assert c.fwd_s == pytest.approx(10 * HOST_S_PER_KERNEL)
    # With TP the layer's collectives are kernels too: 2 all-reduces each way without SP,
    # 4 forward and 6 backward with it.
    t = layer_cost(run(tp=2, sequence_parallel=False), H100, hw)
    assert t.fwd_s == pytest.approx(max(12 * HOST_S_PER_KERNEL,
                                        t.fwd_s - t.fwd["host_overhead"]))
    sp = layer_cost(run(tp=2, sequence_parallel=True), H100, hw)
    assert sp.bwd_s == pytest.approx(max(22 * HOST_S_PER_KERNEL,
                                         sp.bwd_s - sp.bwd["host_overhead"]))
    # Rotary embeddings add their kernels: 2 each way fused, 24 forward and 14 backward not.
    for fused, (f, b) in ((True, (12, 18)), (False, (34, 30))):
        rope = layer_cost(run(position_embedding="rope", rope_fusion=fused), H100, hw)
        assert (rope.fwd_s, rope.bwd_s) == pytest.approx((f * HOST_S_PER_KERNEL,
                                                          b * HOST_S_PER_KERNEL))
    # A large layer hides the host entirely.
    big = layer_cost(run(hidden=8192, heads=64, seq_length=4096), H100, hw)
    assert big.fwd["host_overhead"] == big.bwd["host_overhead"] == 0.0
    # Full recompute re-issues the forward's kernels: never faster.
    r = run()
    assert predict_run(replace(r, recompute="full")).step_time_s > predict_run(r).step_time_s


def test_cross_entropy_passes_by_hand() -> None:
    r = run(tp=2, sequence_parallel=True)
    c = logits_cost(r, H100)
    fp32_logits = 128 * 1024 / 2 * 4
    hbm = 3350e9 * HBM_EFFICIENCY
    # Forward: cast (1.5), max (1), subtract (2), exp (2), sum (1), divide (2); backward:
    # multiply (2), cast back (1.5), in units of the FP32 logits shard.
    assert c.fwd["elementwise"] == pytest.approx(9.5 * fp32_logits / hbm)
    assert c.bwd["elementwise"] == pytest.approx(3.5 * fp32_logits / hbm)


def test_fp8_logits_run_in_bf16_by_hand() -> None:
    """megatron-core's output layer is not a Transformer Engine module: FP8 leaves it BF16."""
    r = run(hidden=4096, heads=32, vocab=128256, seq_length=4096, precision="fp8")
    m, n, k = 4096, 128256, 4096
    c = logits_cost(r, H100)
    g = lambda a, b, c: gemm_time(a, b, c, H100, "bf16")  # noqa: E731
    bf16 = g(m, n, k) + g(m, k, n) + g(k, n, m)
    assert c.fwd["gemm"] + c.bwd["gemm"] == pytest.approx(bf16)
    assert c.fwd["gemm"] > gemm_time(m, n, k, H100, "fp8") * 1.5


def test_te_comm_gemm_overlap_chunks_by_hand() -> None:
    r = run(hidden=4096, heads=32, seq_length=4096, tp=8, num_gpus=8, tp_comm_overlap=True)
    m, n, k = 4096, 3 * 4096 / 8, 4096
    g = lambda a, b, c: gemm_time(a, b, c, H100, "bf16")  # noqa: E731
    # Column-parallel: ring-exchange forward in tp chunks, bulk-overlapped backward unsplit.
    f, b = tp_gemm(r, m, n, k, H100, column=True)
    assert f == pytest.approx(8 * g(m / 8, n, k))
    assert b == pytest.approx(g(m, k, n) + g(k, n, m))
    # Row-parallel: pipelined forward in 4 splits, ring-exchange data gradient in tp chunks.
    f, b = tp_gemm(r, m, k, n, H100, column=False)
    assert UB_PIPELINE_SPLITS == 4
    assert f == pytest.approx(4 * g(m / 4, k, n))
    assert b == pytest.approx(8 * g(m / 8, n, k) + g(n, k, m))
    # Without the overlap nothing is split.
    f, b = tp_gemm(replace(r, tp_comm_overlap=False), m, n, k, H100, column=True)
    assert (f, b) == pytest.approx((g(m, n, k), g(m, k, n) + g(k, n, m)))


def test_query_key_norms_by_hand() -> None:
    """Qwen3's norms on each query and key head: 2 BF16 passes over this rank's Q and K forward,
    3 backward, and each norm's input kept for the backward."""
    from megatron_lgs.lgs.stepmemory import layer_activation_bytes

    hw = link_profile(H100)
    r = run(heads=8, kv_heads=2, head_dim=64, tp=2, sequence_parallel=True)
    plain, normed = layer_cost(r, H100, hw), layer_cost(replace(r, qk_layernorm=True), H100, hw)
    qk = 128 * (8 * 64 + 2 * 64) / 2 * 2  # tokens x this rank's Q and K widths x BF16
    hbm = H100.hbm_gbps * 1e9 * HBM_EFFICIENCY
    assert normed.fwd["elementwise"] - plain.fwd["elementwise"] == pytest.approx(2 * qk / hbm)
    assert normed.bwd["elementwise"] - plain.bwd["elementwise"] == pytest.approx(3 * qk / hbm)
    kept = layer_activation_bytes(replace(r, qk_layernorm=True))[0] - layer_activation_bytes(r)[0]
    assert kept == pytest.approx(qk)


def test_small_allreduce_latency_is_nccls_own_model_by_hand() -> None:
    """NCCL's LL latencies (tuning.cc): ring 6.6 us + 0.6 a step on one node; between nodes the
    tree, 6.8 + 2 x ((ranks a node - 1) x 0.6 + log2(nodes) x 5.0), beats the ring's 2 (r - 1)
    steps, 2 x nodes of them at 2.7 us and the rest at the 1.0 us network post overhead."""
    assert small_allreduce_time(1, 8) == 0.0
    assert small_allreduce_time(8, 8) == pytest.approx((6.6 + 14 * 0.6) * 1e-6)
    assert small_allreduce_time(2, 8) == pytest.approx((6.6 + 2 * 0.6) * 1e-6)
    tree = 6.8 + 2 * (7 * 0.6 + 4 * 5.0)
    ring = 6.6 + (254 - 32) * 1.0 + 32 * 2.7
    assert tree < ring
    assert small_allreduce_time(128, 8) == pytest.approx(tree * 1e-6)
    # Two ranks a node over 16 nodes: the same depth, fewer NVLink hops.
    assert small_allreduce_time(32, 2) == pytest.approx((6.8 + 2 * (0.6 + 4 * 5.0)) * 1e-6)


def test_fp8_amax_reduction_by_hand() -> None:
    """Delayed scaling reduces a chunk's amaxes once at the end of its forward and once in its
    backward, per micro-batch, over TP x DP x CP (num_gpus / pp ranks) or TP x CP only."""
    r = run(num_gpus=128, tp=4, pp=2, cp=2, vpp=2, num_layers=8, global_batch=64,
            precision="fp8", fp8_recipe="delayed", distributed_optimizer=True)
    costs, _, _ = compute_phase(r)
    full = small_allreduce_time(64, 8)  # TP4 x CP2 x DP8 over 8 nodes
    for c in costs:
        assert c.fwd["fp8_amax_reduction"] == c.bwd["fp8_amax_reduction"] == \
            pytest.approx(2 * full)  # two model chunks a stage
    tp_only = replace(r, tp_only_amax_red=True)
    costs, _, _ = compute_phase(tp_only)
    assert costs[0].fwd["fp8_amax_reduction"] == pytest.approx(2 * small_allreduce_time(8, 8))
    # On the compute path: the step pays it on every micro-batch of the critical stage.
    m = r.num_micro_batches
    step, narrow = predict_run(r), predict_run(tp_only)
    assert step.breakdown["fp8_amax_reduction"] == pytest.approx(m * 4 * full)
    assert step.step_time_s > narrow.step_time_s
    # Only delayed scaling keeps an amax history to reduce once a chunk (current scaling
    # reduces per layer instead); TE before 1.6 could hide it.
    current = replace(r, fp8_recipe="current")
    per_layer = current_scaling_amax(current)
    assert predict_run(current).breakdown["fp8_amax_reduction"] == \
        pytest.approx(m * 2 * max(current.stage_layers) * per_layer)
    for other in (replace(r, precision="bf16"), replace(r, async_amax_reduction=True)):
        assert predict_run(other).breakdown["fp8_amax_reduction"] == 0.0


def test_current_scaling_amax_reductions_by_hand() -> None:
    """Current scaling with SP all-reduces, over TP, the amax of QKV's and FC1's inputs forward
    and of the projection's and FC2's output gradients backward; an MoE layer only the
    attention's. Per layer, so a stage pays them per layer and micro-batch."""
    hw = link_profile(H100)
    r = run(tp=4, num_gpus=8, precision="fp8", fp8_recipe="current", sequence_parallel=True)
    one = (6.6 + 6 * 0.6) * 1e-6  # ring LL over 4 NVLink ranks
    c = layer_cost(r, H100, hw)
    assert c.fwd["fp8_amax_reduction"] == c.bwd["fp8_amax_reduction"] == pytest.approx(2 * one)
    moe = replace(r, num_experts=8, ep=2, etp=1)
    assert current_scaling_amax(moe) == pytest.approx(one)
    for none in (replace(r, sequence_parallel=False), replace(r, fp8_recipe="delayed"),
                 replace(r, precision="bf16")):
        assert layer_cost(none, H100, hw).fwd["fp8_amax_reduction"] == 0.0
    costs, _, _ = compute_phase(r)
    assert costs[0].fwd["fp8_amax_reduction"] == pytest.approx(r.num_layers * 2 * one)
