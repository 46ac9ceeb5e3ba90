"""MoE expert load, per layer, over each log interval: tokens each expert processed, the max/mean
imbalance, the tokens dropped by the capacity factor, and megatron-core's auxiliary losses.

The counts come from megatron-core's own routers: a forward hook on each `Router` reads the
routing map it returns (after capacity dropping), so nothing in megatron-core is patched. Each
token picks exactly top-k experts before dropping, so the assignments dropped in a forward are
`tokens x topk - routing_map.sum()`. The auxiliary losses (load balancing, z-loss) are read from
megatron-core's layer-wise tracker, which its routers fill and Megatron-LM reduces the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.transformer.moe.moe_utils import (
    clear_aux_losses_tracker,
    get_moe_layer_wise_logging_tracker,
    reduce_aux_losses_tracker_across_ranks,
)
from megatron.core.transformer.moe.router import Router
from megatron.core.utils import unwrap_model

from megatron_lgs.platform import get_platform


def routing_counts(routing_map: torch.Tensor, topk: int) -> tuple[torch.Tensor, int]:
    """Tokens per expert and dropped token-expert assignments of one routing map
    ([tokens, experts], True where a token goes to an expert, after capacity dropping)."""
    per_expert = routing_map.sum(dim=0, dtype=torch.int64)
    dropped = routing_map.shape[0] * topk - int(per_expert.sum())
    return per_expert, dropped


@dataclass(frozen=True)
class LayerLoad:
    layer: int  # global, 1-based
    tokens_per_expert: list[int]
    dropped: int
    aux_losses: dict[str, float]  # megatron's name -> mean per micro-batch (unscaled by coeff)

    @property
    def imbalance(self) -> float:
        """Busiest expert over the mean: 1.0 is perfect balance, E is one expert taking all."""
        total = sum(self.tokens_per_expert)
        if total == 0:
            return float("nan")
        return max(self.tokens_per_expert) * len(self.tokens_per_expert) / total


class ExpertLoadMonitor:
    """Counts routed tokens of training forwards (not evaluation, not a recompute's second
    forward: the same rule megatron's routers use for their own token counts)."""

    def __init__(self, model: list[torch.nn.Module], num_layers: int, num_experts: int, topk: int,
                 sequence_parallel: bool) -> None:
        self.topk = topk
        self.sequence_parallel = sequence_parallel
        # Per layer: tokens per expert, then dropped assignments, then router forwards.
        self.counts = torch.zeros(num_layers, num_experts + 2, dtype=torch.int64,
                                  device=get_platform().device)
        self.routers = [m for chunk in unwrap_model(model) for m in chunk.modules()
                        if isinstance(m, Router)]
        for router in self.routers:
            router.register_forward_hook(self._count)

    def _count(self, router: Router, inputs: tuple, output: tuple) -> None:
        if not (router.training and torch.is_grad_enabled()):
            return
        per_expert, dropped = routing_counts(output[1], self.topk)
        row = self.counts[router.layer_number - 1]
        row[:-2] += per_expert
        row[-2] += dropped
        row[-1] += 1

    def collect(self) -> list[LayerLoad]:
        """Global counts since the last call, summed over every rank that routed different tokens
        (data and context parallel; tensor parallel only with sequence parallelism, where each
        rank routes its slice of the sequence) and gathered over pipeline stages. Collective."""
        counts = self.counts.clone()
        self.counts.zero_()
        forwards = counts[:, -1].clone()  # per rank: micro-batches that reached the layer
        dist.all_reduce(forwards, op=dist.ReduceOp.MAX)
        dist.all_reduce(counts, group=parallel_state.get_data_parallel_group(
            with_context_parallel=True))
        if self.sequence_parallel:
            dist.all_reduce(counts, group=parallel_state.get_tensor_model_parallel_group())
        if parallel_state.get_pipeline_model_parallel_world_size() > 1:
            dist.all_reduce(counts, group=parallel_state.get_pipeline_model_parallel_group())
        aux = self._aux_losses(forwards)
        layers = []
        for index, row in enumerate(counts.tolist()):
            if forwards[index] == 0:
                continue
            layers.append(LayerLoad(layer=index + 1, tokens_per_expert=row[:-2], dropped=row[-2],
                                    aux_losses={name: values[index] for name, values in
                                                aux.items()}))
        return layers

    @staticmethod
    def _aux_losses(forwards: torch.Tensor) -> dict[str, list[float]]:
        """megatron's tracker, reduced as Megatron-LM reduces it, per micro-batch; cleared."""
        tracker = get_moe_layer_wise_logging_tracker()
        if not tracker:
            return {}
        reduce_aux_losses_tracker_across_ranks()
        per_batch = forwards.clamp(min=1).double()
        result = {name: (entry["values"].double() / per_batch).tolist()
                  for name, entry in tracker.items()}
        clear_aux_losses_tracker()
        return result


def log_lines(layers: list[LayerLoad]) -> list[str]:
    lines = []
    for load in layers:
        aux = "".join(f" {name}: {value:.4f} |" for name, value in load.aux_losses.items())
        lines.append(f" moe layer {load.layer} | tokens per expert: "
                     f"{' '.join(str(n) for n in load.tokens_per_expert)} | imbalance (max/mean):"
                     f" {load.imbalance:.3f} | dropped tokens: {load.dropped} |{aux}")
    return lines


def metrics_record(layers: list[LayerLoad]) -> dict[str, object]:
    """Flat fields for the "moe" event of metrics.jsonl (the report plots imbalance.*)."""
    record: dict[str, object] = {}
    for load in layers:
        record[f"imbalance.layer_{load.layer}"] = load.imbalance
        record[f"dropped.layer_{load.layer}"] = load.dropped
        record[f"tokens_per_expert.layer_{load.layer}"] = load.tokens_per_expert
        for name, value in load.aux_losses.items():
            record[f"{name}.layer_{load.layer}"] = value
    return record
