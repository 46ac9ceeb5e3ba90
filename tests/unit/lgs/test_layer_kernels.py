"""bench/layer_kernels.py: its kernels are the whole-step model's (same shapes, same times), and
each kind can be timed here; on a GPU, tests/gpu/test_gpu_stepmodel.py runs it for real."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))

from layer_kernels import check_row, device_profile, layer_kernels, measure  # noqa: E402

from megatron_lgs.lgs.gpus import get_gpu, link_profile  # noqa: E402
from megatron_lgs.lgs.runspec import run_from_dict  # noqa: E402
from megatron_lgs.lgs.stepmodel import layer_cost  # noqa: E402

TINY = {"id": "t", "gpu": "h200", "num_gpus": 8, "num_layers": 4, "hidden": 256, "heads": 4,
        "vocab": 1000, "seq_length": 256, "tp": 2, "pp": 1, "micro_batch": 2,
        "global_batch": 8, "swiglu": True, "ffn_hidden": 512}


def test_kernels_are_the_models() -> None:
    r = run_from_dict(TINY)
    gpu = get_gpu("h200")
    cost = layer_cost(r, gpu, link_profile(gpu))
    kernels = layer_kernels(r, "h200")
    gemm = sum(k.predicted_s for k in kernels if k.kind == "gemm")
    assert gemm == pytest.approx(cost.fwd["gemm"] + cost.bwd["gemm"])
    attn = {k.kind: k.predicted_s for k in kernels if k.kind.startswith("attention")}
    assert attn == pytest.approx({"attention_fwd": cost.fwd["attention"],
                                  "attention_bwd": cost.bwd["attention"]})
    # QKV with SwiGLU at TP2: (tokens, (h + 2 kv) / tp, h); FC1 carries both SwiGLU matrices.
    shapes = {k.name: k.shape for k in kernels}
    assert shapes["qkv fwd"] == (512, 384, 256) and shapes["fc1 fwd"] == (512, 512, 256)
    assert shapes["fc2 wgrad"] == (256, 256, 512)


def test_every_kind_times_here() -> None:
    cpu = torch.device("cpu")
    assert device_profile(cpu) is None
    for k in layer_kernels(run_from_dict(TINY), "h200"):
        assert measure(k, cpu, 0.01) > 0 or k.kind == "attention_bwd", k.name


def test_rows_it_cannot_check_say_so() -> None:
    cpu = torch.device("cpu")
    with pytest.raises(SystemExit, match="BF16 rows only"):
        check_row("bridge-llama3-70b-fp8", "h100-sxm", 0.01, cpu)
    with pytest.raises(SystemExit, match="no published row"):
        check_row("no-such-row", "h100-sxm", 0.01, cpu)
