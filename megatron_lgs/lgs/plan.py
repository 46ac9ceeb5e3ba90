"""The LGS bucket plan: which gradients are synchronized together, and on which links.

Input: the gradient units in backward order (megatron-core's small DDP buckets, see
`sync.fine_bucket_size`), each with the transformer layer it belongs to. A unit is seen in *chunk
coordinates*: every data-parallel rank owns one chunk of `units` elements of it (the
distributed optimizer's shard), so a piece of a unit is a column range [lo, hi) across all D
chunks and costs (hi - lo) x `unit_bytes` bytes of message. Splitting along columns keeps every
piece evenly shardable, whatever the threshold.

Rules, in this order, for each unit:
- a unit larger than the bucket threshold is cut into threshold-sized pieces only with
  `split_large`, and a bucket holding such pieces closes at the threshold even inside a layer;
  otherwise the unit stays whole (megatron-core never splits a parameter);
- a bucket never grows past the memory cap (the most unsynchronized bytes in flight); a single
  piece larger than the cap cannot be planned and is a clear error;
- `weighting="none"` closes a bucket as soon as its bytes reach the threshold; `"params"` and
  `"measured"` close it only at a layer boundary, once the layers' weight reaches the
  threshold. A layer's weight is its bytes (`params`) or, with measured backward times, the
  bytes it would have if bytes were proportional to backward time (`measured`): a bucket then
  carries about the same amount of backward compute to hide behind.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

MB = 1 << 20
WEIGHTINGS = ("none", "params", "measured")


class PlanError(ValueError):
    """A plan that cannot satisfy its constraints; the message is addressed to the user."""


@dataclass(frozen=True)
class Unit:
    """One gradient unit in backward order."""

    name: str
    layer: str
    units: int  # columns (elements per data-parallel chunk)
    unit_bytes: int  # bytes one column costs across all chunks

    @property
    def nbytes(self) -> int:
        return self.units * self.unit_bytes


@dataclass(frozen=True)
class Segment:
    unit: int  # index into the plan's units
    lo: int
    hi: int


@dataclass(frozen=True)
class Bucket:
    segments: tuple[Segment, ...]
    nbytes: int
    layers: tuple[str, ...]


@dataclass(frozen=True)
class PlanConfig:
    threshold_bytes: int
    weighting: str = "params"
    memory_cap_bytes: int | None = None
    split_large: bool = False

    def __post_init__(self) -> None:
        if self.threshold_bytes <= 0:
            raise PlanError(f"the LGS threshold must be > 0 bytes, got {self.threshold_bytes}")
        if self.weighting not in WEIGHTINGS:
            raise PlanError(f"--lgs-layer-weighting must be one of {WEIGHTINGS}")
        if self.memory_cap_bytes is not None and self.memory_cap_bytes <= 0:
            raise PlanError("--lgs-memory-cap-mb must be > 0")


@dataclass(frozen=True)
class BucketPlan:
    units: tuple[Unit, ...]
    buckets: tuple[Bucket, ...]
    threshold_bytes: int  # after tightening by the memory cap
    tightened: bool


def _layer_weights(units: Sequence[Unit], weighting: str,
                   backward_seconds: dict[str, float] | None) -> dict[str, float]:
    """Bytes-equivalent weight per layer (see the module docstring)."""
    nbytes: dict[str, float] = {}
    for u in units:
        nbytes[u.layer] = nbytes.get(u.layer, 0.0) + u.nbytes
    if weighting != "measured" or not backward_seconds:
        return nbytes
    total_bytes, total_time = sum(nbytes.values()), sum(backward_seconds.values())
    if total_time <= 0:
        return nbytes
    return {layer: total_bytes * backward_seconds.get(layer, 0.0) / total_time
            for layer in nbytes}


def _pieces(u: Unit, threshold: int, split: bool) -> list[tuple[int, int]]:
    if not split or u.nbytes <= threshold:
        return [(0, u.units)]
    per_piece = max(1, threshold // u.unit_bytes)
    return [(lo, min(lo + per_piece, u.units)) for lo in range(0, u.units, per_piece)]


def make_plan(units: Sequence[Unit], config: PlanConfig,
              backward_seconds: dict[str, float] | None = None) -> BucketPlan:
    """Group `units` (in backward order) into buckets; see the module docstring for the rules."""
    cap = config.memory_cap_bytes
    threshold = min(config.threshold_bytes, cap) if cap else config.threshold_bytes
    layer_weight = _layer_weights(units, config.weighting, backward_seconds)
    layer_bytes = _layer_weights(units, "params", None)
    by_layer = config.weighting != "none"

    buckets: list[Bucket] = []
    segments: list[Segment] = []
    nbytes, weight, layers = 0, 0.0, []

    def close() -> None:
        nonlocal segments, nbytes, weight, layers
        if segments:
            buckets.append(Bucket(tuple(segments), nbytes, tuple(layers)))
        segments, nbytes, weight, layers = [], 0, 0.0, []

    for i, u in enumerate(units):
        pieces = _pieces(u, threshold, config.split_large)
        for lo, hi in pieces:
            size = (hi - lo) * u.unit_bytes
            if cap and size > cap:
                hint = "" if config.split_large else "; add --lgs-split-large-tensors"
                raise PlanError(f"gradient {u.name} ({size / MB:.1f} MB) exceeds "
                                f"--lgs-memory-cap-mb {cap / MB:g}{hint}")
            if cap and segments and nbytes + size > cap:
                close()
            segments.append(Segment(i, lo, hi))
            nbytes += size
            # A layer's weight is spread over its bytes, so a split layer counts pro rata.
            if layer_bytes[u.layer]:
                weight += layer_weight[u.layer] * size / layer_bytes[u.layer]
            if not layers or layers[-1] != u.layer:
                layers.append(u.layer)
            at_boundary = i + 1 == len(units) or units[i + 1].layer != u.layer
            # A tensor cut into pieces is synchronized piece by piece, even mid-layer.
            if by_layer and len(pieces) == 1:
                if at_boundary and weight >= threshold:
                    close()
            elif nbytes >= threshold:
                close()
    close()
    return BucketPlan(tuple(units), tuple(buckets), threshold, threshold < config.threshold_bytes)


def layer_of(param_name: str) -> str:
    """The transformer layer a parameter belongs to, from megatron-core's naming."""
    parts = param_name.split(".")
    if "layers" in parts:
        i = parts.index("layers")
        if i + 1 < len(parts) and parts[i + 1].isdigit():
            return f"layer {parts[i + 1]}"
    if "embedding" in parts:
        return "embedding"
    if "output_layer" in parts:
        return "output"
    if "final_layernorm" in parts or "final_norm" in parts:
        return "final norm"
    return parts[0]


