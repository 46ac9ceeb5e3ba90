"""Data parallelism, optimizer and learning-rate schedule, all megatron-core's own.

DDP owns the contiguous gradient buffers and their buckets; with `--use-distributed-optimizer`
gradients are reduce-scattered and each data-parallel rank keeps only its shard of the fp32
main weights and Adam moments (ZeRO-1/2). `--use-megatron-fsdp` wraps the model in
Megatron-FSDP instead, which with `optim_grads_params` shards the parameters too (ZeRO-3) and
all-gathers each transformer layer's weights just before they are used.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from megatron.core import parallel_state
from megatron.core.distributed import (
    DistributedDataParallel,
    DistributedDataParallelConfig,
    finalize_model_grads,
)
from megatron.core.distributed.data_parallel_base import _BaseDataParallel
from megatron.core.distributed.fsdp.mcore_fsdp_adapter import FullyShardedDataParallel
from megatron.core.optimizer import ChainedOptimizer, MegatronOptimizer, get_megatron_optimizer
from megatron.core.optimizer import OptimizerConfig as MegatronOptimizerConfig
from megatron.core.optimizer.clip_grads import clip_grad_by_total_norm_fp32
from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

from megatron_lgs import fsdp_checkpoint
from megatron_lgs.lgs import sync
from megatron_lgs.lgs.finebuffer import fine_bucket_size
from megatron_lgs.lgs.plan import PlanError
from megatron_lgs.model import params_dtype
from megatron_lgs.platform import get_platform
from megatron_lgs.run_config import Config, ConfigError, warmup_iters


def wrap_ddp(cfg: Config, chunks: list[torch.nn.Module],
             log: Callable[[str], None] = print) -> list[_BaseDataParallel]:
    """One DDP per model chunk; as in Megatron-LM, chunks after the first are not bucketed
    (their gradients are ready only at the very end of the interleaved backward). With --lgs,
    one layer-wise engine takes over the gradient sync of all chunks."""
    o = cfg.optim
    platform = get_platform()
    ddp_config = DistributedDataParallelConfig(
        # Megatron-LM accumulates and reduces half-precision grads in fp32 by default.
        grad_reduce_in_fp32=cfg.precision.bf16 or cfg.precision.fp16,
        # LGS needs the backward hooks' grad-ready signals and small buffer buckets (the fine
        # layout its plan groups).
        overlap_grad_reduce=o.overlap_grad_reduce or cfg.lgs.lgs,
        overlap_param_gather=o.overlap_param_gather,
        use_distributed_optimizer=o.distributed_optimizer,
        num_distributed_optimizer_instances=o.num_distributed_optimizer_instances,
        reduce_scatter_with_fp32_accumulation=o.reduce_scatter_with_fp32_accumulation,
        bucket_size=fine_bucket_size(
            parallel_state.get_data_parallel_world_size(with_context_parallel=True),
            o.use_distributed_optimizer) if cfg.lgs.lgs else o.ddp_bucket_size,
        # Non-finite grads must reach the step: FP16 backs off its loss scale on them, and the
        # stability monitor skips and counts the update (megatron's check would abort the run).
        check_for_nan_in_grad=False,
        use_megatron_fsdp=o.use_megatron_fsdp,
        data_parallel_sharding_strategy=o.data_parallel_sharding_strategy,
        # Megatron-FSDP folds the 1/DP into its reduce-scatter as NCCL's PREMUL_SUM, which gloo
        # does not have; on CPU it divides after a plain sum.
        gradient_reduce_div_fusion=platform.is_cuda,
    )
    if o.use_megatron_fsdp:
        wrapped = []
        for chunk in chunks:
            mapping = fsdp_checkpoint.record_mapping(chunk)  # before the wrapper shards it
            fsdp = FullyShardedDataParallel(chunk.config, ddp_config, chunk,
                                            device=None if platform.is_cuda else platform.device)
            setattr(fsdp, fsdp_checkpoint.MAPPING_ATTR, mapping)
            wrapped.append(fsdp)
        return wrapped
    ddps = [DistributedDataParallel(chunk.config, ddp_config, chunk, disable_bucketing=i > 0)
            for i, chunk in enumerate(chunks)]
    if cfg.lgs.lgs:
        try:
            sync.install(ddps, sync.LgsEngine(ddps, cfg.lgs, log=log))
        except PlanError as exc:
            raise ConfigError(str(exc)) from None
    return ddps


def build_optimizer(cfg: Config, model: list[_BaseDataParallel]) -> MegatronOptimizer:
    o, p = cfg.optim, cfg.precision
    config = MegatronOptimizerConfig(
        optimizer=o.optimizer,
        lr=o.lr,
        min_lr=o.min_lr,
        weight_decay=o.weight_decay,
        adam_beta1=o.adam_beta1,
        adam_beta2=o.adam_beta2,
        adam_eps=o.adam_eps,
        sgd_momentum=o.sgd_momentum,
        clip_grad=o.clip_grad,
        bf16=p.bf16,
        fp16=p.fp16,
        params_dtype=params_dtype(cfg),
        loss_scale=p.loss_scale,
        initial_loss_scale=p.initial_loss_scale,
        min_loss_scale=p.min_loss_scale,
        loss_scale_window=p.loss_scale_window,
        hysteresis=p.hysteresis,
        use_distributed_optimizer=o.distributed_optimizer,
        overlap_param_gather=o.overlap_param_gather,
        optimizer_cpu_offload=o.optimizer_cpu_offload,
        optimizer_offload_fraction=o.optimizer_offload_fraction if o.optimizer_cpu_offload
        else 0.0,
    )
    return get_megatron_optimizer(config, model)


def build_scheduler(cfg: Config, optimizer: MegatronOptimizer) -> OptimizerParamScheduler:
    """Megatron's scheduler, stepped once per iteration (Megatron steps it in samples; with a
    fixed global batch the two are the same schedule)."""
    o = cfg.optim
    decay_iters = o.lr_decay_iters or cfg.training.train_iters
    return OptimizerParamScheduler(
        optimizer,
        init_lr=0.0 if warmup_iters(cfg) else o.lr,
        max_lr=o.lr,
        min_lr=o.min_lr,
        lr_warmup_steps=warmup_iters(cfg),
        lr_decay_steps=decay_iters,
        lr_decay_style=o.lr_decay_style,
        start_wd=o.weight_decay,
        end_wd=o.weight_decay,
        wd_incr_steps=decay_iters,
        wd_incr_style="constant",
        wsd_decay_steps=o.lr_wsd_decay_iters,
        lr_wsd_decay_style=o.lr_wsd_decay_style,
    )


def attach_schedule_hooks(cfg: Config, model: list[_BaseDataParallel],
                          optimizer: MegatronOptimizer) -> None:
    """What megatron's forward_backward_func reads from the model config: loss scaling, the
    no-sync context for all but the last micro-batch, and the end-of-backward grad reduction."""
    config = model[0].config  # the chunks share one TransformerConfig
    config.grad_scale_func = optimizer.scale_loss
    config.finalize_model_grads_func = finalize_model_grads
    # Megatron-LM's form: one hook, or a list with one per chunk for the interleaved schedule.
    if cfg.optim.overlap_grad_reduce or cfg.lgs.lgs:
        no_sync = [chunk.no_sync for chunk in model]
        config.no_sync_func = no_sync[0] if len(no_sync) == 1 else no_sync
    if cfg.optim.overlap_param_gather:
        param_sync = [chunk.start_param_sync for chunk in model]
        config.param_sync_func = param_sync[0] if len(param_sync) == 1 else param_sync


def guarded_step(optimizer: ChainedOptimizer | MegatronOptimizer,
                 accept: Callable[[float], bool]) -> tuple[bool, float | None]:
    """megatron-core 0.16.1's ChainedOptimizer.step with a veto: between measuring the global
    gradient norm and touching any weight, `accept(grad_norm)` may refuse the update.
    Returns (applied, grad_norm); grad_norm is None when FP16 overflowed (the loss scaler has
    then already backed off, exactly as in megatron's own step)."""
    if optimizer.prepare_grads():
        return False, None
    grad_norm = optimizer.get_grad_norm()
    if not accept(grad_norm):
        return False, grad_norm
    # Megatron-FSDP gets one DistributedOptimizer, not a chain.
    for inner in getattr(optimizer, "chained_optimizers", [optimizer]):
        parameters = inner.get_parameters()
        if parameters and inner.config.clip_grad > 0.0:
            clip_grad_by_total_norm_fp32(parameters, max_norm=inner.config.clip_grad,
                                         total_norm=grad_norm)
    return optimizer.step_with_ready_grads(), grad_norm
