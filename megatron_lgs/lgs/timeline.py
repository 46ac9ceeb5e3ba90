"""Replay an LGS bucket plan on a predicted backward timeline (one training step).

How the step is modelled (all times are predictions):

- Compute: on a built-in GPU profile (`costmodel.HardwareProfile.gpu`), per-stage forward and
  backward times come from the whole-step model's kernels (`stepmodel.workload_compute`: GEMM
  roofline, attention, memory-bound ops, tensor-parallel communication), the one compute
  model of the package; on a measured profile, from the FLOP rate its probe measured; on a
  custom one, or where a workload names an `efficiency`, from FLOPs at that fraction of peak.
- Pipeline: 1F1B with per-stage forward/backward times tf_k, tb_k per micro-batch; all
  compute ends at T = sum_k (tf_k + tb_k) + (M - 1) max_k (tf_k + tb_k). The last micro-batch's
  backward flows from the last stage to stage 0, so stage k's last backward ends at
  T - sum_{j<k} tb_j: stage 0 ends last and later stages get slack. P2P sends are not modelled.
- Gradients fire on the last micro-batch only (earlier ones run under no_sync); each op's
  gradients are ready when the op ends. Under megatron-core's interleaved schedule each model
  chunk fires after its own last backward, spread over the cooldown (`replay`'s `vpp`).
  Buckets fill in backward order per gradient group (dense / expert, as Megatron keeps
  separate buffers) by the engine's own planner
  (`plan.make_plan` with the workload's `weighting`): with "none" (megatron's and the other
  one-channel systems' rule) a bucket closes once its bytes reach the intra threshold, with
  LGS's "params" / "measured" only at a layer boundary; a tensor is never split, so a bucket
  can exceed the threshold, and the last closes at the end of backward. A bucket is ready when
  the op of its last gradient ends.
- Each bucket runs the two-level reduction (`hierarchical_allreduce`) with the inter threshold
  capping inter-node message size. LGS (`pipelined_hops`, the default) has two FIFO channels
  per GPU, as its engine has two threads: the intra-node reduce-scatter on one, the rest on the
  other, so bucket k's inter-node hop runs beside bucket k+1's intra-node hop; the other
  systems' buckets (`baselines`, megatron in `stepmodel`) run on one channel. Communication
  overlaps compute without slowing it, unless the profile's `overlap` < 1 (compute and
  communication sharing cores): then the communication time spent beside the backward delays
  the step by (1 - overlap) of it, with the intra-node hops' own `intra_overlap` where the
  profile has one.
- Step time = max over stages of when that stage's gradients are synchronized; so the first
  stage's DP traffic is the critical one unless a later stage's traffic outlasts its slack.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from megatron_lgs.lgs.costmodel import HardwareProfile, hierarchical_allreduce
from megatron_lgs.lgs.plan import WEIGHTINGS, PlanConfig, Unit, make_plan
from megatron_lgs.lgs.workload import (
    BackwardOp,
    Layout,
    ModelConfig,
    chunk_backward,
    forward_flops,
    stage_backward,
)

MB = 1 << 20
# The fraction of peak a custom profile's compute reaches when no efficiency is given: Megatron-LM
# reports 41-48% MFU on H100 (REFERENCE.md), so about half.
DEFAULT_EFFICIENCY = 0.5


@dataclass(frozen=True)
class Thresholds:
    intra_bytes: int
    inter_bytes: int
    split: bool = False  # tensors cut across buckets (Apex's DistributedFusedAdam), not whole

    def __post_init__(self) -> None:
        if self.intra_bytes <= 0 or self.inter_bytes <= 0:
            raise ValueError(f"thresholds must be > 0 bytes, got {self}")


@dataclass(frozen=True)
class Span:
    name: str
    start_s: float
    end_s: float


@dataclass(frozen=True)
class BucketEvent:
    group: str
    tensors: tuple[str, ...]
    nbytes: int
    ready_s: float
    start_s: float
    end_s: float
    inter_messages: int


@dataclass(frozen=True)
class StageTimeline:
    stage: int
    busy_s: float
    ops: tuple[Span, ...]
    buckets: tuple[BucketEvent, ...]
    backward_end_s: float
    synced_s: float
    peak_inflight_bytes: int

    @property
    def comm_s(self) -> float:
        """Time during which some bucket is being reduced (with two channels a bucket's span
        can overlap the previous one's, so spans are merged, not summed)."""
        total, reach = 0.0, float("-inf")
        for b in sorted(self.buckets, key=lambda b: b.start_s):
            if b.end_s > reach:
                total += b.end_s - max(b.start_s, reach)
                reach = b.end_s
        return total


@dataclass(frozen=True)
class StepPrediction:
    thresholds: Thresholds
    step_time_s: float
    compute_end_s: float
    exposed_comm_s: float
    comm_s: float
    comm_fraction: float
    gpu_idle_fraction: float
    peak_inflight_bytes: int
    num_collectives: int
    critical_stage: int
    stages: tuple[StageTimeline, ...]


@dataclass(frozen=True)
class Workload:
    """Everything fixed across threshold choices: model, layout, hardware, and (None: the
    GPU's kernel model, see the module docstring) a flat fraction of peak FLOP/s."""

    model: ModelConfig
    layout: Layout
    hw: HardwareProfile
    efficiency: float | None = None
    # How LGS's engine closes its buckets (`--lgs-layer-weighting`, default "params"); the
    # one-channel systems (`pipelined_hops=False`) always close at the threshold ("none").
    weighting: str = "params"

    def __post_init__(self) -> None:
        if self.efficiency is not None and not 0 < self.efficiency <= 1:
            raise ValueError(f"efficiency must be in (0, 1], got {self.efficiency}")
        if self.weighting not in WEIGHTINGS:
            raise ValueError(f"weighting must be one of {WEIGHTINGS}, got {self.weighting!r}")
        heads, groups, tp = self.model.num_heads, self.model.num_query_groups, self.layout.tp
        if heads % tp or (groups or tp) % tp:
            raise ValueError(f"tp {tp} must divide the attention heads ({heads}) and query "
                             f"groups ({groups or heads})")

    @property
    def kernel_timed(self) -> bool:
        """Whether compute comes from the GPU's kernel model (not a flat FLOP rate)."""
        return self.hw.gpu is not None and self.hw.efficiency is None and self.efficiency is None

    @property
    def flop_rate(self) -> float:
        """The flat FLOP/s: a measured profile's own rate, else peak x efficiency (a profile
        without kernel data and no efficiency given: DEFAULT_EFFICIENCY)."""
        return self.hw.peak_flops * (self.hw.efficiency or self.efficiency or DEFAULT_EFFICIENCY)

    @property
    def compute_label(self) -> str:
        if self.kernel_timed:
            return f"{self.hw.gpu} kernel model"
        if self.hw.efficiency is not None:
            return "measured FLOP rate"
        return f"{self.efficiency or DEFAULT_EFFICIENCY:.0%} of peak FLOP/s"


def _layer(name: str) -> str:
    """The layer a workload op or gradient belongs to ("layer3.fc1" -> "layer3"), as the
    engine's `plan.layer_of` groups megatron-core's parameters."""
    return name.split(".")[0]


Closed = tuple[str, list[str], int, float, int]  # group, names, bytes, ready time, inter cap


def _buckets(ops: list[BackwardOp], start: float, w: Workload, th: Thresholds, rate: float,
             weighting: str, deferred: float | None = None) -> tuple[list[Span], list[Closed]]:
    """Op spans (each op lasts its FLOPs / `rate`) and closed buckets (group, names, bytes,
    ready time, inter-node message cap), grouped per gradient group by `plan.make_plan`;
    `deferred` (s): every bucket ready that long after the last op ends (reduced after the
    backward); None: each as its last gradient is."""
    gb = w.layout.grad_bytes
    spans: list[Span] = []
    grads: dict[str, list[tuple[str, int, float]]] = {}  # group -> (name, numel, ready)
    layer_flops: dict[str, float] = {}
    t = start
    for op in ops:
        end = t + op.flops / rate
        spans.append(Span(op.name, t, end))
        layer_flops[_layer(op.name)] = layer_flops.get(_layer(op.name), 0.0) + op.flops
        for g in op.grads:
            grads.setdefault(g.group, []).append((g.name, g.numel, end))
        t = end
    closed: list[Closed] = []
    config = PlanConfig(th.intra_bytes, weighting, split_large=th.split)
    for group, tensors in grads.items():
        units = [Unit(name, _layer(name), numel, gb) for name, numel, _ in tensors]
        for b in make_plan(units, config, layer_flops).buckets:
            last = b.segments[-1].unit
            closed.append((group, [tensors[s.unit][0] for s in b.segments], b.nbytes,
                           tensors[last][2] if deferred is None else t + deferred,
                           th.inter_bytes))
    return spans, closed


# Ops that run back to back from a start time, bucketed with these thresholds, reduced as
# their gradients become ready (None) or all that many seconds after the last op.
Window = tuple[list[BackwardOp], float, Thresholds, float | None]


def _stage(stage: int, windows: list[Window], busy: float, w: Workload, rate: float,
           pipelined_hops: bool) -> StageTimeline:
    spans: list[Span] = []
    closed: list[Closed] = []
    for ops, start, th, deferred in windows:
        s, c = _buckets(ops, start, w, th, rate, w.weighting if pipelined_hops else "none",
                        deferred)
        spans += s
        closed += c
    closed.sort(key=lambda b: b[3])
    ops = [op for window in windows for op in window[0]]
    bwd_start = windows[0][1]
    lay = w.layout
    first_free = free = bwd_start  # the intra-node channel, and the (only / second) one
    events: list[BucketEvent] = []
    hops: list[tuple[float, float, float]] = []  # (start, end, overlap) of each hop
    intra_o, inter_o = w.hw.intra_overlap_or_inter, w.hw.overlap
    for group, names, nbytes, ready, inter_bytes in closed:
        g, m = lay.group_shape(group)
        cost = hierarchical_allreduce(nbytes, g, m, w.hw, inter_bytes,
                                      all_gather=not lay.distributed_optimizer)
        first = cost.intra_reduce_scatter_s
        gather = cost.intra_s - first  # the intra-node all-gather after the inter-node hop
        if pipelined_hops:
            start = max(ready, first_free)
            first_free = start + first
            rest = max(first_free, free)
        else:
            start = max(ready, free)
            rest = start + first
        free = rest + cost.inter_s + gather
        hops += [(start, start + first, intra_o), (rest, rest + cost.inter_s, inter_o),
                 (free - gather, free, intra_o)]
        events.append(BucketEvent(group, tuple(names), nbytes, ready, start, free,
                                  cost.inter_messages))
    bwd_end = spans[-1].end_s if spans else bwd_start
    # Communication that runs during the backward slows it by (1 - overlap) of its length
    # (shared cores), per level; the slowed backward then delays everything after it by as
    # much. Between interleaved chunks' windows the stage runs other chunks' backward, so
    # the whole span from the first window counts.
    delay = sum((1 - o) * max(0.0, min(e, bwd_end) - max(s, bwd_start)) for s, e, o in hops)
    # Unsynchronized bytes: +grad bytes when its op ends, -bucket bytes when its collective ends.
    deltas = [(s.end_s, sum(g.numel for g in op.grads) * lay.grad_bytes)
              for s, op in zip(spans, ops, strict=True)]
    deltas += [(e.end_s, -e.nbytes) for e in events]
    level = peak = 0
    for _, d in sorted(deltas, key=lambda x: (x[0], x[1])):
        level += d
        peak = max(peak, level)
    return StageTimeline(stage, busy, tuple(spans), tuple(events), bwd_end,
                         max(bwd_end, free) + delay, peak)


# A bucket no gradient buffer reaches: the whole buffer is one bucket, one inter message.
ONE_BUCKET = Thresholds(1 << 62, 1 << 62)


def ddp_buckets(bucket_bytes: int, split: bool = False) -> Thresholds:
    """A flat DDP's buckets (PyTorch DDP's, megatron-core's, DeepSpeed's): one closes once it
    holds `bucket_bytes` and is one collective whatever its size, never split on the network
    as LGS's inter-node threshold splits its own. `split`: buckets of exactly that size, a
    tensor cut across them, as Apex's DistributedFusedAdam fills its own."""
    return Thresholds(bucket_bytes, ONE_BUCKET.inter_bytes, split)


def predict_step(w: Workload, th: Thresholds, bucket_later_stages: bool = True,
                 pipelined_hops: bool = True) -> StepPrediction:
    """Predicted timeline of one step with thresholds `th` (see the module docstring).

    The step ends when the gradients are synchronized; `stepmodel.predict_run` adds what the
    thresholds do not move (the optimizer step, the parameter all-gather).
    `bucket_later_stages=False` models megatron-core DDP, which turns bucketing off on
    pipeline stages after the first: each of their gradient buffers is reduced as one bucket.
    `pipelined_hops=False`: one communication channel (the other systems' buckets).
    """
    if w.kernel_timed:
        # Imported here: stepmodel builds on this module.
        from megatron_lgs.lgs.stepmodel import workload_compute

        tf, tb, compute_end = workload_compute(w)
    else:
        rate = w.flop_rate
        stage_ops = [stage_backward(w.model, w.layout, k) for k in range(w.layout.pp)]
        tb = [sum(op.flops for op in ops) / rate for ops in stage_ops]
        tf = [forward_flops(ops) / rate for ops in stage_ops]
        per_mb = [f + b for f, b in zip(tf, tb, strict=True)]
        compute_end = sum(per_mb) + (w.layout.num_micro_batches - 1) * max(per_mb)
    return replay(w, th, tf, tb, compute_end, bucket_later_stages, pipelined_hops)


# Replays of one layout over a threshold grid share the ops; nothing mutates them.
@lru_cache(maxsize=64)
def chunk_ops(model: ModelConfig, lay: Layout, stage: int, vpp: int) -> list[list[BackwardOp]]:
    """`workload.chunk_backward`, cached: the replay and the step model's gathers share it."""
    return chunk_backward(model, lay, stage, vpp)


def _chunk_windows(w: Workload, th: Thresholds, k: int, bwd_end: float, tb: float,
                   vpp: int, bucket_all: bool, apex: bool = False) -> list[Window]:
    """Where stage k's gradients become ready. Megatron-core enables each model chunk's
    gradient sync for that chunk's last micro-batch (`is_last_microbatch_for_model_chunk`),
    so its buckets fire during that backward (megatron-core's DDP hooks and LGS's engine
    alike); under the interleaved schedule the cooldown runs the last group's chunks back to
    back, chunk vpp-1 first, pp micro-batches each: chunk c's last backward ends pp x (the
    backward of chunks 0 .. c-1) before the stage's. A chunk's backward is its share of the
    stage's FLOPs times tb (without virtual stages: one chunk, the whole tb). Megatron-core
    buckets only chunk 0 of stage 0 (one bucket for every later chunk and stage);
    `bucket_all` buckets every chunk with `th`. `apex`: NeMo 1's Apex DistributedFusedAdam,
    whose `grad_sync_func` makes megatron-core's schedules reduce a chunk's buckets (`th`)
    after its last backward instead, on every stage but the first of a schedule without
    virtual stages, which reduces during it (`rank == 0` in the 1F1B cooldown); the
    interleaved schedule launches it for a chunk `k` virtual micro-batches after that
    chunk's last backward ("at the same time across the pipeline-parallel group"), that is
    after k backwards of the chunk the cooldown runs next, and chunk 0's at the end."""
    chunks = chunk_ops(w.model, w.layout, k, vpp)  # chunk vpp-1 first
    flops = [sum(op.flops for op in ops) for ops in chunks]
    total = sum(flops)
    length = [tb * f / total if total else tb / vpp for f in flops]
    windows, after = [], 0.0  # after: backward of the chunks below this one, one micro-batch
    for i in reversed(range(vpp)):  # chunk 0 (runs last) first
        end = bwd_end - w.layout.pp * after
        c = vpp - 1 - i
        # A chunk whose ops have no FLOPs (a stage holding only the embedding, whose gradient
        # is a scatter-add) has them ready when its backward ends, not when it starts.
        start = end - length[i] if flops[i] else end
        if apex:
            late = 0.0 if c == 0 else k * length[i + 1]  # chunk c - 1's backwards
            window = (chunks[i], start, th, None if vpp == 1 and k == 0 else late)
        else:
            bucketed = bucket_all or (k == 0 and c == 0)
            window = (chunks[i], start, th if bucketed else ONE_BUCKET, None)
        windows.append(window)
        after += length[i]
    return windows[::-1]


def replay(w: Workload, th: Thresholds, tf: list[float], tb: list[float], compute_end: float,
           bucket_later_stages: bool = True, pipelined_hops: bool = True,
           vpp: int = 1, apex: bool = False) -> StepPrediction:
    """The gradient sync replayed on given per-stage, per-micro-batch forward and backward
    times `tf`, `tb` (s) and the end of all compute `compute_end` (s).

    Each stage's last backward lasts tb_k, split over its ops in proportion to their FLOPs;
    this is how the whole-step model (`stepmodel`) feeds its own compute times in. With
    `vpp` > 1 (the interleaved schedule, gradients synced while the backward runs) each model
    chunk syncs during its own last backward (`_chunk_windows`); the final backward then
    reaches stage k sum_{j<k} tb_j / vpp before the end. `apex`: when Apex's
    DistributedFusedAdam reduces instead (`_chunk_windows`).
    """
    lay = w.layout
    stages = []
    for k in range(lay.pp):
        flops = sum(op.flops for ops in chunk_ops(w.model, lay, k, vpp) for op in ops)
        busy = lay.num_micro_batches * (tf[k] + tb[k])
        rate = flops / tb[k] if tb[k] > 0 and flops > 0 else float("inf")
        windows = _chunk_windows(w, th, k, compute_end - sum(tb[:k]) / vpp, tb[k], vpp,
                                 bucket_later_stages, apex)
        stages.append(_stage(k, windows, busy, w, rate, pipelined_hops))
    crit = max(stages, key=lambda s: (s.synced_s, -s.stage))
    step = crit.synced_s
    return StepPrediction(
        thresholds=th,
        step_time_s=step,
        compute_end_s=compute_end,
        # step >= compute_end exactly; the clamp drops the float sums' rounding residue.
        exposed_comm_s=max(0.0, step - compute_end),
        comm_s=crit.comm_s,
        comm_fraction=crit.comm_s / step,
        gpu_idle_fraction=1 - crit.busy_s / step,
        peak_inflight_bytes=max(s.peak_inflight_bytes for s in stages),
        num_collectives=sum(len(s.buckets) for s in stages),
        critical_stage=crit.stage,
        stages=tuple(stages),
    )
