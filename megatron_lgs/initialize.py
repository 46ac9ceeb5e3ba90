"""Process groups and seeds: torch.distributed from torchrun/Slurm env (or one process without
them), megatron-core parallel_state from the configured sizes, and the model-parallel RNG."""

from __future__ import annotations

import os
import socket
from datetime import timedelta

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.rerun_state_machine import RerunMode, initialize_rerun_state_machine
from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

from megatron_lgs.platform import Platform
from megatron_lgs.run_config import Config, ConfigError


def check_platform(cfg: Config, platform: Platform) -> None:
    """Flags this machine cannot honour: refused here, before any process group starts."""
    if cfg.precision.fp8_format is not None and not platform.te_available:
        raise ConfigError(
            f"--fp8-format {cfg.precision.fp8_format} needs Transformer Engine on a GPU, "
            f"and it cannot run here ({platform.te_error}); refusing to train in BF16 instead"
        )
    if cfg.model.transformer_impl == "transformer_engine" and not platform.te_available:
        raise ConfigError(
            f"--transformer-impl transformer_engine: Transformer Engine cannot run here "
            f"({platform.te_error})"
        )
    if cfg.model.moe_grouped_gemm and not platform.te_available:
        raise ConfigError("--moe-grouped-gemm needs Transformer Engine's grouped GEMM, which "
                          f"cannot run here ({platform.te_error}); experts run as separate MLPs "
                          "without it")
    if cfg.model.num_experts and cfg.model.add_bias_linear and not platform.te_available:
        raise ConfigError("MoE experts with linear biases fail in megatron-core 0.16.1's local "
                          "expert MLP (an in-place update of an autograd view); add "
                          "--disable-bias-linear, as MoE configs usually do")
    if (cfg.model.num_experts and cfg.model.moe_token_dispatcher_type == "alltoall"
            and cfg.parallel.expert_tp > 1 and platform.backend == "gloo"):
        raise ConfigError("the alltoall dispatcher with expert tensor parallelism > 1 gathers "
                          "unequal token counts over the expert-TP group, which gloo cannot; "
                          "add --expert-tensor-parallel-size 1 or use the allgather dispatcher")
    if cfg.optim.optimizer_cpu_offload and not platform.is_cuda:
        raise ConfigError("--optimizer-cpu-offload moves optimizer state from GPU memory to "
                          "host memory; this run has no GPU, so its optimizer state already "
                          "lives in host memory")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_distributed(cfg: Config, platform: Platform) -> None:
    """Join (or, as a lone process, create) the default group and megatron's parallel groups."""
    if not dist.is_initialized():
        rank = int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", 0)))
        world = cfg.parallel.world_size
        if world == 1 and "MASTER_PORT" not in os.environ:
            os.environ["MASTER_ADDR"] = "127.0.0.1"
            os.environ["MASTER_PORT"] = str(_free_port())
        if platform.is_cuda:
            local_rank = int(os.environ.get("LOCAL_RANK", os.environ.get("SLURM_LOCALID", 0)))
            torch.cuda.set_device(local_rank)
        dist.init_process_group(
            backend=platform.backend, rank=rank, world_size=world,
            timeout=timedelta(minutes=10),
        )
    initialize_rerun_state_machine(mode=RerunMode.DISABLED)
    init_model_parallel(cfg)


def init_model_parallel(cfg: Config) -> None:
    """megatron-core's parallel groups for the configured sizes (the process group exists)."""
    par = cfg.parallel
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=par.tensor_model_parallel_size,
        pipeline_model_parallel_size=par.pipeline_model_parallel_size,
        context_parallel_size=par.context_parallel_size,
        expert_model_parallel_size=par.expert_model_parallel_size,
        expert_tensor_parallel_size=par.expert_tensor_parallel_size,
        virtual_pipeline_model_parallel_size=par.virtual_pipeline_size(cfg.model.num_layers),
        num_distributed_optimizer_instances=cfg.optim.num_distributed_optimizer_instances,
    )


def set_seeds(seed: int) -> None:
    """Megatron's scheme for the random streams of the run (dropout): the data-parallel seed
    differs per pipeline stage, and the tracker derives tensor- and expert-parallel seeds from
    it. Initial weights do not come from these streams (init_weights)."""
    seed = seed + 100 * parallel_state.get_pipeline_model_parallel_rank()
    torch.manual_seed(seed)
    model_parallel_cuda_manual_seed(seed)


def destroy() -> None:
    parallel_state.destroy_model_parallel()
    if dist.is_initialized():
        dist.destroy_process_group()
