"""On a GPU, without Transformer Engine (megatron-core's local spec): the CPU patches are not in
place, BF16 and FP16 train, and fp32 on the GPU follows the same run on the CPU. Skipped where
CUDA is absent."""

from __future__ import annotations

import math

import pytest
import torch

from megatron_lgs import platform
from tests.gpu.runs import LOCAL, compare_devices, needs_cuda, run_on

pytestmark = needs_cuda


def test_cpu_patches_are_not_in_place_on_cuda(figures):
    here = platform.get_platform()
    assert (here.device.type, here.backend) == ("cuda", "nccl")
    assert platform.installed_cpu_patches() == []
    assert isinstance(torch.cuda.current_device(), int)
    figures("transformer engine", "yes" if here.te_available else f"no ({here.te_error})")


@pytest.mark.parametrize("precision", ["--bf16", "--fp16"])
def test_half_precision_trains(tiny, tmp_path, precision, figures):
    extra = ["--initial-loss-scale", "4096"] if precision == "--fp16" else []
    run = run_on("cuda", [*tiny, *LOCAL, precision, *extra, "--train-iters", "12",
                          "--log-interval", "4", "--eval-iters", "0"], tmp_path)
    losses = run.losses()
    skipped = [r["reason"] for r in run.records("train") if r["skipped"]]
    figures("first loss", losses[0])
    figures("last loss", losses[-1])
    figures("skipped steps", len(skipped))
    assert len(losses) == 12 and all(math.isfinite(x) for x in losses), losses
    assert losses[-1] < losses[0] - 0.1, losses
    assert len(skipped) <= 2, skipped  # fp16: at most the loss scale's first overflows


def test_fp32_on_cuda_matches_the_cpu(tiny, tmp_path, figures):
    cuda, cpu, diff = compare_devices(tiny, tmp_path, "cuda")
    figures("fp32 losses, CUDA", cuda)
    figures("fp32 losses, CPU", cpu)
    figures("largest |CUDA - CPU| loss difference over 3 steps", diff)
    assert diff <= 1e-4, (cuda, cpu)
