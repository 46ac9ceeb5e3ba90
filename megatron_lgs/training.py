"""The trainer: set up once, then the step loop in Megatron-LM's order.

Each step: zero grad buffers -> forward/backward over the micro-batches (megatron-core's
schedule; grads reduce during the last micro-batch's backward) -> stability verdict on the loss
and global grad norm -> optimizer step (unscale, inf check, clip, Adam, copy back) ->
scheduler -> log (training_log) -> eval -> checkpoint/exit.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.pipeline_parallel import get_forward_backward_func

from data_pipeline.mixing import MixingConfig, MixingSchedule
from megatron_lgs import checkpointing, data, initialize, metrics, model_record, stability
from megatron_lgs.arguments import fail
from megatron_lgs.async_save import AsyncSaves
from megatron_lgs.exit_conditions import ExitConditions
from megatron_lgs.lgs import online
from megatron_lgs.optim import (
    attach_schedule_hooks,
    build_optimizer,
    build_scheduler,
    guarded_step,
    wrap_ddp,
)
from megatron_lgs.platform import Platform, get_platform
from megatron_lgs.run_config import Config, ConfigError
from megatron_lgs.run_state import RunState, config_fingerprint, config_mismatch, config_settings
from megatron_lgs.training_log import TrainingLog, print_rank_0, print_rank_last

# (cfg, platform, vocab_size, vp_stage) -> one model chunk; vp_stage only when interleaved.
ModelProvider = Callable[..., torch.nn.Module]
ForwardStep = Callable[[Iterator, torch.nn.Module], tuple]


@dataclass
class Datasets:
    train: torch.utils.data.Dataset
    valid: torch.utils.data.Dataset
    vocab_size: int
    fingerprint: str
    # The train blend's per-window domain weights, and one validation set per domain; both
    # only where the weights can change (--data-mix dynamic).
    schedule: MixingSchedule | None = None
    valid_by_domain: dict[str, torch.utils.data.Dataset] = dataclasses.field(
        default_factory=dict)
    tokenizer_file: str | None = None  # copied into every checkpoint (model_record)
    legacy_fingerprint: str | None = None  # what checkpoints saved before 2026-12-06 carry


DatasetsProvider = Callable[[Config], Datasets]


@dataclass
class StepResult:
    loss: float
    grad_norm: float | None
    applied: bool
    reason: str | None = None  # why the update was refused or flagged
    rollback: bool = False
    layer_grad_norms: dict[str, float] | None = None
    update_ratio: float | None = None


def _reduce_loss(losses: list[dict]) -> float:
    """Token-weighted mean of the micro-batch losses over the data-parallel group, sent from the
    last pipeline stage to every stage so that all ranks judge a step alike."""
    total = torch.zeros(2, dtype=torch.float64, device=get_platform().device)
    if parallel_state.is_pipeline_last_stage():
        total += torch.stack([x["lm loss"] for x in losses]).sum(dim=0).double()
        dist.all_reduce(total,
                        group=parallel_state.get_data_parallel_group(with_context_parallel=True))
    if parallel_state.get_pipeline_model_parallel_world_size() > 1:
        dist.all_reduce(total, group=parallel_state.get_pipeline_model_parallel_group())
    return (total[0] / total[1]).item()


def per_chunk(batches: Iterator, chunks: int) -> Iterator | list[Iterator]:
    """The interleaved schedule wants one iterator per model chunk, each reading the same
    micro-batches; tee copies the stream, so it still advances by one step's micro-batches."""
    return batches if chunks == 1 else list(itertools.tee(batches, chunks))


