"""On a GPU: ZeRO-Offload (megatron-core's HybridDeviceOptimizer) and Megatron-FSDP's GPU path.
Skipped where CUDA is absent (on CPU, offloading is refused and FSDP is tested in
tests/distributed/test_zero.py)."""

from __future__ import annotations

import math
import re

import pytest
import torch

from tests.conftest import run_pretrain

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

STEPS = ["--bf16", "--train-iters", "10", "--log-interval", "1"]


def test_optimizer_cpu_offload_trains_like_the_gpu_optimizer(tiny, tmp_path):
    on_gpu = run_pretrain([*tiny, *STEPS, "--use-distributed-optimizer"],
                          save_dir=tmp_path / "gpu").losses()
    offloaded = run_pretrain([*tiny, *STEPS, "--use-distributed-optimizer",
                              "--optimizer-cpu-offload"], save_dir=tmp_path / "cpu").losses()
    assert offloaded[0] == on_gpu[0]  # same weights, same first forward
    assert all(math.isfinite(x) for x in offloaded) and offloaded[-1] < offloaded[0]
    # Host Adam and the GPU's fused Adam differ only in rounding.
    assert offloaded == pytest.approx(on_gpu, abs=5e-2)


def test_megatron_fsdp_zero3_trains_on_one_gpu(tiny):
    run = run_pretrain([*tiny, *STEPS, "--use-megatron-fsdp",
                        "--data-parallel-sharding-strategy", "optim_grads_params"])
    losses = [float(x) for x in re.findall(r"\| lm loss: (\S+) \|", run.stdout)]
    assert len(losses) == 10 and all(math.isfinite(x) for x in losses)
    assert losses[-1] < losses[0]
    assert " memory per rank at start-up (MB): parameters " in run.stdout
