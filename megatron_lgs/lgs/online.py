"""Thresholds while training: the cost model's pick at start-up (`--lgs-thresholds auto`) and
the online auto-tuner (`--lgs-autotune`), applied to a running LGS engine.

The tuner runs on rank 0 only (its inputs, step times, differ per rank); every step boundary
rank 0 broadcasts the thresholds the next step runs with, and the engine regroups its buckets
(never the fine layout, so never the distributed optimizer's shards).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

from megatron_lgs.lgs import calibrate
from megatron_lgs.lgs.config import LgsConfig
from megatron_lgs.lgs.hardware import MEASURED
from megatron_lgs.lgs.recommend import profile_for_device, recommend_for_config
from megatron_lgs.lgs.sync import LgsEngine
from megatron_lgs.lgs.tuner import ThresholdTuner, TunerConfig, describe
from megatron_lgs.platform import get_platform


def start_thresholds(cfg, engine: LgsEngine, log: Callable[[str], None]) -> None:
    """--lgs-thresholds auto: the simulator's best grid point for this layout and hardware."""
    lgs: LgsConfig = cfg.lgs
    if lgs.lgs_thresholds != "auto":
        return
    device = torch.cuda.get_device_name() if engine.cuda else None
    profile = lgs.lgs_hardware or profile_for_device(device)
    if profile == MEASURED:
        from megatron_lgs.platform import get_platform

        profile, measurements = calibrate.measure_profile(
            cfg, get_platform(), calibrate.job_levels(cfg, engine.per_node))
        log(" LGS " + calibrate.describe(profile, measurements))
    rec = recommend_for_config(cfg, engine.per_node, profile)
    engine.set_thresholds(rec.intra_mb, rec.inter_mb)
    p = rec.prediction
    log(f" LGS thresholds from the cost model ({rec.profile}): intra {rec.intra_mb} MB, inter "
        f"{rec.inter_mb} MB; predicted step {p.step_time_s:.3g} s, exposed communication "
        f"{1000 * p.exposed_comm_s:.1f} ms (a prediction)"
        + ("" if rec.fits_memory else "; no threshold fits the memory wall, smallest kept"))


def _same_buffers_everywhere(engine: LgsEngine) -> bool:
    """Whether every rank groups the same gradients (collective): only then can rank 0's plans
    tell for all whether a threshold changes anything (with pipeline or expert parallelism the
    ranks hold different layers)."""
    mine = [(bs.key, bs.levels.nodes, bs.levels.per_node,
             [(u.layer, u.units, u.unit_bytes) for u in bs.units]) for bs in engine.buffers]
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    return all(x == everyone[0] for x in everyone)


class OnlineTuning:
    """The auto-tuner around an engine: ask before a step, report after it."""

    def __init__(self, lgs: LgsConfig, engine: LgsEngine, log: Callable[[str], None]) -> None:
        self.engine = engine
        self.log = log
        self.config = TunerConfig(min_mb=lgs.lgs_autotune_min_mb, max_mb=lgs.lgs_autotune_max_mb,
                                  throughput_margin=lgs.lgs_autotune_throughput_margin,
                                  loss_margin=lgs.lgs_autotune_loss_margin,
                                  inter_min_mb=lgs.lgs_autotune_inter_min_mb,
                                  inter_max_mb=lgs.lgs_autotune_inter_max_mb)
        bounds = [self.config.bounds(level) for level in range(2)]
        start = tuple(min(max(mb, lo), hi)
                      for mb, (lo, hi) in zip(engine.thresholds_mb(), bounds, strict=True))
        everywhere = _same_buffers_everywhere(engine)
        self.tuner = ThresholdTuner(
            start, self.config,
            (lambda a, b: engine.plan_key(*a) == engine.plan_key(*b)) if everywhere else None,
        ) if dist.get_rank() == 0 else None
        self.done = False

    def before_step(self) -> None:
        """Every rank applies the thresholds rank 0's tuner wants for the next step."""
        if self.done:
            return
        message = torch.zeros(3, dtype=torch.float64, device=get_platform().device)
        if self.tuner is not None:
            message[:2] = torch.tensor(self.tuner.thresholds(), dtype=torch.float64)
            message[2] = float(self.tuner.done)
        dist.broadcast(message, src=0)
        intra, inter, done = message.tolist()
        if (intra, inter) != self.engine.thresholds_mb():
            self.engine.set_thresholds(intra, inter)
        self.done = bool(done)

    def after_step(self, iteration: int, step_seconds: float, loss: float) -> list[dict]:
        """Feed rank 0's tuner; returns the decisions this step produced (rank 0 only)."""
        if self.tuner is None or self.tuner.done:
            return []
        before = len(self.tuner.decisions)
        self.tuner.record(iteration, step_seconds, loss)
        new = self.tuner.decisions[before:]
        for decision in new:
            self.log(" " + describe(decision))
        if self.tuner.done and new:
            intra, inter = self.tuner.best
            self.log(f" lgs-autotune finished: intra {intra:g} MB, inter {inter:g} MB")
        return new

    def state_dict(self) -> dict:
        return {} if self.tuner is None else self.tuner.state_dict()

    def load_state_dict(self, state: dict) -> None:
        if self.tuner is not None and state:
            try:
                self.tuner.load_state_dict(state)
            except ValueError as exc:
                raise ValueError(f"--lgs-autotune: {exc}") from None
