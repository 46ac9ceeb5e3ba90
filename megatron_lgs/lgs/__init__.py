"""Layer-wise gradient sync: the engine on megatron-core's DDP (plan, sync, compress), the cost
model, step simulator, threshold memory wall, start-up recommendation and online auto-tuner;
the whole-step model (`stepmodel`, `predict`) and the layout planner (`planner`, `plan_run`).

All simulator figures are predictions of an alpha-beta model, never measurements.
"""

from megatron_lgs.lgs.baselines import Plan, baseline_plans, megatron_default, predict_plan
from megatron_lgs.lgs.compress import dequantize, quantize, quantize_with_feedback
from megatron_lgs.lgs.config import LgsConfig
from megatron_lgs.lgs.costmodel import (
    HardwareProfile,
    HierarchicalCost,
    Link,
    all_gather_time,
    custom,
    hierarchical_allreduce,
    inter_node_allreduce_time,
    nccl_allreduce_busbw,
    reduce_scatter_time,
    ring_allreduce_time,
    tree_allreduce_time,
)
from megatron_lgs.lgs.finebuffer import fine_bucket_size
from megatron_lgs.lgs.gpus import GPUS, PROFILES, GpuProfile, get_gpu, get_profile
from megatron_lgs.lgs.memwall import MemoryWall, memory_wall
from megatron_lgs.lgs.plan import BucketPlan, PlanConfig, PlanError, Unit, make_plan
from megatron_lgs.lgs.recommend import (
    DEFAULT_PROFILE,
    Recommendation,
    profile_for_device,
    recommend,
    recommend_for_config,
    recommend_thresholds,
    workload_for,
    workload_for_config,
)
from megatron_lgs.lgs.runspec import Run, RunError, run_from_dict
from megatron_lgs.lgs.stepmodel import StepEstimate, predict_run
from megatron_lgs.lgs.sync import LgsEngine, StepStats, install
from megatron_lgs.lgs.timeline import StepPrediction, Thresholds, Workload, predict_step
from megatron_lgs.lgs.tuner import ThresholdTuner, TunerConfig, describe
from megatron_lgs.lgs.workload import Layout, ModelConfig

__all__ = [
    "GPUS",
    "GpuProfile",
    "Run",
    "RunError",
    "StepEstimate",
    "get_gpu",
    "predict_run",
    "run_from_dict",
    "BucketPlan",
    "LgsConfig",
    "LgsEngine",
    "PlanConfig",
    "PlanError",
    "StepStats",
    "Unit",
    "dequantize",
    "fine_bucket_size",
    "install",
    "make_plan",
    "quantize",
    "quantize_with_feedback",
    "DEFAULT_PROFILE",
    "PROFILES",
    "HardwareProfile",
    "HierarchicalCost",
    "Layout",
    "Link",
    "MemoryWall",
    "ModelConfig",
    "Plan",
    "Recommendation",
    "StepPrediction",
    "ThresholdTuner",
    "Thresholds",
    "TunerConfig",
    "Workload",
    "all_gather_time",
    "baseline_plans",
    "custom",
    "describe",
    "get_profile",
    "hierarchical_allreduce",
    "inter_node_allreduce_time",
    "megatron_default",
    "memory_wall",
    "nccl_allreduce_busbw",
    "predict_plan",
    "predict_step",
    "profile_for_device",
    "recommend",
    "recommend_for_config",
    "recommend_thresholds",
    "reduce_scatter_time",
    "ring_allreduce_time",
    "tree_allreduce_time",
    "workload_for",
    "workload_for_config",
]
