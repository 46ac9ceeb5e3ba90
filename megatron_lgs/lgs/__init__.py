"""Layer-wise gradient sync: cost model, step simulator and threshold memory wall.

All simulator figures are predictions of an alpha-beta model, never measurements.
"""

from megatron_lgs.lgs.costmodel import (
    PROFILES,
    HardwareProfile,
    HierarchicalCost,
    Link,
    all_gather_time,
    custom,
    get_profile,
    hierarchical_allreduce,
    nccl_allreduce_busbw,
    reduce_scatter_time,
    ring_allreduce_time,
    tree_allreduce_time,
)
from megatron_lgs.lgs.memwall import MemoryWall, memory_wall
from megatron_lgs.lgs.timeline import StepPrediction, Thresholds, Workload, predict_step
from megatron_lgs.lgs.workload import Layout, ModelConfig

__all__ = [
    "PROFILES",
    "HardwareProfile",
    "HierarchicalCost",
    "Layout",
    "Link",
    "MemoryWall",
    "ModelConfig",
    "StepPrediction",
    "Thresholds",
    "Workload",
    "all_gather_time",
    "custom",
    "get_profile",
    "hierarchical_allreduce",
    "memory_wall",
    "nccl_allreduce_busbw",
    "predict_step",
    "reduce_scatter_time",
    "ring_allreduce_time",
    "tree_allreduce_time",
]
