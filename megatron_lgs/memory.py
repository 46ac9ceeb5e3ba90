"""What each rank holds, measured from the tensors themselves: parameters, gradient buffers and
optimizer state (fp32 main weights where they are separate copies, plus Adam's moments). This is
where ZeRO shows: with the distributed optimizer each data-parallel rank holds 1/DP of the
optimizer state; with Megatron-FSDP's optim_grads_params (ZeRO-3) also 1/DP of the parameters
and gradients (each transformer layer's full weights are all-gathered only while it runs).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist
from megatron.core.distributed.data_parallel_base import _BaseDataParallel
from megatron.core.distributed.fsdp.mcore_fsdp_adapter import FullyShardedDataParallel
from megatron.core.optimizer import MegatronOptimizer

# Optimizer state tensors per main-parameter element, created by torch at the first step.
STATE_TENSORS_PER_PARAM = {"adam": 2, "sgd": 1}


def _local(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of a DTensor (Megatron-FSDP's sharded parameters and state)."""
    return t.to_local() if hasattr(t, "to_local") else t


def _bytes(tensors: Iterable[torch.Tensor]) -> int:
    return sum(_local(t).numel() * _local(t).element_size() for t in tensors)


def _inner_optimizers(optimizer: MegatronOptimizer) -> list[torch.optim.Optimizer]:
    chained = getattr(optimizer, "chained_optimizers", [optimizer])
    return [o.optimizer for o in chained]


def _main_params(optimizer: MegatronOptimizer) -> list[torch.Tensor]:
    return [p for inner in _inner_optimizers(optimizer) for group in inner.param_groups
            for p in group["params"]]


def _moments(optimizer: MegatronOptimizer) -> int:
    return sum(_bytes(v for v in state.values() if isinstance(v, torch.Tensor) and v.dim())
               for inner in _inner_optimizers(optimizer) for state in inner.state.values())


def _fsdp_buffers(model: FullyShardedDataParallel, name: str) -> list[torch.Tensor]:
    groups = model.param_and_grad_buffer.parameter_groups
    return [getattr(g, name).data for g in groups
            if getattr(g, name, None) is not None and getattr(g, name).data is not None]


def _held(model: list[_BaseDataParallel], optimizer: MegatronOptimizer) -> dict[str, int]:
    """Parameters, gradient buffers and separate fp32 main weights this rank stores (all its
    model chunks)."""
    if isinstance(model[0], FullyShardedDataParallel):
        return {name: _bytes(t for chunk in model for t in _fsdp_buffers(chunk, buffer))
                for name, buffer in (("parameters", "model_weight_buffer"),
                                     ("gradients", "main_grad_buffer"),
                                     ("main_weights", "main_weight_buffer"))}
    params = [p for chunk in model for p in chunk.parameters()]
    model_storages = {p.untyped_storage().data_ptr() for p in params}
    return {"parameters": _bytes(params),
            "gradients": _bytes(b.grad_data for chunk in model
                                for b in chunk.buffers + chunk.expert_parallel_buffers),
            "main_weights": _bytes(p for p in _main_params(optimizer)
                                   if p.untyped_storage().data_ptr() not in model_storages)}


def memory_bytes(model: list[_BaseDataParallel], optimizer: MegatronOptimizer) -> dict[str, int]:
    """Bytes on this rank. Optimizer state is created lazily by torch: measure after a step."""
    held = _held(model, optimizer)
    return {"parameters": held["parameters"], "gradients": held["gradients"],
            "optimizer_state": held["main_weights"] + _moments(optimizer)}


def startup_memory_bytes(model: list[_BaseDataParallel], optimizer: MegatronOptimizer,
                         optimizer_name: str) -> dict[str, int]:
    """Before the first step: parameters, gradient buffers and main weights as measured; the
    optimizer's moments as torch will allocate them (fp32, one or two per main weight)."""
    held = _held(model, optimizer)
    per_param = STATE_TENSORS_PER_PARAM[optimizer_name]
    moments = sum(per_param * _local(p).numel() * _local(p).element_size()
                  for p in _main_params(optimizer))
    return {"parameters": held["parameters"], "gradients": held["gradients"],
            "optimizer_state": held["main_weights"] + moments}


def device_memory_bytes() -> dict[str, int] | None:
    """This process's GPU memory as torch's caching allocator counts it (now and peak since
    the start); None off the GPU."""
    if not torch.cuda.is_available():
        return None
    return {"allocated": torch.cuda.memory_allocated(),
            "max_allocated": torch.cuda.max_memory_allocated(),
            "reserved": torch.cuda.memory_reserved(),
            "max_reserved": torch.cuda.max_memory_reserved()}


def device_memory_log_line(per_rank: list[dict[str, int]], iteration: int) -> str:
    """Megatron-LM's report_memory line, for the rank with the highest peak."""
    worst = max(range(len(per_rank)), key=lambda r: per_rank[r]["max_allocated"])
    m = {k: v / 2**20 for k, v in per_rank[worst].items()}
    return (f" [Rank {worst}] (after {iteration} iterations) memory (MB) | allocated: "
            f"{m['allocated']:.1f} | max allocated: {m['max_allocated']:.1f} | reserved: "
            f"{m['reserved']:.1f} | max reserved: {m['max_reserved']:.1f}")


def gather(mine: dict[str, int]) -> list[dict[str, int]]:
    """Every rank's numbers, in rank order (collective)."""
    everyone: list[dict[str, int]] = [{} for _ in range(dist.get_world_size())]
    dist.all_gather_object(everyone, mine)
    return everyone


def gather_memory(model: list[_BaseDataParallel],
                  optimizer: MegatronOptimizer) -> list[dict[str, int]]:
    return gather(memory_bytes(model, optimizer))


def memory_log_line(per_rank: list[dict[str, int]], when: str = "") -> str:
    def mb(key: str) -> str:
        values = [r[key] / 2**20 for r in per_rank]
        return f"{min(values):.2f}..{max(values):.2f}" if len(set(values)) > 1 \
            else f"{values[0]:.2f}"
    return (f" memory per rank{when} (MB): parameters {mb('parameters')} | gradients "
            f"{mb('gradients')} | optimizer state {mb('optimizer_state')} |")
