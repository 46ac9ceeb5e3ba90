"""Console lines in Megatron-LM's shape (existing log parsers keep working), throughput, MFU,
and an exact per-iteration JSON-lines record for tools and tests."""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from megatron_lgs.lgs.sync import StepStats
from megatron_lgs.run_config import LoggingConfig

# Dense BF16 peak TFLOP/s per GPU, from the vendors' spec sheets; MFU is printed only for these.
PEAK_BF16_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0}


def gpu_peak_tflops() -> float | None:
    if not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name()
    return next((peak for key, peak in PEAK_BF16_TFLOPS.items() if key in name), None)


def throughput(tokens_per_second: float, flops_per_token: float, world_size: int,
               peak_tflops: float | None) -> tuple[float, float | None]:
    """(model TFLOP/s per GPU, MFU as a fraction of the peak, or None without a known peak).
    Model FLOPs: Megatron-LM's count (model.flops_per_token), whatever recompute adds."""
    tflops = tokens_per_second * flops_per_token / 1e12 / world_size
    return tflops, (tflops / peak_tflops if peak_tflops else None)


@dataclass
class IntervalStats:
    """Accumulates between two log lines; time counts training steps only (not eval, saves)."""

    iterations: int = 0
    loss_sum: float = 0.0
    nan_iterations: int = 0
    finite: int = 0
    step_seconds: float = 0.0

    def add(self, loss: float, step_seconds: float, nan: bool) -> None:
        """`loss` is NaN for a NaN step, and also for a step skipped without computing one."""
        self.iterations += 1
        self.step_seconds += step_seconds
        self.nan_iterations += nan
        if math.isfinite(loss):
            self.loss_sum += loss
            self.finite += 1

    def mean_loss(self) -> float:
        return self.loss_sum / self.finite if self.finite else float("nan")


def training_log_line(*, iteration: int, train_iters: int, consumed_samples: int,
                      ms_per_iteration: float, lr: float, global_batch_size: int,
                      loss: float, loss_scale: float, grad_norm: float | None,
                      skipped: int, nan_iterations: int, tokens_per_second: float,
                      tflops_per_gpu: float, mfu: float | None) -> str:
    parts = [
        f" [{time.strftime('%Y-%m-%d %H:%M:%S')}] iteration {iteration:8d}/{train_iters:8d}",
        f" consumed samples: {consumed_samples:12d}",
        f" elapsed time per iteration (ms): {ms_per_iteration:.1f}",
        f" throughput per GPU (TFLOP/s/GPU): {tflops_per_gpu:.3f}",
        f" learning rate: {lr:.6E}",
        f" global batch size: {global_batch_size:5d}",
        f" lm loss: {loss:.6E}",
        f" loss scale: {loss_scale:.1f}",
        f" grad norm: {grad_norm:.3f}" if grad_norm is not None else " grad norm: nan",
        f" number of skipped iterations: {skipped:3d}",
        f" number of nan iterations: {nan_iterations:3d}",
        f" tokens per second: {tokens_per_second:.1f}",
    ]
    if mfu is not None:
        parts.append(f" MFU: {100 * mfu:.1f}%")
    return "".join(part + " |" for part in parts)


def lgs_record(stats: StepStats, step_seconds: float) -> dict[str, float | int]:
    """One step of layer-wise gradient sync, as this rank saw it."""
    return {
        "comm_seconds": stats.comm_seconds, "exposed_seconds": stats.exposed_seconds,
        "comm_fraction": stats.comm_seconds / step_seconds,
        "exposed_fraction": stats.exposed_seconds / step_seconds,
        "bytes_intra": stats.bytes_intra, "bytes_inter": stats.bytes_inter,
        "buckets_fired": stats.buckets_fired, "inter_messages": stats.inter_messages,
        "peak_inflight_bytes": stats.peak_inflight_bytes,
        "max_fires_per_bucket": max(stats.fires.values(), default=0),
        "ignored_ready": stats.ignored_ready,
    }


def lgs_log_line(stats: StepStats, step_seconds: float) -> str:
    r = lgs_record(stats, step_seconds)
    return (f" gradient sync (LGS, last step): communication {1000 * r['comm_seconds']:.1f} ms "
            f"({100 * r['comm_fraction']:.1f}% of the step), exposed "
            f"{1000 * r['exposed_seconds']:.1f} ms ({100 * r['exposed_fraction']:.1f}%), "
            f"sent intra {r['bytes_intra'] / 2**20:.2f} MB / inter "
            f"{r['bytes_inter'] / 2**20:.2f} MB, {r['buckets_fired']} buckets, "
            f"{r['inter_messages']} inter-node messages, peak in flight "
            f"{r['peak_inflight_bytes'] / 2**20:.2f} MB")


def validation_log_line(iteration: int, loss: float) -> str:
    ppl = math.exp(min(20.0, loss))
    return (f" validation loss at iteration {iteration} | lm loss value: {loss:.6E} | "
            f"lm loss PPL: {ppl:.6E} |")


def watch_log_line(layer_grad_norms: dict[str, float] | None, update_ratio: float | None,
                   loss_variance: float) -> str:
    parts = []
    if layer_grad_norms:
        parts.append(" grad norm per layer: " + ", ".join(
            f"{name} {value:.3e}" for name, value in _layer_order(layer_grad_norms)))
    if update_ratio is not None:
        parts.append(f" update/param ratio: {update_ratio:.3e}")
    parts.append(f" loss variance (window): {loss_variance:.4f}")
    return "".join(part + " |" for part in parts)


def _layer_order(norms: dict[str, float]) -> list[tuple[str, float]]:
    """embedding, layer 1..N in numeric order, then the rest."""
    def key(item: tuple[str, float]) -> tuple[int, int, str]:
        name = item[0]
        if name.startswith("layer "):
            return (1, int(name.split()[1]), name)
        return (0 if name == "embedding" else 2, 0, name)
    return sorted(norms.items(), key=key)


class ScalarSinks:
    """TensorBoard and Weights & Biases (offline only: no network), fed the console's scalars."""

    def __init__(self, cfg: LoggingConfig, run_config: dict) -> None:
        self.tensorboard = None
        self.wandb_run = None
        if cfg.tensorboard_dir:
            from torch.utils.tensorboard import SummaryWriter

            self.tensorboard = SummaryWriter(log_dir=cfg.tensorboard_dir)
        if cfg.wandb_project:
            os.environ["WANDB_MODE"] = "offline"
            import wandb

            self.wandb_run = wandb.init(project=cfg.wandb_project, name=cfg.wandb_exp_name,
                                        dir=cfg.wandb_save_dir, config=run_config,
                                        mode="offline")

    def add(self, scalars: dict[str, float | None], iteration: int) -> None:
        present = {k: float(v) for k, v in scalars.items() if v is not None}
        if self.tensorboard:
            for name, value in present.items():
                self.tensorboard.add_scalar(name, value, iteration)
        if self.wandb_run:
            self.wandb_run.log(present, step=iteration)

    def close(self) -> None:
        if self.tensorboard:
            self.tensorboard.close()
        if self.wandb_run:
            self.wandb_run.finish()


class MetricsFile:
    """One JSON object per event, floats at full precision (bit-exactness is checked on it)."""

    def __init__(self, path: str | None) -> None:
        self._file = None
        if path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            self._file = open(path, "a")

    def write(self, **record: object) -> None:
        if self._file is not None:
            self._file.write(json.dumps(record) + "\n")
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
