"""bench/layer_kernels.py: its kernels are the whole-step model's (same shapes, same times), and
each kind can be timed here; on a GPU, tests/gpu/test_gpu_stepmodel.py runs it for real."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))

from dgxc_rows import dgxc_rows  # noqa: E402
from layer_kernels import (  # noqa: E402
    _fp8_gemm,
    check_row,
    device_profile,
    hopper_rows,
    kernels_against_published,
    layer_kernels,
    measure,
    summarize,
)
from mlperf_rows import mlperf_llama_rows, mlperf_rows  # noqa: E402
from published_rows import megatron_llama_rows  # noqa: E402
from published_runs import predicted, published_rows  # noqa: E402

from megatron_lgs.lgs.gpus import get_gpu, link_profile  # noqa: E402
from megatron_lgs.lgs.layercost import layer_cost  # noqa: E402
from megatron_lgs.lgs.runspec import run_from_dict  # noqa: E402

TINY = {"id": "t", "gpu": "h200", "num_gpus": 8, "num_layers": 4, "hidden": 256, "heads": 4,
        "vocab": 1000, "seq_length": 256, "tp": 2, "pp": 1, "micro_batch": 2,
        "global_batch": 8, "swiglu": True, "ffn_hidden": 512}


@pytest.mark.parametrize("extra", [{}, {"cp": 2, "num_gpus": 16}, {"precision": "fp8"}])
def test_kernels_are_the_models(extra) -> None:
    r = run_from_dict({**TINY, **extra})
    gpu = get_gpu("h200")
    cost = layer_cost(r, gpu, link_profile(gpu))
    kernels = layer_kernels(r, "h200")
    gemm = sum(k.predicted_s for k in kernels if k.kind == "gemm")
    assert gemm == pytest.approx(cost.fwd["gemm"] + cost.bwd["gemm"])
    assert {k.precision for k in kernels if k.kind == "gemm"} == {r.precision}
    attn = {"attention_fwd": 0.0, "attention_bwd": 0.0}
    for k in kernels:
        if k.kind in attn:
            attn[k.kind] += k.predicted_s
    assert attn == pytest.approx({"attention_fwd": cost.fwd["attention"],
                                  "attention_bwd": cost.bwd["attention"]})
    # Under CP, the rank's causal block of s / cp tokens and cp - 1 ring blocks against s / 2cp.
    blocks = {k.name: (k.shape, k.causal, k.count) for k in kernels if k.kind == "attention_fwd"}
    if r.cp == 1:
        assert blocks == {"attention fwd": ((2, 2, 256, 256, 64), True, 1)}
    else:
        assert blocks == {"attention fwd": ((2, 2, 128, 128, 64), True, 1),
                          "attention ring fwd": ((2, 2, 128, 64, 64), False, 1)}
    # QKV with SwiGLU at TP2: (tokens / cp, (h + 2 kv) / tp, h); FC1 carries both SwiGLU
    # matrices.
    shapes, tok = {k.name: k.shape for k in kernels}, 512 // r.cp
    assert shapes["qkv fwd"] == (tok, 384, 256) and shapes["fc1 fwd"] == (tok, 512, 256)
    assert shapes["fc2 wgrad"] == (256, 256, tok)


@pytest.mark.parametrize("extra", [{"cp": 2, "num_gpus": 16}, {"precision": "fp8"}])
def test_every_kind_times_here(extra) -> None:
    cpu = torch.device("cpu")
    assert device_profile(cpu) is None
    for k in layer_kernels(run_from_dict({**TINY, **extra}), "h200"):
        assert measure(k, cpu, 0.01)[0] > 0 or k.kind == "attention_bwd", k.name


def test_fp8_gemm_operands_are_te_hybrids() -> None:
    """E4M3 forward, E5M2 for the output gradient in both backward GEMMs, B column-major."""
    cpu = torch.device("cpu")
    kernels = {k.name: k for k in layer_kernels(run_from_dict({**TINY, "precision": "fp8"}),
                                                "h200")}
    out = _fp8_gemm(kernels["qkv dgrad"], cpu)()
    assert out.dtype == torch.bfloat16 and out.shape == kernels["qkv dgrad"].shape[:2]


def test_hopper_rows_and_unknown_rows() -> None:
    rows = hopper_rows()
    assert "megatron-h100-1.7B" in rows and "bridge-llama3-70b-fp8" in rows
    assert not any(r.startswith("narayanan") for r in rows)
    with pytest.raises(SystemExit, match="no published row"):
        check_row("no-such-row", "h100-sxm", 0.01, torch.device("cpu"))


def test_measured_kernels_scale_the_models_step() -> None:
    """Kernels twice as slow as predicted lengthen the step by exactly their share of it."""
    row = "megatron-h100-1.7B"
    published = {r["run"]["id"]: r for r in published_rows()}[row]
    pred, est, _ = predicted(published)
    same = {"row": row, "measured_over_predicted": {"gemm": 1.0, "attention": 1.0, "memory": 1.0},
            "layer_measured_over_predicted": 1.0}
    gap = kernels_against_published(same, published)
    assert gap["measured_kernels"] == pytest.approx(1.0)
    assert gap["published"] == pytest.approx(pred / published["published"])
    slow_gemm = {**same,
                 "measured_over_predicted": {**same["measured_over_predicted"], "gemm": 2.0}}
    share = est.breakdown["gemm"] / est.step_time_s
    slower = kernels_against_published(slow_gemm, published)["measured_kernels"]
    assert slower == pytest.approx(1 + share)


def test_the_recorded_h200_measurement_summarizes() -> None:
    """The file the README's kernel figures come from holds every Hopper row the table had on
    2026-12-04, each measured, in the table's order; the rows added since (Megatron-Bridge's
    Llama 3 8B, Megatron-LM's MoE recipes of 2026, the ModelZoo's long-context runs and its
    Mixtral 8x22B, MLPerf's GPT-3 and Llama 3.1 runs, NVIDIA's DGX Cloud recipes, Megatron-LM's
    Llama README of 2025, NeMo 24.07's Nemotron rows) await a GPU run."""
    path = Path(__file__).resolve().parents[3] / "bench/measured/h200-2026-12-04/layer_kernels.json"
    measured = [g["row"] for g in summarize(path)]
    later = ["bridge-llama3-8b-fp8", "recipe-qwen3-30b-a3b-bf16", "recipe-qwen3-235b-a22b-bf16",
             *(f"modelzoo-qwen3-235b-{k}k" for k in (16, 32, 64, 128)), "modelzoo-mixtral-8x22b",
             *(f"nemo-nemotron-{m}" for m in ("8b-64", "22b-64", "340b-128")),
             *(row["run"]["id"] for row in mlperf_rows() + mlperf_llama_rows() + dgxc_rows()
               + megatron_llama_rows())]
    assert sorted(measured + later) == sorted(hopper_rows())
    assert measured == [row for row in hopper_rows() if row not in later]
