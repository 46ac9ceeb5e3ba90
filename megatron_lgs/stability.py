"""Keeping a run healthy: which updates to refuse, and what to watch.

Every step, after the gradients are reduced and before any weight changes, `StabilityMonitor`
judges the step from its loss and global gradient norm:
- a NaN/Inf loss or gradient norm is never applied (counted as a NaN iteration);
- a loss spike (z-score of the loss against a sliding window of accepted losses) or a gradient
  norm spike (a multiple of the window's median) triggers the configured action: `log`,
  `skip` (drop the update, OLMo-style) or `rollback` (reload the last checkpoint and skip the
  offending iteration from then on).
At the log interval it reports per-layer gradient norms, the update/parameter ratio and the
windowed loss variance, and prints the seed's alert thresholds as warnings.
"""

from __future__ import annotations

import math
import re
import statistics
from collections import deque
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.distributed.fsdp.mcore_fsdp_adapter import FullyShardedDataParallel
from megatron.core.tensor_parallel import param_is_not_tensor_parallel_duplicate
from megatron.core.utils import unwrap_model

from megatron_lgs.platform import get_platform

# Alert thresholds from the monitoring guide (seeds/001): outside these, print a warning.
GRAD_NORM_RANGE = (1e-3, 1e2)
UPDATE_RATIO_RANGE = (1e-6, 1e-2)
LOSS_VARIANCE_LIMIT = 0.5


@dataclass(frozen=True)
class StabilityConfig:
    spike_action: str = "log"  # log | skip | rollback
    spike_window: int = 50
    spike_zscore: float = 6.0
    grad_norm_spike_factor: float = 10.0
    # Test-only hooks: poison the loss (or only the gradients) of one iteration.
    inject_nan_at: int | None = None
    inject_inf_grad_at: int | None = None
    inject_spike_at: int | None = None
    inject_spike_scale: float = 1e3


@dataclass
class Verdict:
    apply: bool
    reason: str | None = None  # "nan", "loss spike", "grad norm spike"
    rollback: bool = False


