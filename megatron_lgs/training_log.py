"""What the trainer reports and where: Megatron-LM's console lines from the last rank (it holds
the loss under pipeline parallelism), the exact per-iteration record (`metrics.jsonl` beside the
checkpoints) and the scalar sinks (TensorBoard, W&B). Nothing here changes the run."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from megatron_lgs import memory, metrics, moe_load, stability
from megatron_lgs.model import flops_per_token, num_parameters, num_transformer_layers
from megatron_lgs.platform import Platform
from megatron_lgs.run_config import Config
from megatron_lgs.run_state import RunState

if TYPE_CHECKING:
    from megatron_lgs.lgs.sync import LgsEngine
    from megatron_lgs.training import StepResult


def print_rank_0(message: str) -> None:
    if dist.get_rank() == 0:
        print(message, flush=True)


def print_rank_last(message: str) -> None:
    """Megatron prints from the last rank: it holds the loss under pipeline parallelism."""
    if dist.get_rank() == dist.get_world_size() - 1:
        print(message, flush=True)


class TrainingLog:
    """One run's reports. Files and sinks exist on the last rank only; every rank calls the
    same methods, since the memory reports gather from all of them."""

    def __init__(self, cfg: Config, model: list[torch.nn.Module], vocab_size: int) -> None:
        self.cfg = cfg
        is_last_rank = dist.get_rank() == dist.get_world_size() - 1
        self.metrics_file = metrics.MetricsFile(
            cfg.checkpoint.save and is_last_rank and f"{cfg.checkpoint.save}/metrics.jsonl")
        self.sinks = metrics.ScalarSinks(cfg.logging, cfg.to_dict()) if is_last_rank else None
        self.flops_per_token = flops_per_token(cfg, vocab_size)
        self.device_memory_printed = False
        m = cfg.model
        self.expert_load = moe_load.ExpertLoadMonitor(
            model, m.num_layers, m.num_experts, m.moe_router_topk,
            cfg.parallel.sequence_parallel) if m.num_experts else None

    def record(self, event: str, iteration: int, **fields: object) -> None:
        """One line of metrics.jsonl."""
        self.metrics_file.write(event=event, iteration=iteration, **fields)

    def scalars(self, values: dict[str, float | None], iteration: int) -> None:
        if self.sinks:
            self.sinks.add(values, iteration)

    def close(self) -> None:
        self.metrics_file.close()
        if self.sinks:
            self.sinks.close()

    def setup(self, model: list[torch.nn.Module], optimizer: object, platform: Platform,
              dp_size: int, num_microbatches: int, lgs: LgsEngine | None,
              iteration: int) -> None:
        """The start-up report: platform, layout, parameters and memory of every rank."""
        c = self.cfg
        n = sum(num_parameters(chunk) for chunk in model)
        layers = str(num_transformer_layers(model))
        if len(model) > 1:  # the interleaved schedule's model chunks
            per_chunk = " + ".join(str(num_transformer_layers([chunk])) for chunk in model)
            layers += f" ({per_chunk} in {len(model)} model chunks)"
        print_rank_last(
            f" platform: {platform.device.type}/{platform.backend}, transformer engine: "
            f"{'yes' if platform.te_available else 'no (' + str(platform.te_error) + ')'}"
            f"\n world size {c.parallel.world_size} = TP {c.parallel.tensor_model_parallel_size}"
            f" x PP {c.parallel.pipeline_model_parallel_size} x CP "
            f"{c.parallel.context_parallel_size} x DP {dp_size}; parameters on this rank: "
            f"{n:,}; transformer layers on this rank: {layers}; precision {c.precision.name}; "
            f"micro-batches per step: {num_microbatches}")
        if lgs:
            print_rank_0(lgs.describe())
        per_rank = memory.gather(memory.startup_memory_bytes(model, optimizer,
                                                             c.optim.optimizer))
        print_rank_last(memory.memory_log_line(per_rank, " at start-up"))
        self.record("memory_startup", iteration, per_rank=per_rank)

    def memory(self, model: list[torch.nn.Module], optimizer: object, iteration: int) -> None:
        """Every rank's memory once the optimizer state exists (after the first step)."""
        per_rank = memory.gather_memory(model, optimizer)
        print_rank_last(memory.memory_log_line(per_rank))
        self.record("memory", iteration, per_rank=per_rank)

    def validation(self, iteration: int, loss: float) -> None:
        print_rank_last(metrics.validation_log_line(iteration, loss))
        self.record("valid", iteration, loss=loss)
        self.scalars({"validation lm loss": loss}, iteration)

    def interval(self, state: RunState, interval: metrics.IntervalStats, result: StepResult,
                 lr: float, global_batch_size: int, loss_scale: float, loss_variance: float | None,
                 lgs: LgsEngine | None, last_step_seconds: float) -> None:
        """The log-interval report: Megatron-LM's iteration line, then the diagnostics."""
        t, s = self.cfg.training, state
        seconds_per_iteration = interval.step_seconds / interval.iterations
        tokens_per_second = global_batch_size * self.cfg.model.seq_length / seconds_per_iteration
        tflops, mfu = metrics.throughput(tokens_per_second, self.flops_per_token,
                                         self.cfg.parallel.world_size, metrics.gpu_peak_tflops())
        print_rank_last(metrics.training_log_line(
            iteration=s.iteration, train_iters=t.train_iters,
            consumed_samples=s.consumed_train_samples,
            ms_per_iteration=1000 * seconds_per_iteration, lr=lr,
            global_batch_size=global_batch_size, loss=interval.mean_loss(),
            loss_scale=loss_scale, grad_norm=result.grad_norm,
            skipped=s.skipped_iterations, nan_iterations=interval.nan_iterations,
            tokens_per_second=tokens_per_second, tflops_per_gpu=tflops, mfu=mfu))
        self._device_memory(s.iteration)
        if lgs:
            print_rank_last(metrics.lgs_log_line(lgs.stats, last_step_seconds))
        print_rank_last(metrics.watch_log_line(result.layer_grad_norms, result.update_ratio,
                                               loss_variance))
        for line in stability.alerts(result.grad_norm, result.update_ratio, loss_variance):
            print_rank_last(line)
        if self.expert_load is not None:
            self._expert_load(s.iteration)
        scalars = {
            "lm loss": interval.mean_loss(), "learning rate": lr, "loss scale": loss_scale,
            "grad norm": result.grad_norm, "skipped iterations": s.skipped_iterations,
            "nan iterations": s.nan_iterations, "tokens per second": tokens_per_second,
            "throughput TFLOP/s per GPU": tflops, "loss variance": loss_variance,
            "update/param ratio": result.update_ratio,
            **{f"grad norm/{k}": v for k, v in (result.layer_grad_norms or {}).items()},
        }
        self.record("log", s.iteration, **{
            k.replace(" ", "_").replace("/", "."): v for k, v in scalars.items()})
        self.scalars(scalars, s.iteration)

    def _device_memory(self, iteration: int) -> None:
        """GPU memory (allocated, peak) at every log interval into metrics.jsonl; printed at the
        first, as Megatron-LM prints its memory report once. Nothing off the GPU."""
        mine = memory.device_memory_bytes()
        if mine is None:
            return
        per_rank = memory.gather(mine)
        if not self.device_memory_printed:
            print_rank_last(memory.device_memory_log_line(per_rank, iteration))
            self.device_memory_printed = True
        self.record("device_memory", iteration, per_rank=per_rank)

    def _expert_load(self, iteration: int) -> None:
        layers = self.expert_load.collect()
        for line in moe_load.log_lines(layers):
            print_rank_last(line)
        record = moe_load.metrics_record(layers)
        self.record("moe", iteration, **record)
        self.scalars({f"moe/{k}": v for k, v in record.items() if isinstance(v, float | int)},
                     iteration)

