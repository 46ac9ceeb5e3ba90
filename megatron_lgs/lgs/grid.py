"""The threshold grid the simulator and the start-up recommendation search (predictions).

Kept out of `simulate` (the CLI) so importing the package never imports a `__main__` module.
"""

from __future__ import annotations

from dataclasses import dataclass

from megatron_lgs.lgs.memwall import MemoryWall, memory_wall
from megatron_lgs.lgs.timeline import MB, StepPrediction, Thresholds, Workload, predict_step

GRID_MB = [8, 16, 32, 64, 128, 256]


@dataclass(frozen=True)
class GridResult:
    predictions: tuple[StepPrediction, ...]
    best: StepPrediction
    wall: MemoryWall


def preference(p: StepPrediction) -> tuple[float, int, int]:
    """Sort key of plans: faster first (to the ns), ties to the smaller thresholds."""
    return round(p.step_time_s, 9), p.thresholds.intra_bytes, p.thresholds.inter_bytes


def sweep(w: Workload, grid_mb: list[int] = GRID_MB,
          inter_grid_mb: list[int] | None = None) -> GridResult:
    """Predict every (intra, inter) pair of `grid_mb` x `inter_grid_mb` (None: `grid_mb`);
    the best is the fastest, ties to smaller thresholds."""
    inter_grid_mb = grid_mb if inter_grid_mb is None else inter_grid_mb
    for g in (grid_mb, inter_grid_mb):
        if not g or min(g) <= 0:
            raise ValueError(f"grid must hold positive MB values, got {g}")
    preds = tuple(predict_step(w, Thresholds(i * MB, e * MB))
                  for i in grid_mb for e in inter_grid_mb)
    best = min(preds, key=preference)
    wall = memory_wall(w.model, w.layout, w.hw.memory_bytes)
    return GridResult(preds, best, wall)