@dataclass
class StabilityMonitor:
    """Decides per step; its window is part of the run state so a resume decides the same."""

    cfg: StabilityConfig
    losses: deque = field(default_factory=deque)
    grad_norms: deque = field(default_factory=deque)

    def judge(self, loss: float, grad_norm: float) -> Verdict:
        if not (math.isfinite(loss) and math.isfinite(grad_norm)):
            return Verdict(apply=False, reason="nan")
        reason = self._spike(loss, grad_norm)
        if reason is None or self.cfg.spike_action == "log":
            self._remember(loss, grad_norm)
            return Verdict(apply=True, reason=reason)
        return Verdict(apply=False, reason=reason, rollback=self.cfg.spike_action == "rollback")

    def _spike(self, loss: float, grad_norm: float) -> str | None:
        if len(self.losses) < max(2, self.cfg.spike_window // 2):
            return None  # too little history to call anything a spike
        mean, std = statistics.fmean(self.losses), statistics.pstdev(self.losses)
        if (loss - mean) / max(std, 1e-3 * abs(mean), 1e-8) > self.cfg.spike_zscore:
            return "loss spike"
        if grad_norm > self.cfg.grad_norm_spike_factor * statistics.median(self.grad_norms):
            return "grad norm spike"
        return None

    def _remember(self, loss: float, grad_norm: float) -> None:
        for window, value in ((self.losses, loss), (self.grad_norms, grad_norm)):
            window.append(value)
            if len(window) > self.cfg.spike_window:
                window.popleft()

    def loss_variance(self) -> float:
        return statistics.pvariance(self.losses) if len(self.losses) > 1 else 0.0

    def state_dict(self) -> dict:
        return {"losses": list(self.losses), "grad_norms": list(self.grad_norms)}

    def load_state_dict(self, state: dict) -> None:
        self.losses = deque(state.get("losses", []))
        self.grad_norms = deque(state.get("grad_norms", []))


class _InfGradient(torch.autograd.Function):
    """Identity forward; backward turns every gradient into +inf (an overflow, loss intact)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return torch.full_like(grad, float("inf"))


def poison_loss(loss_func, iteration: int, cfg: StabilityConfig):
    """Wrap a forward step's loss function so that the injected iteration's per-token losses
    are NaN, or scaled into a spike, before the loss function sees them; or so that the loss
    stays what it is and only its gradients overflow to inf."""
    if iteration == cfg.inject_inf_grad_at:
        return lambda output_tensor: loss_func(_InfGradient.apply(output_tensor))
    if iteration == cfg.inject_nan_at:
        factor = float("nan")
    elif iteration == cfg.inject_spike_at:
        factor = cfg.inject_spike_scale
    else:
        return loss_func
    return lambda output_tensor: loss_func(output_tensor * factor)


# -- what to watch ---------------------------------------------------------------------------

_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.")


def _label(module: torch.nn.Module, name: str) -> str:
    """'layer N' (global, 1-based) for transformer layers; the top-level module otherwise."""
    match = _LAYER.match(name)
    if match:
        return f"layer {module.decoder.layers[int(match.group(1))].layer_number}"
    return name.split(".")[0] if not name.startswith("decoder.final") else "final_norm"


def _param_labels(model: list) -> dict[torch.nn.Parameter, str]:
    return {param: _label(module, name) for module in unwrap_model(model)
            for name, param in module.named_parameters()}


def _fsdp_shards(model: FullyShardedDataParallel) -> list[tuple[str, torch.nn.Parameter]]:
    """Megatron-FSDP's optimizer parameters (this rank's shards, DTensors), labelled; their
    .grad is the reduced, unscaled gradient shard once the optimizer has prepared it."""
    module = unwrap_model(model.module.module)
    prefix = "module."  # Float16Module, under Megatron-FSDP's own wrapper
    return [(_label(module, name[len(prefix):] if name.startswith(prefix) else name), param)
            for name, param in model.param_and_grad_buffer.optimizer_named_parameters]


def _fsdp_layer_grad_norms(model: FullyShardedDataParallel) -> dict[str, float]:
    shards = _fsdp_shards(model)
    names = sorted({label for label, _ in shards})
    sums = torch.zeros(len(names), dtype=torch.float64, device=get_platform().device)
    for label, param in shards:
        if param.grad is not None:
            piece = param.grad.to_local().double().flatten()
            sums[names.index(label)] += torch.dot(piece, piece)
    dist.all_reduce(sums, group=parallel_state.get_data_parallel_group(with_context_parallel=True))
    return {name: math.sqrt(value) for name, value in zip(names, sums.tolist(), strict=True)}


def per_layer_grad_norms(model: list, loss_scale: float) -> dict[str, float]:
    """Norm of the reduced gradient of each layer, across every rank (collective).

    Reads the DDP buffers after reduction: each data-parallel rank sums its own shard of each
    bucket (with the distributed optimizer, only that shard is reduced), and the sums of squares
    are added over data-parallel and model-parallel ranks; tensor-parallel duplicates once.
    Under Megatron-FSDP: the optimizer's gradient shards.
    """
    if isinstance(model[0], FullyShardedDataParallel):
        return _fsdp_layer_grad_norms(model[0])
    labels = _param_labels(model)
    # Pipeline stages hold different layers: agree on one list of names before summing.
    mp_group = parallel_state.get_model_parallel_group()
    per_rank: list[set[str]] = [set() for _ in range(dist.get_world_size(mp_group))]
    dist.all_gather_object(per_rank, set(labels.values()), group=mp_group)
    names = sorted(set().union(*per_rank))
    sums = torch.zeros(len(names), dtype=torch.float64, device=get_platform().device)
    dp_group = parallel_state.get_data_parallel_group(with_context_parallel=True)
    dp_rank, dp_size = dist.get_rank(dp_group), dist.get_world_size(dp_group)
    buffers = [b for chunk in model for b in chunk.buffers + chunk.expert_parallel_buffers]
    for buffer in buffers:
        for bucket in buffer.buckets:
            shard = bucket.grad_data.numel() // dp_size
            lo_shard = bucket.offset + dp_rank * shard
            hi_shard = lo_shard + shard
            # The bucket's list, not its set: a set iterates in id() order, which changes the
            # order of the sums from run to run, and with it their last bits.
            for param in bucket.params_list:
                if not param_is_not_tensor_parallel_duplicate(param):
                    continue
                start, end, _ = buffer.param_index_map[param]
                lo, hi = max(start, lo_shard), min(end, hi_shard)
                if lo < hi:
                    piece = buffer.grad_data[lo:hi].double()
                    sums[names.index(labels[param])] += torch.dot(piece, piece)
    dist.all_reduce(sums, group=dp_group)
    dist.all_reduce(sums, group=mp_group)
    return {name: math.sqrt(value) / loss_scale for name, value in zip(names, sums.tolist(),
                                                                       strict=True)}


def _weights(model: list) -> list[tuple[torch.Tensor, bool]]:
    """(this rank's weights, counted) pairs: TP duplicates are not counted; under Megatron-FSDP
    each rank's shards of the main weights (its full layers exist only while they run)."""
    if isinstance(model[0], FullyShardedDataParallel):
        return [(p.detach().to_local(), True) for _, p in _fsdp_shards(model[0])]
    return [(p.detach(), param_is_not_tensor_parallel_duplicate(p))
            for chunk in model for p in chunk.parameters()]


def snapshot_parameters(model: list) -> list[torch.Tensor]:
    return [w.float().clone() for w, _ in _weights(model)]


def update_ratio(model: list, before: list[torch.Tensor]) -> float:
    """||w_after - w_before|| / ||w_before|| over the whole model (collective)."""
    sums = torch.zeros(2, dtype=torch.float64, device=get_platform().device)
    for (w, counted), old in zip(_weights(model), before, strict=True):
        if counted:
            sums[0] += torch.sum((w.float() - old).double() ** 2)
            sums[1] += torch.sum(old.double() ** 2)
    if isinstance(model[0], FullyShardedDataParallel):
        dist.all_reduce(sums, group=parallel_state.get_data_parallel_group(
            with_context_parallel=True))
    dist.all_reduce(sums, group=parallel_state.get_model_parallel_group())
    return math.sqrt(sums[0].item()) / max(math.sqrt(sums[1].item()), 1e-30)


def alerts(grad_norm: float | None, ratio: float | None, loss_variance: float) -> list[str]:
    """The monitoring guide's thresholds, as warning lines."""
    lines = []
    if grad_norm is not None and not GRAD_NORM_RANGE[0] <= grad_norm <= GRAD_NORM_RANGE[1]:
        lines.append(f"grad norm {grad_norm:.3e} outside {GRAD_NORM_RANGE[0]:g}.."
                     f"{GRAD_NORM_RANGE[1]:g}")
    if ratio is not None and not UPDATE_RATIO_RANGE[0] <= ratio <= UPDATE_RATIO_RANGE[1]:
        lines.append(f"update/parameter ratio {ratio:.3e} outside {UPDATE_RATIO_RANGE[0]:g}.."
                     f"{UPDATE_RATIO_RANGE[1]:g}")
    if loss_variance > LOSS_VARIANCE_LIMIT:
        lines.append(f"windowed loss variance {loss_variance:.3f} over {LOSS_VARIANCE_LIMIT}")
    return [f" WARNING: {line}" for line in lines]
