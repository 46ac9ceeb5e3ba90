"""What each rank holds, measured from the tensors themselves: parameters, gradient buffers and
optimizer state (fp32 main weights where they are separate copies, plus Adam's moments). This is
where ZeRO shows: with the distributed optimizer each data-parallel rank holds 1/DP of the state.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist
from megatron.core.distributed import DistributedDataParallel
from megatron.core.optimizer import MegatronOptimizer


def _bytes(tensors: Iterable[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _inner_optimizers(optimizer: MegatronOptimizer) -> list[torch.optim.Optimizer]:
    chained = getattr(optimizer, "chained_optimizers", [optimizer])
    return [o.optimizer for o in chained]


def memory_bytes(model: list[DistributedDataParallel],
                 optimizer: MegatronOptimizer) -> dict[str, int]:
    """Bytes on this rank (all its model chunks). Optimizer state is created lazily by torch:
    measure after a step."""
    params = [p for chunk in model for p in chunk.parameters()]
    grads = _bytes(buffer.grad_data for chunk in model
                   for buffer in chunk.buffers + chunk.expert_parallel_buffers)
    model_storages = {p.untyped_storage().data_ptr() for p in params}
    main_weights, moments = 0, 0
    for inner in _inner_optimizers(optimizer):
        for group in inner.param_groups:
            for p in group["params"]:
                if p.untyped_storage().data_ptr() not in model_storages:
                    main_weights += _bytes([p])
        for state in inner.state.values():
            moments += _bytes(v for v in state.values() if isinstance(v, torch.Tensor))
    return {"parameters": _bytes(params), "gradients": grads,
            "optimizer_state": main_weights + moments}


def gather_memory(model: list[DistributedDataParallel],
                  optimizer: MegatronOptimizer) -> list[dict[str, int]]:
    """Every rank's numbers, in rank order (collective)."""
    mine = memory_bytes(model, optimizer)
    everyone: list[dict[str, int]] = [{} for _ in range(dist.get_world_size())]
    dist.all_gather_object(everyone, mine)
    return everyone


def memory_log_line(per_rank: list[dict[str, int]]) -> str:
    def mb(key: str) -> str:
        values = [r[key] / 2**20 for r in per_rank]
        return f"{min(values):.2f}..{max(values):.2f}" if len(set(values)) > 1 \
            else f"{values[0]:.2f}"
    return (f" memory per rank (MB): parameters {mb('parameters')} | gradients "
            f"{mb('gradients')} | optimizer state {mb('optimizer_state')} |")
