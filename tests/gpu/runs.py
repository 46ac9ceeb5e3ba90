"""What the GPU tests share, written so that it also runs on the CPU (tests/unit/test_gpu_check.py
runs it there): one run per device, the comparison of two devices' losses, steady-state
throughput from a run's records, and the ~1.3B shape."""

from __future__ import annotations

import re
import statistics
from pathlib import Path

import pytest
import torch

from tests.conftest import Run, run_pretrain

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

# The local spec (megatron-core's own modules) whether or not Transformer Engine is present.
LOCAL = ["--transformer-impl", "local"]
# A process that must not see the GPU: torch then reports no CUDA and the CPU patches apply.
CPU_ONLY = {"CUDA_VISIBLE_DEVICES": ""}
# cuBLAS picks its reduction order per workspace; a fixed one makes a GPU run repeatable.
DETERMINISTIC = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}

# launch/configs/gpt-1b.sh's shape at one GPU's batch: 24 x 2048, SwiGLU 5632, RoPE, RMSNorm.
GPT_1B = ["--num-layers", "24", "--hidden-size", "2048", "--num-attention-heads", "16",
          "--seq-length", "2048", "--max-position-embeddings", "2048",
          "--position-embedding-type", "rope", "--normalization", "RMSNorm", "--swiglu",
          "--ffn-hidden-size", "5632", "--disable-bias-linear",
          "--untie-embeddings-and-output-weights", "--micro-batch-size", "4",
          "--global-batch-size", "16"]
# The GPU check's 1.3B training run: every flag but its steps, so that the CPU parses the very
# list the GPU runs (tests/unit/test_gpu_check.py).
GPT_1B_RUN = [*GPT_1B, *LOCAL, "--bf16", "--vocab-size", "512", "--lr", "1e-4", "--min-lr", "1e-5"]

_PLATFORM_LINE = re.compile(r" platform: (\w+)/(\w+), transformer engine")


def device_env(device: str) -> dict[str, str]:
    return CPU_ONLY if device == "cpu" else dict(DETERMINISTIC)


def platform_of(run: Run) -> str:
    """The device the run reported at start-up ('cpu' or 'cuda')."""
    found = _PLATFORM_LINE.search(run.stdout)
    assert found, run.stdout[-2000:]
    return found.group(1)


def run_on(device: str, args: list[str], save_dir: Path | None, timeout: float = 300,
           env: dict[str, str] | None = None) -> Run:
    """pretrain_gpt.py on `device` (no checkpoint and no metrics.jsonl without `save_dir`);
    fails unless the run really ran there."""
    run = run_pretrain(args, save_dir=save_dir, env={**device_env(device), **(env or {})},
                       timeout=timeout)
    assert platform_of(run) == device, f"asked for {device}, ran on {platform_of(run)}"
    return run


def fp32_losses(tiny: list[str], save_dir: Path, device: str, steps: int = 3,
                env: dict[str, str] | None = None) -> list[float]:
    """The tiny GPT on the local spec in fp32 for `steps` iterations: per-iteration losses."""
    run = run_on(device, [*tiny, *LOCAL, "--train-iters", str(steps), "--log-interval", "1",
                          "--eval-iters", "0"], save_dir, env=env)
    losses = run.losses()
    assert len(losses) == steps, losses
    return losses


def max_difference(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b) and a, (a, b)
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


def compare_devices(tiny: list[str], tmp_path: Path, device: str, reference: str = "cpu",
                    steps: int = 3, reference_env: dict[str, str] | None = None
                    ) -> tuple[list[float], list[float], float]:
    """The same fp32 run on `device` and on `reference`: (losses, reference losses, largest
    difference)."""
    mine = fp32_losses(tiny, tmp_path / device, device, steps)
    theirs = fp32_losses(tiny, tmp_path / f"{reference}-reference", reference, steps,
                         env=reference_env)
    return mine, theirs, max_difference(mine, theirs)


_LOG_LINE = re.compile(r"throughput per GPU \(TFLOP/s/GPU\): ([0-9.]+) \|.*"
                       r"tokens per second: ([0-9.]+) \|")
_MEMORY_LINE = re.compile(r" memory per rank( at start-up)? \(MB\): parameters ([0-9.]+) \| "
                          r"gradients ([0-9.]+) \| optimizer state ([0-9.]+) \|")
_DEVICE_MEMORY = re.compile(r"memory \(MB\) \| allocated: ([0-9.]+) \| max allocated: "
                            r"([0-9.]+) \| reserved: ([0-9.]+) \| max reserved: ([0-9.]+)")


def steady_state(run: Run, skip_intervals: int = 1) -> dict[str, float]:
    """Mean tokens/s and TFLOP/s per GPU of the console's log lines after the first
    `skip_intervals` (start-up, allocator growth, first-step optimizer-state creation)."""
    lines = [(float(t), float(k)) for t, k in _LOG_LINE.findall(run.stdout)]
    steady = lines[skip_intervals:]
    assert steady, f"{len(lines)} log lines, {skip_intervals} skipped: {run.stdout[-2000:]}"
    return {"tflops_per_gpu": statistics.mean(t for t, _ in steady),
            "tokens_per_second": statistics.mean(k for _, k in steady),
            "intervals": len(steady)}


def memory_report(run: Run) -> dict[str, dict[str, float]]:
    """The console's memory lines, MB: 'startup' and 'after first step' (parameters,
    gradients, optimizer state) and, on a GPU, 'device' (Megatron-LM's allocator report)."""
    report = {}
    for startup, *values in _MEMORY_LINE.findall(run.stdout):
        key = "startup" if startup else "after first step"
        report[key] = dict(zip(("parameters", "gradients", "optimizer_state"),
                               map(float, values), strict=True))
    device = _DEVICE_MEMORY.search(run.stdout)
    if device:
        report["device"] = dict(zip(("allocated", "max_allocated", "reserved", "max_reserved"),
                                    map(float, device.groups()), strict=True))
    return report


def logged_mfu(run: Run) -> list[float]:
    """The MFU figures the console printed (percent)."""
    return [float(x) for x in re.findall(r"MFU: ([0-9.]+)%", run.stdout)]


def activation_bytes_estimate(seq: int, micro_batch: int, hidden: int, heads: int,
                              layers: int) -> float:
    """Megatron's activation estimate (Korthikanti et al.): s b h (34 + 5 a s / h) bytes per
    layer, no recompute, no sequence parallelism (the same formula as lgs/memwall.py)."""
    return seq * micro_batch * hidden * (34 + 5 * heads * seq / hidden) * layers