class Trainer:
    def __init__(self, cfg: Config, model_provider: ModelProvider, forward_step: ForwardStep,
                 datasets_provider: DatasetsProvider) -> None:
        self.cfg = cfg
        self.platform = get_platform()
        initialize.check_platform(cfg, self.platform)
        # Before the process group: its threads make a fork unsafe (see async_save).
        self.async_saves = AsyncSaves() if cfg.checkpoint.async_save else None
        initialize.init_distributed(cfg, self.platform)
        initialize.set_seeds(cfg.training.seed)

        self.datasets = datasets_provider(cfg)
        # A list of model chunks, as in Megatron-LM: one per virtual pipeline stage (or one).
        self.model = wrap_ddp(cfg, build_model_chunks(cfg, model_provider, self.platform,
                                                      self.datasets.vocab_size), log=print_rank_0)
        self.lgs = getattr(self.model[0], "lgs", None)
        self.tuning = None
        if self.lgs:
            online.start_thresholds(cfg, self.lgs, print_rank_0)
            if cfg.lgs.lgs_autotune:
                self.tuning = online.OnlineTuning(cfg.lgs, self.lgs, print_rank_0)
        self.optimizer = build_optimizer(cfg, self.model)
        self.scheduler = build_scheduler(cfg, self.optimizer)
        attach_schedule_hooks(cfg, self.model, self.optimizer)
        self.forward_step = forward_step
        self.said_combined_1f1b = False
        self.forward_backward = get_forward_backward_func()
        self.state = RunState(config_fingerprint=config_fingerprint(cfg),
                              config=config_settings(cfg),
                              data_fingerprint=self.datasets.fingerprint,
                              global_batch_size=cfg.training.global_batch_size)
        self.monitor = stability.StabilityMonitor(cfg.stability)
        self.exit_conditions = ExitConditions(cfg.training.exit_signal_handler,
                                              cfg.training.exit_duration_in_mins)
        t = cfg.training
        self.dp_size = parallel_state.get_data_parallel_world_size()
        self.dp_rank = parallel_state.get_data_parallel_rank()
        self.batch_sizes = data.BatchSizeSchedule(t.global_batch_size, t.micro_batch_size,
                                                  self.dp_size, t.rampup_batch_size)
        self.num_microbatches = t.global_batch_size // (t.micro_batch_size * self.dp_size)
        self.log = TrainingLog(cfg, self.model, self.datasets.vocab_size)
        self.last_step_seconds = 0.0

        # The checkpoint a rollback goes back to: this run's last save, or the one it resumed
        # from in the folder it saves to (where a later one may be of a run --ckpt-step rewound).
        self.rollback_to: int | None = None
        if cfg.checkpoint.load and self._load(cfg.checkpoint):
            print_rank_last(f" loaded checkpoint from {cfg.checkpoint.load} at iteration "
                            f"{self.state.iteration}")
            c = cfg.checkpoint
            if not c.finetune and c.save and Path(c.load).resolve() == Path(c.save).resolve():
                self.rollback_to = self.state.iteration
        elif cfg.checkpoint.finetune:
            raise ConfigError(f"--finetune: no checkpoint under --load {cfg.checkpoint.load} "
                              "to take the weights from")
        elif cfg.checkpoint.load:  # a requeued job's first start; a mistyped path says so here
            print_rank_last(f" no checkpoint in {cfg.checkpoint.load} yet: starting from "
                            "iteration 0")
        self.state.iterations_to_skip = sorted(
            set(self.state.iterations_to_skip) | set(cfg.training.iterations_to_skip))
        self.log.setup(self.model, self.optimizer, self.platform, self.dp_size,
                       self.num_microbatches, self.lgs, self.state.iteration)

    def _load(self, ckpt_cfg) -> bool:
        loaded = checkpointing.load_checkpoint(
            ckpt_cfg, self.state, self.model, self.optimizer, self.scheduler, self.lgs,
            self.datasets, partial(config_mismatch, self.cfg))
        if loaded:
            self.monitor.load_state_dict(self.state.stability)
            if self.tuning:
                try:
                    self.tuning.load_state_dict(self.state.lgs_autotune)
                except ValueError as exc:
                    raise ConfigError(str(exc)) from None
            if self.datasets.schedule is not None and self.state.data_mix:
                self.datasets.schedule.load_state_dict(self.state.data_mix)
        return loaded

    # -- one step ------------------------------------------------------------------------------
    def _forward_step_for(self, iteration: int) -> ForwardStep:
        def forward_step(batches: Iterator, model: torch.nn.Module, **kwargs: object) -> tuple:
            if kwargs.get("return_schedule_plan") and not self.said_combined_1f1b:
                self.said_combined_1f1b = True
                print_rank_0(" EP all-to-alls overlapped with another micro-batch's compute "
                             "(megatron-core's combined 1F1B schedule)")
            output, loss_func = self.forward_step(batches, model, **kwargs)
            return output, stability.poison_loss(loss_func, iteration, self.cfg.stability)
        return forward_step

    def train_step(self, batches: Iterator, iteration: int, watch: bool = False) -> StepResult:
        """One optimizer step over a global batch; `watch` adds the log-interval diagnostics."""
        for chunk in self.model:
            chunk.zero_grad_buffer()
        self.optimizer.zero_grad()
        t = self.cfg.training
        losses = self.forward_backward(
            forward_step_func=self._forward_step_for(iteration),
            data_iterator=per_chunk(batches, len(self.model)),
            model=self.model, num_microbatches=self.num_microbatches,
            seq_length=self.cfg.model.seq_length, micro_batch_size=t.micro_batch_size,
            forward_only=False)
        result = StepResult(loss=_reduce_loss(losses), grad_norm=None, applied=False,
                            reason="loss scale overflow")
        before = None

        def accept(grad_norm: float) -> bool:
            nonlocal before
            verdict = self.monitor.judge(result.loss, grad_norm)
            result.reason, result.rollback = verdict.reason, verdict.rollback
            if watch and verdict.apply:  # before clipping rescales the gradients in place
                result.layer_grad_norms = stability.per_layer_grad_norms(
                    self.model, self.optimizer.get_loss_scale().item())
                before = stability.snapshot_parameters(self.model)
            return verdict.apply

        result.applied, result.grad_norm = guarded_step(self.optimizer, accept)
        if result.applied:
            self.scheduler.step(increment=1)
        if before is not None:
            result.update_ratio = stability.update_ratio(self.model, before)
        return result

    def skip_step(self, batches: Iterator) -> StepResult:
        """--iterations-to-skip: the batches are consumed, nothing is computed or updated."""
        for _ in range(self.num_microbatches):
            next(batches)
        return StepResult(loss=float("nan"), grad_norm=None, applied=False,
                          reason="in --iterations-to-skip")

    def rollback(self, iteration: int) -> bool:
        """Reload the last checkpoint and skip `iteration` from now on; False if there is no
        checkpoint to go back to (the update is then just skipped)."""
        self.finish_saves()  # the last checkpoint may still be in flight
        if self.rollback_to is None:
            return False
        skips = set(self.state.iterations_to_skip) | {iteration}
        self._load(dataclasses.replace(self.cfg.checkpoint, load=self.cfg.checkpoint.save,
                                       ckpt_step=self.rollback_to, finetune=False,
                                       no_load_optim=False, no_load_rng=False))
        self.state.iterations_to_skip = sorted(skips | set(self.state.iterations_to_skip))
        print_rank_last(f" rolled back to iteration {self.state.iteration}; iteration "
                        f"{iteration} will be skipped")
        return True

    def _eval_loss(self, dataset: torch.utils.data.Dataset) -> float:
        """Loss over the first --eval-iters global batches: the same ones every time."""
        t = self.cfg.training
        micro = data.eval_micro_batches(t.eval_iters, t.global_batch_size, t.micro_batch_size,
                                        self.dp_rank, self.dp_size)
        for chunk in self.model:
            chunk.eval()
        with torch.no_grad():
            losses = self.forward_backward(
                forward_step_func=self.forward_step,
                data_iterator=per_chunk(data.fixed_batches(dataset, micro), len(self.model)),
                model=self.model, num_microbatches=len(micro),
                seq_length=self.cfg.model.seq_length, micro_batch_size=t.micro_batch_size,
                forward_only=True)
        for chunk in self.model:
            chunk.train()
        return _reduce_loss(losses)

    def evaluate(self) -> float | None:
        if self.cfg.training.eval_iters == 0:
            return None
        loss = self._eval_loss(self.datasets.valid)
        self.log.validation(self.state.iteration, loss)
        return loss

    def update_data_mix(self) -> None:
        """--data-mix dynamic: per-domain validation losses set the weights of the next window,
        which starts at the next sample; the window history is part of the run state."""
        d, s, schedule = self.cfg.data, self.state, self.datasets.schedule
        losses = {name: self._eval_loss(ds) for name, ds in self.datasets.valid_by_domain.items()}
        weights = schedule.update(s.consumed_train_samples, losses, MixingConfig(
            eta=d.data_mix_eta, floor=d.data_mix_floor, smoothing=d.data_mix_smoothing))
        s.data_mix = schedule.state_dict()
        record = {**{f"weight.{n}": w for n, w in zip(schedule.domains, weights, strict=True)},
                  **{f"loss.{n}": v for n, v in losses.items()}}
        print_rank_last(" data mix from sample " f"{s.consumed_train_samples}: " + ", ".join(
            f"{n} {w:.3f} (valid loss {losses[n]:.3f})"
            for n, w in zip(schedule.domains, weights, strict=True)))
        self.log.record("data_mix", s.iteration, **record)
        self.log.scalars({f"data mix/{k}": v for k, v in record.items()}, s.iteration)

    def save(self) -> None:
        self.state.stability = self.monitor.state_dict()
        if self.tuning:
            self.state.lgs_autotune = self.tuning.state_dict()
        record = model_record.record_of(self.cfg, self.datasets.vocab_size)
        started = time.perf_counter()
        path = checkpointing.save_checkpoint(
            self.cfg.checkpoint, self.state, self.model, self.optimizer, self.scheduler, self.lgs,
            self.async_saves, describe=partial(model_record.write, record=record,
                                               tokenizer_file=self.datasets.tokenizer_file))
        seconds = time.perf_counter() - started
        self.rollback_to = self.state.iteration
        if self.async_saves:
            print_rank_last(f" writing checkpoint of iteration {self.state.iteration} to {path} "
                            f"in the background (training held {seconds:.2f} s)")
        self.log.record("save", self.state.iteration, seconds=seconds,
                        asynchronous=self.async_saves is not None)

    def finish_saves(self) -> None:
        """Wait for the checkpoints still being written and commit them (--async-save)."""
        if self.async_saves and self.async_saves.in_flight:
            started = time.perf_counter()
            self.async_saves.wait()
            self.log.record("save_wait", self.state.iteration,
                            seconds=time.perf_counter() - started)

    # -- the loop ------------------------------------------------------------------------------
    def _batches(self) -> Iterator:
        t, s = self.cfg.training, self.state
        sampler = data.MicroBatchSampler(s.consumed_train_samples, self.batch_sizes,
                                         t.micro_batch_size, self.dp_rank, self.dp_size)
        return data.micro_batch_stream(self.datasets.train, sampler, self.cfg.data.num_workers)

    def train(self) -> RunState:
        c, t, s = self.cfg, self.cfg.training, self.state
        batches = self._batches()
        if s.iteration == 0:
            self.evaluate()
        interval = metrics.IntervalStats()
        first_iteration = s.iteration + 1
        if s.iteration >= t.train_iters:  # a finished run requeued, or a lowered --train-iters
            print_rank_last(f" iteration {s.iteration} of the checkpoint is at or past "
                            f"--train-iters {t.train_iters}: nothing left to train")
        while s.iteration < t.train_iters:
            iteration = s.iteration + 1
            if self.tuning:
                self.tuning.before_step()
            started = time.perf_counter()
            batch_size = self.batch_sizes.at(s.consumed_train_samples)  # --rampup-batch-size
            self.num_microbatches = batch_size // (t.micro_batch_size * self.dp_size)
            if iteration in s.iterations_to_skip:
                result = self.skip_step(batches)
            else:
                result = self.train_step(batches, iteration,
                                         watch=iteration % t.log_interval == 0)
            if self.async_saves:  # commit finished background saves (collective, every rank)
                self.async_saves.poll()
            if result.rollback and self.rollback(iteration):
                batches = self._batches()
                continue
            s.iteration = iteration
            s.consumed_train_samples += batch_size
            s.skipped_iterations += 0 if result.applied else 1
            s.nan_iterations += result.reason == "nan"
            step_seconds = self.last_step_seconds = time.perf_counter() - started
            interval.add(result.loss, step_seconds, result.reason == "nan")
            if self.tuning:
                self.tuning.after_step(iteration, step_seconds, result.loss)
            if result.reason:
                print_rank_last(f" iteration {iteration}: {result.reason}; update "
                                f"{'applied' if result.applied else 'skipped'}")
            if s.iteration == first_iteration:  # optimizer state exists only after a step
                self.log.memory(self.model, self.optimizer, s.iteration)
            lr = self.optimizer.param_groups[0]["lr"]
            loss_scale = self.optimizer.get_loss_scale().item()
            self.log.record("train", s.iteration, loss=result.loss, lr=lr,
                            grad_norm=result.grad_norm, skipped=not result.applied,
                            reason=result.reason, loss_scale=loss_scale, **self._mix_weights())
            if self.lgs:
                self.log.record("lgs", s.iteration,
                                **metrics.lgs_record(self.lgs.stats, step_seconds))

            if s.iteration % t.log_interval == 0:
                self.log.interval(s, interval, result, lr, batch_size, loss_scale,
                                  self.monitor.loss_variance(), self.lgs, self.last_step_seconds)
                interval = metrics.IntervalStats()
            if s.iteration % t.eval_interval == 0 or s.iteration == t.train_iters:
                self.evaluate()
            if self.datasets.valid_by_domain and s.iteration % c.data.data_mix_interval == 0:
                self.update_data_mix()
                batches = self._batches()  # loader workers hold the dataset as it was
            stop = self.exit_conditions.reason()
            if stop is None and t.exit_interval and s.iteration % t.exit_interval == 0:
                stop = "--exit-interval"
            save_now = c.checkpoint.save_interval and s.iteration % c.checkpoint.save_interval == 0
            if c.checkpoint.save and (save_now or stop or s.iteration == t.train_iters):
                self.save()
            if stop:
                print_rank_last(f" exiting after iteration {s.iteration}: {stop}")
                break
        self.finish_saves()
        self.log.close()
        return s

    def _mix_weights(self) -> dict[str, float]:
        """The domain weights the last iteration's samples were drawn with."""
        schedule = self.datasets.schedule
        if schedule is None or len(schedule.domains) < 2:
            return {}
        weights = schedule.weights_at(self.state.consumed_train_samples - 1)
        return {f"weight.{n}": w for n, w in zip(schedule.domains, weights, strict=True)}


def build_model_chunks(cfg: Config, model_provider: ModelProvider, platform: Platform,
                       vocab_size: int) -> list[torch.nn.Module]:
    chunks = cfg.parallel.virtual_pipeline_size(cfg.model.num_layers)
    if chunks is None:
        return [model_provider(cfg, platform, vocab_size)]
    return [model_provider(cfg, platform, vocab_size, vp_stage) for vp_stage in range(chunks)]


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
