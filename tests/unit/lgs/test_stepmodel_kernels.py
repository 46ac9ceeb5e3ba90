"""Whole-step model, kernel level: GEMMs, fused attention, the slowest of N GPUs and the FLOP
count, each against a hand calculation or published measurements."""

from __future__ import annotations

import pytest

# The reference run of the step model's other tests (this file was split from that one;
# pytest puts tests/unit/lgs on the path).
from test_stepmodel import A100, run

from megatron_lgs.lgs.flops import flops_with_full_recompute, model_flops_per_step
from megatron_lgs.lgs.gpus import (
    CLOCK_SPREAD,
    GEMM_HALF_DIM,
    HBM_EFFICIENCY,
    get_gpu,
    link_profile,
    slowest_gpu,
)
from megatron_lgs.lgs.kernels import flash_attention_time, gemm_efficiency, gemm_time
from megatron_lgs.lgs.layercost import flash_attention, layer_cost
from megatron_lgs.lgs.stepmodel import compute_phase


def test_gemm_roofline_by_hand() -> None:
    m = n = k = 8192
    eff = 0.824 * (8192 / (8192 + GEMM_HALF_DIM)) ** 3
    assert gemm_efficiency(m, n, k, A100) == pytest.approx(eff)
    assert gemm_time(m, n, k, A100, "bf16") == pytest.approx(2 * m * n * k / (312e12 * eff))
    # A skinny GEMM is memory-bound: operands and output through HBM at 85% of 2,039 GB/s.
    t = gemm_time(8, 8192, 8192, A100, "bf16")
    assert t == pytest.approx(2 * (8 * 8192 + 8192 * 8192 + 8 * 8192) / (2039e9 * HBM_EFFICIENCY))


def test_fp8_gemm_runs_at_its_own_sustained_ceiling() -> None:
    """FP8 has its own measured ceiling (65.1% of 1,979 on Hopper, `gpus` [MSMF]), not BF16's."""
    h100 = get_gpu("h100-sxm")
    m = n = k = 8192
    shape = (8192 / (8192 + GEMM_HALF_DIM)) ** 3
    assert gemm_efficiency(m, n, k, h100, "fp8") == pytest.approx(0.651 * shape)
    fp8, bf16 = gemm_time(m, n, k, h100, "fp8"), gemm_time(m, n, k, h100, "bf16")
    assert fp8 == pytest.approx(2 * m * n * k / (1979e12 * 0.651 * shape))
    assert bf16 / fp8 == pytest.approx(1979 * 0.651 / (989 * 0.716))


def test_slowest_gpu_by_hand() -> None:
    """A job of 8 GPUs computes at the expected slowest of 8 normal draws: Blom's
    z = inv_cdf(7.625 / 8.25) = 1.4338 spreads below the mean; memory-bound work keeps its rate."""
    h100 = get_gpu("h100-sxm")
    keep = 1 - CLOCK_SPREAD * 1.43381
    eight = slowest_gpu(h100, 8)
    assert eight.gemm_max_efficiency == pytest.approx(0.716 * keep, rel=1e-5)
    assert eight.fp8_max_efficiency == pytest.approx(0.651 * keep, rel=1e-5)
    assert eight.attention_efficiency == pytest.approx(0.50 * keep, rel=1e-5)
    assert eight.hbm_gbps == h100.hbm_gbps and eight.peak_tflops == h100.peak_tflops
    assert slowest_gpu(h100, 1) is h100
    assert slowest_gpu(A100, 2).fp8_max_efficiency is None
    ceilings = [slowest_gpu(h100, n).gemm_max_efficiency for n in (2, 8, 64, 1024, 16384)]
    assert ceilings == sorted(ceilings, reverse=True)
    # The whole-step model takes it: a stage's attention is its layers' on the slowest GPU.
    r = run(num_gpus=8, tp=8, pp=1, global_batch=8)
    hw = link_profile(A100, 8)
    stage = compute_phase(r)[0][0]
    slow = layer_cost(r, slowest_gpu(A100, 8), hw).fwd["attention"] * r.num_layers
    assert stage.fwd["attention"] == pytest.approx(slow)
    assert slow > layer_cost(r, A100, hw).fwd["attention"] * r.num_layers


def test_gemm_curve_against_published_h100_measurements() -> None:
    """Cross-check of the H100 curve (not a fit): OpenXLA's default H100 (sm_90) BF16 matmul
    table (xla/service/gpu/model/matmul_interpolator_data.h, 2025) measured these single-GPU
    TFLOP/s in short runs, i.e. bursts; scaled to the sustained rate by the same chip's
    MSMF / MAMF (708.5 / 841.9, `gpus` [MSMF]), the model's compute rate stays within 12% of them
    at the dimensions that dominate the published runs (>= 2048). The farthest is 2048^3
    (+11.6%): below 4096 cuBLAS falls off faster than the d / (d + 128) curve."""
    h100 = get_gpu("h100-sxm")
    burst = {(4096, 4096, 4096): 783.3, (2048, 2048, 2048): 632.0,
             (2048, 4096, 2048): 715.4}
    for (m, n, k), tflops in burst.items():
        model = 989.0 * gemm_efficiency(m, n, k, h100)
        sustained = tflops * 708.5 / 841.9
        assert abs(model / sustained - 1) < 0.12, (m, n, k, model, sustained)


