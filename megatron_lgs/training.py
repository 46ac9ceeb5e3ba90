"""The trainer: set up once, then the step loop in Megatron-LM's order.

Each step: zero grad buffers -> forward/backward over the micro-batches (megatron-core's
schedule; grads reduce during the last micro-batch's backward) -> optimizer step (unscale, inf
check, clip, Adam, copy back) -> scheduler -> log -> eval -> checkpoint/exit.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.pipeline_parallel import get_forward_backward_func

from megatron_lgs import checkpointing, data, initialize, memory, metrics
from megatron_lgs.arguments import Config, ConfigError, fail
from megatron_lgs.model import flops_per_token, num_parameters
from megatron_lgs.optim import attach_schedule_hooks, build_optimizer, build_scheduler, wrap_ddp
from megatron_lgs.platform import Platform, get_platform
from megatron_lgs.run_state import RunState, config_fingerprint

ModelProvider = Callable[[Config, Platform, int], torch.nn.Module]
ForwardStep = Callable[[Iterator, torch.nn.Module], tuple]


@dataclass
class Datasets:
    train: torch.utils.data.Dataset
    valid: torch.utils.data.Dataset
    vocab_size: int
    fingerprint: str


DatasetsProvider = Callable[[Config], Datasets]


def print_rank_last(message: str) -> None:
    """Megatron prints from the last rank: it holds the loss under pipeline parallelism."""
    if dist.get_rank() == dist.get_world_size() - 1:
        print(message, flush=True)


def _reduce_loss(losses: list[dict]) -> float:
    """Token-weighted mean of the micro-batch losses over the data-parallel group; NaN on
    ranks that are not on the last pipeline stage."""
    if not parallel_state.is_pipeline_last_stage():
        return float("nan")
    total = torch.stack([x["lm loss"] for x in losses]).sum(dim=0).double()
    dist.all_reduce(total, group=parallel_state.get_data_parallel_group(with_context_parallel=True))
    return (total[0] / total[1]).item()


class Trainer:
    def __init__(self, cfg: Config, model_provider: ModelProvider, forward_step: ForwardStep,
                 datasets_provider: DatasetsProvider) -> None:
        self.cfg = cfg
        self.platform = get_platform()
        initialize.check_platform(cfg, self.platform)
        initialize.init_distributed(cfg, self.platform)
        initialize.set_seeds(cfg.training.seed)

        self.datasets = datasets_provider(cfg)
        self.model = wrap_ddp(cfg, model_provider(cfg, self.platform, self.datasets.vocab_size))
        self.optimizer = build_optimizer(cfg, self.model)
        self.scheduler = build_scheduler(cfg, self.optimizer)
        attach_schedule_hooks(cfg, self.model, self.optimizer)
        self.forward_step = forward_step
        self.forward_backward = get_forward_backward_func()
        self.state = RunState(config_fingerprint=config_fingerprint(cfg),
                              data_fingerprint=self.datasets.fingerprint)
        t = cfg.training
        self.dp_size = parallel_state.get_data_parallel_world_size()
        self.dp_rank = parallel_state.get_data_parallel_rank()
        self.num_microbatches = t.global_batch_size // (t.micro_batch_size * self.dp_size)
        self.flops_per_token = flops_per_token(cfg, self.datasets.vocab_size)
        is_last_rank = dist.get_rank() == dist.get_world_size() - 1
        self.metrics_file = metrics.MetricsFile(
            cfg.checkpoint.save and is_last_rank and f"{cfg.checkpoint.save}/metrics.jsonl")

        if cfg.checkpoint.load and checkpointing.load_checkpoint(
                cfg.checkpoint, self.state, self.model, self.optimizer, self.scheduler):
            print_rank_last(f" loaded checkpoint from {cfg.checkpoint.load} at iteration "
                            f"{self.state.iteration}")
        self._log_setup()

    def _log_setup(self) -> None:
        c = self.cfg
        n = num_parameters(self.model)
        print_rank_last(
            f" platform: {self.platform.device.type}/{self.platform.backend}, transformer engine: "
            f"{'yes' if self.platform.te_available else 'no (' + str(self.platform.te_error) + ')'}"
            f"\n world size {c.parallel.world_size} = TP {c.parallel.tensor_model_parallel_size}"
            f" x PP {c.parallel.pipeline_model_parallel_size} x CP "
            f"{c.parallel.context_parallel_size} x DP {self.dp_size}; parameters on this rank: "
            f"{n:,}; precision {c.precision.name}; micro-batches per step: "
            f"{self.num_microbatches}")

    # -- one step ------------------------------------------------------------------------------
    def train_step(self, batches: Iterator) -> tuple[float, float | None, bool]:
        self.model.zero_grad_buffer()
        self.optimizer.zero_grad()
        t = self.cfg.training
        losses = self.forward_backward(
            forward_step_func=self.forward_step, data_iterator=batches, model=[self.model],
            num_microbatches=self.num_microbatches, seq_length=self.cfg.model.seq_length,
            micro_batch_size=t.micro_batch_size, forward_only=False)
        update_successful, grad_norm, _ = self.optimizer.step()
        if update_successful:
            self.scheduler.step(increment=1)
        return _reduce_loss(losses), grad_norm, update_successful

    def evaluate(self) -> float | None:
        """The same validation batches every time, so evaluations compare like with like."""
        t = self.cfg.training
        if t.eval_iters == 0:
            return None
        micro = data.eval_micro_batches(t.eval_iters, t.global_batch_size, t.micro_batch_size,
                                        self.dp_rank, self.dp_size)
        self.model.eval()
        with torch.no_grad():
            losses = self.forward_backward(
                forward_step_func=self.forward_step,
                data_iterator=data.fixed_batches(self.datasets.valid, micro),
                model=[self.model], num_microbatches=len(micro),
                seq_length=self.cfg.model.seq_length, micro_batch_size=t.micro_batch_size,
                forward_only=True)
        self.model.train()
        loss = _reduce_loss(losses)
        print_rank_last(metrics.validation_log_line(self.state.iteration, loss))
        self.metrics_file.write(event="valid", iteration=self.state.iteration, loss=loss)
        return loss

    def save(self) -> None:
        path = checkpointing.save_checkpoint(self.cfg.checkpoint, self.state, self.model,
                                             self.optimizer, self.scheduler)
        print_rank_last(f" saved checkpoint at iteration {self.state.iteration} to {path}")

    # -- the loop ------------------------------------------------------------------------------
    def train(self) -> RunState:
        c, t, s = self.cfg, self.cfg.training, self.state
        sampler = data.MicroBatchSampler(s.consumed_train_samples, t.global_batch_size,
                                         t.micro_batch_size, self.dp_rank, self.dp_size)
        batches = data.micro_batch_stream(self.datasets.train, sampler, c.data.num_workers)
        if s.iteration == 0:
            self.evaluate()
        interval = metrics.IntervalStats()
        first_iteration = s.iteration + 1
        while s.iteration < t.train_iters:
            started = time.perf_counter()
            loss, grad_norm, ok = self.train_step(batches)
            s.iteration += 1
            s.consumed_train_samples += t.global_batch_size
            s.skipped_iterations += 0 if ok else 1
            interval.add(loss, time.perf_counter() - started)
            if s.iteration == first_iteration:  # optimizer state exists only after a step
                self._log_memory()
            lr = self.optimizer.param_groups[0]["lr"]
            self.metrics_file.write(event="train", iteration=s.iteration, loss=loss, lr=lr,
                                    grad_norm=grad_norm, skipped=not ok,
                                    loss_scale=self.optimizer.get_loss_scale().item())

            if s.iteration % t.log_interval == 0:
                self._log_interval(interval, grad_norm, lr)
                interval = metrics.IntervalStats()
            if s.iteration % t.eval_interval == 0 or s.iteration == t.train_iters:
                self.evaluate()
            save_now = c.checkpoint.save_interval and s.iteration % c.checkpoint.save_interval == 0
            exit_now = t.exit_interval and s.iteration % t.exit_interval == 0
            if c.checkpoint.save and (save_now or exit_now or s.iteration == t.train_iters):
                self.save()
            if exit_now:
                print_rank_last(f" exiting after iteration {s.iteration} (--exit-interval)")
                break
        self.metrics_file.close()
        return s

    def _log_memory(self) -> None:
        per_rank = memory.gather_memory(self.model, self.optimizer)
        print_rank_last(memory.memory_log_line(per_rank))
        self.metrics_file.write(event="memory", iteration=self.state.iteration,
                                per_rank=per_rank)

    def _log_interval(self, interval: metrics.IntervalStats, grad_norm: float | None,
                      lr: float) -> None:
        t, s = self.cfg.training, self.state
        seconds_per_iteration = interval.step_seconds / interval.iterations
        tokens_per_second = t.global_batch_size * self.cfg.model.seq_length / seconds_per_iteration
        tflops = tokens_per_second * self.flops_per_token / 1e12 / self.cfg.parallel.world_size
        peak = metrics.gpu_peak_tflops()
        print_rank_last(metrics.training_log_line(
            iteration=s.iteration, train_iters=t.train_iters,
            consumed_samples=s.consumed_train_samples,
            ms_per_iteration=1000 * seconds_per_iteration, lr=lr,
            global_batch_size=t.global_batch_size, loss=interval.mean_loss(),
            loss_scale=self.optimizer.get_loss_scale().item(), grad_norm=grad_norm,
            skipped=s.skipped_iterations, nan_iterations=interval.nan_iterations,
            tokens_per_second=tokens_per_second, tflops_per_gpu=tflops,
            mfu=tflops / peak if peak else None))


def pretrain(cfg: Config, model_provider: ModelProvider, forward_step: ForwardStep,
             datasets_provider: DatasetsProvider) -> RunState:
    """Build everything and train; a configuration the machine cannot run is one clear line."""
    try:
        trainer = Trainer(cfg, model_provider, forward_step, datasets_provider)
    except ConfigError as exc:
        fail(str(exc))
    try:
        return trainer.train()
    finally:
        initialize.destroy()
