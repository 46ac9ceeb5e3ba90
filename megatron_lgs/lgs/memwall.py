"""The memory wall: the largest bucket threshold that still fits beside the model's states.

Per GPU of the heaviest stage: bf16 params, fp32 gradient buffer, and Adam's fp32 master
weights + two moments (12 bytes/param) sharded ZeRO-1 over the (expert-)DP group; activations
as the whole-step model counts them (`stepmemory.activation_bytes`: sequence parallel, fused
attention unless told otherwise, 1F1B's in-flight micro-batches, the last stage's FP32
logits), so the LGS recommendation and the planner share one memory model. A threshold T
costs 2T of staging buffers (the bucket being reduced plus the one filling behind it); a
fraction of memory is reserved for the allocator, NCCL and workspace.
"""

from __future__ import annotations

from dataclasses import dataclass

from megatron_lgs.lgs import stepmemory
from megatron_lgs.lgs.runspec import Run, layout_fields, model_fields
from megatron_lgs.lgs.workload import (
    DENSE,
    EXPERT,
    Layout,
    ModelConfig,
    stage_backward,
    stage_numel,
)

OPTIMIZER_BYTES_PER_PARAM = 12


@dataclass(frozen=True)
class MemoryWall:
    memory_bytes: float
    states_bytes: float
    activation_bytes: float
    reserved_bytes: float
    headroom_bytes: float
    largest_threshold_bytes: float

    def largest_on_grid(self, grid_bytes: list[int]) -> int | None:
        fits = [t for t in grid_bytes if t <= self.largest_threshold_bytes]
        return max(fits) if fits else None


def states_bytes(model: ModelConfig, lay: Layout) -> float:
    """Params + grads + ZeRO-1-sharded optimizer state per GPU, heaviest stage."""
    worst = 0.0
    for k in range(lay.pp):
        n = stage_numel(stage_backward(model, lay, k))
        total = n[DENSE] + n[EXPERT]
        opt = OPTIMIZER_BYTES_PER_PARAM * (n[DENSE] / lay.dp + n[EXPERT] / lay.expert_dp)
        worst = max(worst, total * (lay.param_bytes + lay.grad_bytes) + opt)
    return worst


def activation_bytes(model: ModelConfig, lay: Layout, selective_recompute: bool = False,
                     flash_attention: bool = True) -> float:
    """Activations of the heaviest pipeline stage, one GPU (`stepmemory.activation_bytes`;
    the GPU type does not enter it)."""
    r = Run(id="memwall", gpu="a100-80gb", **model_fields(model), **layout_fields(model, lay),
            recompute="selective" if selective_recompute else "none",
            flash_attention=flash_attention)
    return max(stepmemory.activation_bytes(r, k) for k in range(lay.pp))


def memory_wall(model: ModelConfig, lay: Layout, memory_bytes: float,
                selective_recompute: bool = False, reserve_fraction: float = 0.1) -> MemoryWall:
    """Largest threshold T with states + activations + 2T <= (1 - reserve) x memory."""
    if not 0 <= reserve_fraction < 1:
        raise ValueError(f"reserve_fraction must be in [0, 1), got {reserve_fraction}")
    st = states_bytes(model, lay)
    act = activation_bytes(model, lay, selective_recompute)
    reserved = reserve_fraction * memory_bytes
    headroom = memory_bytes - reserved - st - act
    return MemoryWall(memory_bytes, st, act, reserved, headroom, max(0.0, headroom / 2))
