"""megatron-core's gradient buffers as LGS sees them: the fine buckets it builds the DDP with
(`fine_bucket_size`; also the distributed optimizer's sharding, which never changes), each in
chunk coordinates ([D, chunk]: row r is what data-parallel rank r owns), and per buffer the
plan that groups them into the buckets LGS fires.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from megatron_lgs.lgs.plan import BucketPlan, PlanConfig, Unit, make_plan
from megatron_lgs.lgs.topology import Levels


def fine_bucket_size(dp_size: int, distributed_optimizer: bool) -> int:
    """megatron-core's bucket_size (parameters) for the fine layout LGS groups.

    Plain DDP: one bucket per parameter. Distributed optimizer: each bucket is padded to a
    multiple of lcm(D, 128) and split into D shards; buckets of at least D x lcm(D, 128)
    elements leave real elements on every rank (the padding is under one lcm and the last
    shard starts (D-1)/D in), as megatron's per-bucket optimizer bookkeeping expects."""
    return dp_size * math.lcm(dp_size, 128) if distributed_optimizer else 1


@dataclass
class FineBucket:
    """One megatron-core buffer bucket in chunk coordinates."""

    bucket: object  # megatron's _ParamAndGradBucket
    name: str
    chunk: int  # s: elements per data-parallel chunk
    numel: int

    def rows(self, d: int) -> torch.Tensor:
        """The gradient as [D, chunk]; a padded copy when it does not divide evenly."""
        flat = self.bucket.grad_data
        if self.numel == d * self.chunk:
            return flat.view(d, self.chunk)
        return torch.nn.functional.pad(flat, (0, d * self.chunk - self.numel)).view(d, self.chunk)

    def write(self, d: int, lo: int, hi: int, values: torch.Tensor,
              row: int | None = None) -> None:
        """Columns [lo, hi) of every row, or of `row` only, from `values` ([rows, hi - lo]).
        Only those columns are written: another bucket may be reducing the unit's others."""
        rows = range(d) if row is None else [row]
        if self.numel == d * self.chunk:
            self.bucket.grad_data.view(d, self.chunk)[rows[0]:rows[-1] + 1, lo:hi] = values
            return
        flat = self.bucket.grad_data
        for i, r in enumerate(rows):
            start, end = r * self.chunk + lo, min(r * self.chunk + hi, self.numel)
            if start < end:
                flat[start:end] = values[i, :end - start]


@dataclass
class BufferSync:
    key: str  # "dense.fp32" ...
    levels: Levels
    fine: list[FineBucket]
    units: list[Unit]
    param_units: dict[torch.nn.Parameter, int]
    plan: BucketPlan | None = None
    unit_buckets: list[list[int]] = field(default_factory=list)  # unit -> plan buckets
    bucket_params: list[int] = field(default_factory=list)  # plan bucket -> its parameters
    send_residual: dict[int, torch.Tensor] = field(default_factory=dict)  # unit -> [N, chunk]
    gather_residual: dict[int, torch.Tensor] = field(default_factory=dict)  # unit -> [chunk]

    def stage(self, k: int) -> torch.Tensor:
        """Plan bucket k's columns of every unit, scaled by megatron's gradient scaling factor,
        as [g, N, width]: block l holds rows {n' g + l}, what local rank l reduces inside the
        node. One strided copy, so the reduce-scatter's input needs no other."""
        lv, segments = self.levels, self.plan.buckets[k].segments
        n, g = lv.nodes, lv.per_node
        scale = self.fine[segments[0].unit].bucket.gradient_scaling_factor
        first = self.fine[segments[0].unit].bucket.grad_data
        out = torch.empty(g, n, sum(s.hi - s.lo for s in segments), dtype=first.dtype,
                          device=first.device)
        off = 0
        for s in segments:
            w = s.hi - s.lo
            src = self.fine[s.unit].rows(lv.size)[:, s.lo:s.hi].view(n, g, w).transpose(0, 1)
            torch.mul(src, scale, out=out[:, :, off:off + w])  # x 1.0 is exact: one pass either way
            off += w
        return out

    def replan(self, config: PlanConfig, backward_seconds: dict[str, float] | None) -> None:
        self.plan = make_plan(self.units, config, backward_seconds)
        self.unit_buckets = [[] for _ in self.units]
        self.bucket_params = []
        for b, bucket in enumerate(self.plan.buckets):
            units = {seg.unit for seg in bucket.segments}
            for u in units:
                self.unit_buckets[u].append(b)
            self.bucket_params.append(sum(len(self.fine[u].bucket.params_list) for u in units))
