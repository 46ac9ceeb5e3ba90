"""The `--lgs*` flags as one dataclass (parsed with the trainer's other flags)."""

from __future__ import annotations

from dataclasses import dataclass

COMPRESSIONS = ("none", "int8")


@dataclass(frozen=True)
class LgsConfig:
    lgs: bool = False
    # The seed's hand-picked values for 100B on 8-GPU A100 nodes (seeds/000): a bucket is synced
    # once it holds this many bytes (intra-node hop), and inter-node messages are at most the
    # inter threshold. `auto` asks the cost model instead.
    lgs_intra_threshold_mb: float = 160.0
    lgs_inter_threshold_mb: float = 24.0
    lgs_thresholds: str = "manual"
    lgs_hardware: str | None = None  # cost-model profile for `auto`; default: from the GPU
    lgs_layer_weighting: str = "params"
    lgs_memory_cap_mb: float | None = None
    lgs_split_large_tensors: bool = False
    lgs_gpus_per_node: int | None = None  # default: LOCAL_WORLD_SIZE / SLURM_NTASKS_PER_NODE
    lgs_compress: str = "none"
    lgs_compress_block: int = 256  # values per INT8 scale
    lgs_trace_dir: str | None = None
    lgs_trace_steps: int = 5
    lgs_autotune: bool = False
    lgs_autotune_min_mb: float = 8.0
    lgs_autotune_max_mb: float = 256.0
    lgs_autotune_inter_min_mb: float | None = None  # None: --lgs-autotune-min-mb
    lgs_autotune_inter_max_mb: float | None = None  # None: --lgs-autotune-max-mb
    lgs_autotune_throughput_margin: float = 0.03
    lgs_autotune_loss_margin: float = 0.005