def describe(plan: BucketPlan, level: str, inter_messages: Sequence[int] | None = None) -> str:
    """The plan as the compact start-up table: bucket, layers, MB, level."""
    lines = [f" LGS plan: {len(plan.buckets)} buckets, threshold "
             f"{plan.threshold_bytes / MB:.3g} MB"
             f"{' (tightened by the memory cap)' if plan.tightened else ''}",
             f"   {'bucket':>6}  {'layers':<28} {'MB':>9}  level"]
    for b, bucket in enumerate(plan.buckets):
        span = bucket.layers[0] if len(bucket.layers) == 1 else \
            f"{bucket.layers[0]} .. {bucket.layers[-1]}"
        msgs = f" ({inter_messages[b]} inter msgs)" if inter_messages else ""
        lines.append(f"   {b:>6}  {span:<28} {bucket.nbytes / MB:>9.4f}  {level}{msgs}")
    return "\n".join(lines)


def message_columns(width: int, column_bytes: int, cap_bytes: int, block: int = 1
                    ) -> list[tuple[int, int]]:
    """Column ranges [lo, hi) of a bucket's inter-node messages: as few as keep each within
    `cap_bytes` (`column_bytes` per column; at least `block` columns), all of one width but
    the last, a multiple of `block` (INT8's scale blocks): no short remainder message."""
    per = max(block, max(1, cap_bytes // column_bytes) // block * block)
    count = max(1, math.ceil(width / per))
    size = math.ceil(math.ceil(width / count) / block) * block
    return [(lo, min(lo + size, width)) for lo in range(0, width, size)]