def test_flash_attention_by_hand() -> None:
    """The profile's rate times the tile factor of both sequence dimensions; the backward
    2.5x the forward."""
    f, b = flash_attention_time(1e12, A100, 2048, 1024)
    tiles = 2048 / (2048 + GEMM_HALF_DIM) * 1024 / (1024 + GEMM_HALF_DIM)
    assert f == pytest.approx(1e12 / (312e12 * 0.60 * tiles)) and b == pytest.approx(2.5 * f)
    # One layer without CP: one causal s x s block per sequence, 4 s^2 h / tp FLOPs halved.
    r = run(tp=2)
    assert flash_attention(r, A100) == pytest.approx(
        flash_attention_time(4 * 2048 * 2048 * 4096 / 2 * 0.5, A100, 2048, 2048))
    # CP4: the rank's causal block (1/4 of its FLOPs) at 512 x 512, three ring blocks
    # at 512 x 256.
    r = run(tp=2, cp=4, num_gpus=64)
    flops = 4 * 512 * 2048 * 4096 / 2 * 0.5
    diag, ring = (flash_attention_time(flops / 4, A100, 512, 512),
                  flash_attention_time(flops * 3 / 4, A100, 512, 256))
    assert flash_attention(r, A100) == pytest.approx((diag[0] + ring[0], diag[1] + ring[1]))


def test_attention_tile_factor_against_published_h100_measurements() -> None:
    """Cross-check of the sequence-length curve (not a fit): pytorch/benchmark commit ff65cb6
    (2024-07, "Fix dimension order for FlashAttention-3") measured FlashAttention-3 forward on
    H100, head dim 128, B x S = 16k tokens, at these TFLOP/s. Relative to 16k tokens, the
    model's tile factor stays within 7% of them from 512 up, within 2% from 2048 up."""
    measured = {512: 430.32, 1024: 517.099, 2048: 565.544, 4096: 590.233, 8192: 614.234,
                16384: 620.73}
    h100 = get_gpu("h100-sxm")
    rate = {s: 1.0 / flash_attention_time(1.0, h100, s, s)[0] for s in measured}
    for s, tflops in measured.items():
        model, published = rate[s] / rate[16384], tflops / measured[16384]
        assert abs(model / published - 1) < (0.02 if s >= 2048 else 0.07), (s, model, published)


def test_vocabulary_padded_per_tensor_parallel_size_by_hand() -> None:
    """With Megatron-LM's divisor the model pads the vocabulary to divisor x TP, as the trainer
    builds its embedding, and counts the padded rows in the logits' FLOPs (as Megatron-LM's
    MFU does); without it the vocabulary is taken as given."""
    h, tokens = 4096, 256 * 2048
    given = run(num_gpus=8, tp=4, pp=1, vocab=32000)
    padded = run(num_gpus=8, tp=4, pp=1, vocab=32000, make_vocab_size_divisible_by=128)
    assert given.padded_vocab == 32000
    assert padded.padded_vocab == 32256  # 128 x 4 = 512; 32000 / 512 = 62.5 -> 63 x 512
    assert run(num_gpus=8, tp=1, pp=1, vocab=32000,
               make_vocab_size_divisible_by=128).padded_vocab == 32000
    assert model_flops_per_step(padded) - model_flops_per_step(given) == pytest.approx(
        tokens * 6 * h * 256)


def test_context_parallel_attention_is_never_faster_per_token() -> None:
    """The same tokens per GPU as CP2 at micro-batch 2 and CP1 at micro-batch 1: the same
    FLOPs, but CP's ring blocks are smaller, so its attention is slower (the planner used
    to tie them)."""
    cp1, cp2 = run(tp=2, micro_batch=1), run(tp=2, cp=2, micro_batch=2, num_gpus=64)
    assert flash_attention(cp2, A100)[0] > flash_attention(cp1, A100)[0]


def test_megatron_flops_by_hand() -> None:
    r = run(num_gpus=8, tp=1, pp=1)
    h, s, layers, v, tokens = 4096, 2048, 16, 32000, 256 * 2048
    per_token = 6 * (12 * h * h) + 12 * s * h  # 4 h^2 attention + 8 h^2 MLP weights, scores
    assert model_flops_per_step(r) == pytest.approx(tokens * (layers * per_token + 6 * h * v))
    # Narayanan et al.'s formula with full recompute: 96 B s l h^2 (1 + s/6h + V/16lh).
    paper = 96 * 256 * s * layers * h * h * (1 + s / (6 * h) + v / (16 * layers * h))
    assert flops_with_full_recompute(r) == pytest.approx(paper)
    # SwiGLU: 3 MLP matrices; GQA: K and V shrink with the groups; MoE: topk experts.
    g = run(num_gpus=8, tp=1, pp=1, swiglu=True, ffn_hidden=8192, kv_heads=8)
    per_token = 6 * (2 * h * h + 2 * h * 1024 + 3 * h * 8192) + 12 * s * h
    assert model_flops_per_step(g) == pytest.approx(tokens * (layers * per_token + 6 * h * v))
    moe = run(num_gpus=8, tp=1, pp=1, num_experts=8, moe_topk=2)
    assert model_flops_per_step(moe) - model_flops_per_step(r) == pytest.approx(
        tokens * layers * 6 * 8 * h * h)
