"""Hierarchical layer-wise gradient sync on megatron-core's DDP.

megatron-core keeps owning the gradient buffers, the backward hooks, the no-sync context and
the distributed optimizer's shards. LGS builds the DDP with small buffer buckets (one per
parameter, or a few small ones together with the distributed optimizer: `fine_bucket_size`);
this fine layout is also the distributed optimizer's sharding and never changes. LGS then
takes over *which buckets fire together and how*: `install` (the one place that reaches into
megatron-core, pinned to 0.16.1 and tested in tests/unit/lgs/test_lgs_pins.py) routes each
parameter's grad-ready signal to the engine and replaces the DDP's finish/zero calls.

A bucket of the plan is reduced as soon as all its gradients are ready on the last
micro-batch, in three hops over a data-parallel group of N nodes x g ranks (ranks node-major;
rank r = n g + l, and r's chunk of every gradient is what it owns). Hop 1 runs on an intra-node
thread, hops 2-3 on an inter-node thread (each with its own CUDA stream), so one bucket crosses
the slow link while the next is reduced inside the node:

  1. intra-node reduce-scatter: local rank l gets the node's sum of chunks {n' g + l}   (g x)
  2. inter-node reduce-scatter (distributed optimizer: rank r keeps its own chunk, done) or
     all-reduce (plain DDP) of those N chunks, in messages of at most the inter threshold;
     with INT8, all-to-all of quantized chunks + fp32 local sum (+ quantized all-gather)
  3. intra-node all-gather (plain DDP only).

The engine waits for every bucket before the optimizer step (`finish_grad_sync`), so what
reaches the optimizer is exactly megatron's reduced gradient, summed in another order.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from megatron_lgs.lgs import compress
from megatron_lgs.lgs.config import LgsConfig
from megatron_lgs.lgs.finebuffer import BufferSync, FineBucket
from megatron_lgs.lgs.plan import (
    MB,
    PlanConfig,
    Unit,
    describe,
    layer_of,
    make_plan,
    message_columns,
)
from megatron_lgs.lgs.topology import Levels, build_levels, gpus_per_node, reduce_scatter
from megatron_lgs.lgs.trace import SyncTrace
from megatron_lgs.lgs.workers import HOPS, first_error, worker

MEGATRON_CORE_VERSION = "0.16.1"  # install() relies on this version's DDP internals


@dataclass
class StepStats:
    """What one step's gradient sync cost, as seen by this rank."""

    comm_seconds: float = 0.0  # time at least one communication thread was busy
    exposed_seconds: float = 0.0  # time the training thread waited for communication
    bytes_intra: int = 0  # sent by this rank (ring algorithm accounting)
    bytes_inter: int = 0
    buckets_fired: int = 0
    inter_messages: int = 0
    peak_inflight_bytes: int = 0
    fires: dict[str, int] = field(default_factory=dict)  # "buffer/bucket" -> times fired
    ignored_ready: int = 0  # grad-ready signals outside the last micro-batch (no_sync)


# -- the engine ---------------------------------------------------------------------------------
class LgsEngine:
    """Layer-wise, hierarchical gradient sync for a model's megatron-core DDP chunks (one, or
    one per virtual pipeline stage)."""

    def __init__(self, ddps: list, config: LgsConfig, *,
                 log: Callable[[str], None] = print) -> None:
        self.config = config
        self.log = log
        self.intra_bytes = int(config.lgs_intra_threshold_mb * MB)
        self.inter_bytes = int(config.lgs_inter_threshold_mb * MB)
        self.memory_cap_bytes = int(config.lgs_memory_cap_mb * MB) \
            if config.lgs_memory_cap_mb else None
        self.per_node, self.per_node_source = gpus_per_node(config.lgs_gpus_per_node)
        self.distributed_optimizer = ddps[0].ddp_config.use_distributed_optimizer
        # --reduce-scatter-with-fp32-accumulation: the same all-to-all reduce-scatter as
        # megatron's buckets, so LGS and megatron differ only in when and over whom they reduce.
        self.all_to_all_reduce_scatter = ddps[0].ddp_config.reduce_scatter_with_fp32_accumulation
        self.cuda = torch.cuda.is_available() and torch.cuda.device_count() > 0
        self.streams = {hop: torch.cuda.Stream() for hop in HOPS} if self.cuda else {}

        names = {p: n for ddp in ddps for n, p in ddp.module.named_parameters()}
        buffers = [(f"{kind}{i if len(ddps) > 1 else ''}", b) for i, ddp in enumerate(ddps)
                   for kind, bufs in (("dense", ddp.buffers),
                                      ("expert", ddp.expert_parallel_buffers))
                   for b in bufs]
        levels = build_levels([b.data_parallel_group for _, b in buffers], self.per_node)
        self.buffers: list[BufferSync] = []
        for (kind, buf), lv in zip(buffers, levels, strict=True):
            d = lv.size
            fine, units, param_units = [], [], {}
            elsize = buf.grad_data.element_size()
            for bucket in buf.buckets:
                numel = bucket.grad_data.numel()
                name = names[bucket.params_list[0]]
                largest = max(bucket.params_list, key=lambda p: p.numel())
                fine.append(FineBucket(bucket, name, -(-numel // d), numel))
                units.append(Unit(name, layer_of(names[largest]), fine[-1].chunk, d * elsize))
                for p in bucket.params_list:
                    param_units[p] = len(units) - 1
            self.buffers.append(BufferSync(f"{kind}.{str(buf.grad_dtype).split('.')[-1]}", lv,
                                           fine, units, param_units))
        self.param_buffer = {p: i for i, bs in enumerate(self.buffers) for p in bs.param_units}

        self._golden: dict[torch.nn.Parameter, int] | None = None
        self._counts: dict[torch.nn.Parameter, int] = {}
        self._ready_times: dict[str, float] = {}
        self._backward_seconds: dict[str, float] | None = None
        self._pending_replan = True
        self._fired: set[tuple[int, int]] = set()
        self._missing: dict[tuple[int, int], int] = {}  # bucket -> parameters not yet ready
        self._outstanding = 0
        self._inflight = 0
        self._active_hops, self._busy_since = 0, 0.0
        self._cond = threading.Condition()
        self.stats = StepStats()
        self.steps = 0
        self.trace = SyncTrace(config.lgs_trace_dir, config.lgs_trace_steps)
        self._replan()

    # -- planning ------------------------------------------------------------------------------
    def plan_config(self, levels: Levels, intra_bytes: int | None = None,
                    inter_bytes: int | None = None) -> PlanConfig:
        c = self.config
        intra = self.intra_bytes if intra_bytes is None else intra_bytes
        inter = self.inter_bytes if inter_bytes is None else inter_bytes
        return PlanConfig(inter if levels.name == "inter" else intra, c.lgs_layer_weighting,
                          self.memory_cap_bytes, c.lgs_split_large_tensors)

    def plan_key(self, intra_mb: float, inter_mb: float) -> tuple:
        """What this rank would run at those thresholds (each buffer's buckets and their
        inter-node messages), without regrouping: equal keys, the same collectives."""
        intra, inter = int(intra_mb * MB), int(inter_mb * MB)
        key = []
        for bs in self.buffers:
            plan = make_plan(bs.units, self.plan_config(bs.levels, intra, inter),
                             self._backward_seconds)
            for b in plan.buckets:
                width = sum(s.hi - s.lo for s in b.segments)
                msgs = tuple(self._inter_pieces(bs, width, inter)) if bs.levels.nodes > 1 else ()
                key.append((bs.key, b.segments, msgs))
        return tuple(key)

    def thresholds_mb(self) -> tuple[float, float]:
        return self.intra_bytes / MB, self.inter_bytes / MB

    def set_thresholds(self, intra_mb: float, inter_mb: float) -> None:
        """Regroup the buckets; only between steps. The fine layout, and so the distributed
        optimizer's shards and the error-feedback residuals, stay as they are."""
        self.intra_bytes, self.inter_bytes = int(intra_mb * MB), int(inter_mb * MB)
        self._replan()

    def _replan(self) -> None:
        for bs in self.buffers:
            bs.replan(self.plan_config(bs.levels), self._backward_seconds)
        self._pending_replan = False

    def describe(self) -> str:
        lines = [f" LGS: {self.per_node} ranks per node ({self.per_node_source}); thresholds "
                 f"intra {self.intra_bytes / MB:.3g} MB, inter {self.inter_bytes / MB:.3g} MB; "
                 f"weighting {self.config.lgs_layer_weighting}; compression "
                 f"{self.config.lgs_compress}"]
        for bs in self.buffers:
            lv = bs.levels
            msgs = [self._inter_pieces(bs, sum(s.hi - s.lo for s in b.segments))
                    for b in bs.plan.buckets] if lv.nodes > 1 else None
            lines.append(f" {bs.key}: data-parallel group of {lv.size} = {lv.nodes} nodes x "
                         f"{lv.per_node}")
            lines.append(describe(bs.plan, lv.name, [len(m) for m in msgs] if msgs else None))
        return "\n".join(lines)

    # -- the DDP's calls -----------------------------------------------------------------------
    def grad_ready(self, param: torch.nn.Parameter, is_last_microbatch: bool) -> None:
        if not is_last_microbatch:
            self.stats.ignored_ready += 1
            return
        self._counts[param] = self._counts.get(param, 0) + 1
        b = self.param_buffer[param]
        bs = self.buffers[b]
        if self._golden is None:  # first step: learn how often each gradient arrives
            self._ready_times[bs.units[bs.param_units[param]].layer] = time.perf_counter()
            return
        if self._counts[param] != self._golden[param]:
            return
        # A bucket fires when the last of its parameters has all its gradient contributions.
        for k in bs.unit_buckets[bs.param_units[param]]:
            missing = self._missing.get((b, k), bs.bucket_params[k]) - 1
            self._missing[(b, k)] = missing
            if missing == 0 and (b, k) not in self._fired:
                self._fire(b, k)

    def start_grad_sync(self, *unused) -> None:
        """Fire every bucket not fired yet (megatron calls this where it wants all grads)."""
        for b, bs in enumerate(self.buffers):
            for k in range(len(bs.plan.buckets)):
                if (b, k) not in self._fired:
                    self._fire(b, k)

    def finish_grad_sync(self, force_all_reduce: bool = False) -> None:
        started = time.perf_counter()
        self.start_grad_sync()
        with self.trace.span("wait for gradient sync", "backward"), self._cond:
            while self._outstanding:
                self._cond.wait()
        for stream in self.streams.values():
            torch.cuda.current_stream().wait_stream(stream)
        self.stats.exposed_seconds += time.perf_counter() - started
        if first_error() is not None:
            raise RuntimeError("LGS gradient sync failed") from first_error()
        if self._golden is None:
            self._golden = dict(self._counts)
            if self.config.lgs_layer_weighting == "measured":
                self._backward_seconds = self._measure_layers()
                self._pending_replan = True

    def reset(self) -> None:
        """Start of a step (megatron's zero_grad_buffer)."""
        if self.stats.buckets_fired:
            self.trace.write(dist.get_rank())
            self.steps += 1
            self.trace.step = self.steps
        self._counts, self._fired, self._missing = {}, set(), {}
        self.stats = StepStats()
        if self._pending_replan:
            self._replan()
            self.log(self.describe())

    def _measure_layers(self) -> dict[str, float]:
        """Backward time per layer from the first step's grad-ready times (a layer's time is
        the gap since the previous layer finished)."""
        ordered = sorted(self._ready_times.items(), key=lambda kv: kv[1])
        seconds, previous = {}, None
        for layer, t in ordered:
            seconds[layer] = 0.0 if previous is None else t - previous
            previous = t
        return seconds

    # -- firing --------------------------------------------------------------------------------
    def _fire(self, b: int, k: int) -> None:
        bs = self.buffers[b]
        nbytes = bs.plan.buckets[k].nbytes
        cap = self.memory_cap_bytes
        waited = time.perf_counter()
        with self._cond:
            # Memory cap: unsynchronized bytes in flight never exceed it. Backpressure stalls
            # the backward, so the wait counts as exposed communication.
            while cap and self._inflight and self._inflight + nbytes > cap:
                self._cond.wait()
            self._inflight += nbytes
            self._outstanding += 1
            self.stats.peak_inflight_bytes = max(self.stats.peak_inflight_bytes, self._inflight)
        self.stats.exposed_seconds += time.perf_counter() - waited
        self._fired.add((b, k))
        self.stats.buckets_fired += 1
        name = f"{bs.key}/{k}"
        self.stats.fires[name] = self.stats.fires.get(name, 0) + 1
        self.trace.event("ready " + name, "i", "backward")
        ready = None
        if self.cuda:
            ready = torch.cuda.Event()
            ready.record()

        def done() -> None:
            with self._cond:
                self._inflight -= nbytes
                self._outstanding -= 1
                self._cond.notify_all()

        worker("intra-node").jobs.put((lambda: self._intra_hop(bs, k, ready), done))

    # -- the reduction (communication threads) --------------------------------------------------
    def _on_stream(self, hop: str, wait_for):
        """The hop's CUDA stream, after `wait_for` (an event); nothing on CPU."""
        if not self.cuda:
            return contextlib.nullcontext()
        self.streams[hop].wait_event(wait_for)
        return torch.cuda.stream(self.streams[hop])

    @contextlib.contextmanager
    def _hop(self, hop: str, wait_for):
        """A hop on its stream. Communication time is the time at least one hop is running
        (so it never exceeds the step, though the two hops may run at once)."""
        with self._cond:
            if not self._active_hops:
                self._busy_since = time.perf_counter()
            self._active_hops += 1
        try:
            with self._on_stream(hop, wait_for):
                yield
        finally:
            with self._cond:
                self._active_hops -= 1
                if not self._active_hops:
                    self.stats.comm_seconds += time.perf_counter() - self._busy_since

    def _intra_hop(self, bs: BufferSync, k: int, ready):
        """1. Stage the bucket (scaled) and reduce-scatter it inside the node: local rank l gets
        the node's sum of rows {n' g + l}. Hands the rest to the inter-node thread."""
        lv = bs.levels
        n, g = lv.nodes, lv.per_node
        handoff = None
        with self._hop("intra-node", ready):
            staging = bs.stage(k)  # [g, n, width]
            part = staging[0]
            if g > 1:
                with self.trace.span(f"intra reduce-scatter {bs.key}/{k}", "intra-node"):
                    part = torch.empty(n, staging.shape[2], dtype=staging.dtype,
                                       device=staging.device)
                    reduce_scatter(part.view(-1), staging.view(-1), lv.intra,
                                   all_to_all=self.all_to_all_reduce_scatter)
                self.stats.bytes_intra += (g - 1) * part.numel() * part.element_size()
            if self.cuda:
                handoff = torch.cuda.Event()
                handoff.record()
        return worker("inter-node"), lambda: self._inter_hop(bs, k, part, handoff)

    def _inter_hop(self, bs: BufferSync, k: int, part: torch.Tensor, handoff) -> None:
        """2. The inter-node hop, in messages of at most the inter threshold; 3. (plain DDP)
        the intra-node all-gather; then the reduced columns go back into megatron's buffer."""
        lv, segments = bs.levels, bs.plan.buckets[k].segments
        n, g = lv.nodes, lv.per_node
        with self._hop("inter-node", handoff):
            result = part
            if n > 1:
                compressed = self.config.lgs_compress == "int8"
                if compressed:
                    send_res = self._residual_rows(bs, segments, bs.send_residual, n)
                    gather_res = self._residual_rows(bs, segments, bs.gather_residual, 1)
                outputs = []
                for lo, hi in self._inter_pieces(bs, part.shape[1]):
                    piece = part[:, lo:hi].contiguous()
                    outputs.append(self._inter(bs, piece, send_res[:, lo:hi],
                                               gather_res[:, lo:hi]) if compressed
                                   else self._inter(bs, piece))
                if compressed:
                    self._store_residual_rows(bs, segments, bs.send_residual, send_res)
                    self._store_residual_rows(bs, segments, bs.gather_residual, gather_res)
                result = outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=-1)
            if self.distributed_optimizer:  # only this rank's chunk (megatron does the same)
                mine = (result if result.dim() == 1 else result[0]).unsqueeze(0)
                self._write_back(bs, segments, mine, lv.rank)
            else:
                full = result
                if g > 1:
                    with self.trace.span(f"intra all-gather {bs.key}/{k}", "inter-node"):
                        gathered = torch.empty(g, n, result.shape[-1], dtype=result.dtype,
                                               device=result.device)
                        dist.all_gather_into_tensor(gathered.view(-1), result.reshape(-1),
                                                    group=lv.intra_gather)
                    self.stats.bytes_intra += (g - 1) * result.numel() * result.element_size()
                    full = gathered.transpose(0, 1).reshape(lv.size, -1)
                self._write_back(bs, segments, full, None)

    def _write_back(self, bs: BufferSync, segments, values: torch.Tensor,
                    row: int | None) -> None:
        off = 0
        for s in segments:
            w = s.hi - s.lo
            bs.fine[s.unit].write(bs.levels.size, s.lo, s.hi, values[:, off:off + w], row)
            off += w

    def _inter_pieces(self, bs: BufferSync, width: int,
                      inter_bytes: int | None = None) -> list[tuple[int, int]]:
        block = self.config.lgs_compress_block if self.config.lgs_compress == "int8" else 1
        column_bytes = bs.levels.nodes * bs.fine[0].bucket.grad_data.element_size()
        return message_columns(width, column_bytes,
                               self.inter_bytes if inter_bytes is None else inter_bytes, block)

    def _inter(self, bs: BufferSync, piece: torch.Tensor, send_res: torch.Tensor | None = None,
               gather_res: torch.Tensor | None = None) -> torch.Tensor:
        """One inter-node message: this rank's node sums of the piece's columns, reduced over
        the nodes (reduce-scatter with the distributed optimizer, else all-reduce)."""
        lv = bs.levels
        n, w = lv.nodes, piece.shape[1]
        compressed = send_res is not None
        self.stats.inter_messages += 1
        with self.trace.span(f"inter {'int8 ' if compressed else ''}"
                        f"{'reduce-scatter' if self.distributed_optimizer else 'all-reduce'}"
                        f" {bs.key}", "inter-node"):
            if compressed:
                out, sent = compress.int8_message(
                    piece, send_res, gather_res, self.config.lgs_compress_block, lv.inter,
                    keep_shard=self.distributed_optimizer)
                self.stats.bytes_inter += sent
                return out.to(piece.dtype)
            if self.distributed_optimizer:
                out = torch.empty(w, dtype=piece.dtype, device=piece.device)
                reduce_scatter(out, piece.view(-1), lv.inter,
                               all_to_all=self.all_to_all_reduce_scatter)
                self.stats.bytes_inter += (n - 1) * out.numel() * out.element_size()
                return out
            dist.all_reduce(piece, group=lv.inter)
            self.stats.bytes_inter += 2 * (n - 1) * w * piece.element_size()
            return piece

    # Residuals live per fine unit in chunk coordinates, so regrouping never disturbs them.
    def _residual_rows(self, bs: BufferSync, segments, store: dict, rows: int) -> torch.Tensor:
        parts = []
        for s in segments:
            if s.unit not in store:
                store[s.unit] = torch.zeros(rows, bs.fine[s.unit].chunk,
                                            device=bs.fine[s.unit].bucket.grad_data.device)
            parts.append(store[s.unit][:, s.lo:s.hi])
        return torch.cat(parts, dim=1)

    def _store_residual_rows(self, bs: BufferSync, segments, store: dict,
                             values: torch.Tensor) -> None:
        off = 0
        for s in segments:
            w = s.hi - s.lo
            store[s.unit][:, s.lo:s.hi] = values[:, off:off + w]
            off += w

    # -- checkpoint ----------------------------------------------------------------------------
    def layout(self) -> str:
        return json.dumps([[bs.key, bs.levels.size, bs.levels.nodes, bs.levels.rank,
                            [u.units for u in bs.units]] for bs in self.buffers])

    def state_dict(self) -> dict:
        """This rank's error-feedback residuals (empty without compression)."""
        return {"layout": self.layout(),
                "send": [{u: t.clone() for u, t in bs.send_residual.items()}
                         for bs in self.buffers],
                "gather": [{u: t.clone() for u, t in bs.gather_residual.items()}
                           for bs in self.buffers]}

    def load_state_dict(self, state: dict, same_layout: bool = True) -> None:
        """Restore this rank's residuals, saved by the rank of the same number. A residual is the
        part of this rank's gradient INT8 has not sent yet: it belongs to this rank's place in
        the saving layout and to its buckets, so after a change of either (`same_layout`: the
        parallel layout is the checkpoint's) it starts from zero, as in a fresh run."""
        if not (any(state["send"]) or any(state["gather"])):
            return
        if self.config.lgs_compress != "int8":
            self.log(" warning: the checkpoint holds INT8 error-feedback residuals; this run "
                     "does not compress, so they are dropped")
            return
        if not same_layout or state["layout"] != self.layout():
            self.log(" the parallel layout or the LGS buckets changed since the checkpoint: its "
                     "INT8 error-feedback residuals (gradient not yet sent) start from zero")
            return
        for bs, send, gather in zip(self.buffers, state["send"], state["gather"], strict=True):
            bs.send_residual = {int(u): t.clone() for u, t in send.items()}
            bs.gather_residual = {int(u): t.clone() for u, t in gather.items()}


# -- installation into megatron-core's DDP (the one place that patches it) -------------------
class _Router:
    """Stands in for a megatron bucket group in the DDP's param -> group map: the backward hook's
    grad-ready signal goes to the engine, everything else to megatron's own group."""

    def __init__(self, group, engine: LgsEngine) -> None:
        self._group = group
        self._engine = engine

    def register_grad_ready(self, param: torch.nn.Parameter, force_all_reduce: bool = False
                            ) -> None:
        self._engine.grad_ready(param, self._group.is_last_microbatch)

    def __getattr__(self, name: str):
        return getattr(self._group, name)


def install(ddps: list, engine: LgsEngine) -> None:
    """Route the gradient sync of megatron-core 0.16.1 DDP chunks through `engine`. They must
    have been built with overlap_grad_reduce=True (so their hooks signal readiness) and
    `fine_bucket_size`. The first chunk's finish waits for every chunk's buckets (megatron
    finishes the chunks together, after the whole backward); the others' then return at once."""
    for ddp in ddps:
        for param, group in list(ddp.param_to_bucket_group.items()):
            ddp.param_to_bucket_group[param] = _Router(group, engine)
        ddp.zero_grad_buffer = _then(ddp.zero_grad_buffer, engine.reset)
        ddp.start_grad_sync = engine.start_grad_sync
        ddp.finish_grad_sync = _rearming_param_gather(ddp, engine.finish_grad_sync)
        ddp.lgs = engine


def _rearming_param_gather(ddp, finish: Callable[..., None]) -> Callable[..., None]:
    """`finish` and then what megatron's bucket groups' own finish_grad_sync does besides the
    gradients: mark the next step's parameter all-gather not dispatched. Under
    --overlap-param-gather the forward pre-hooks start a bucket's gather only where that mark is
    down; left up, every step after the first ran on stale weights outside each rank's shard
    (found 2026-12-07 by bench/layout_sweep.py: 1.7e-2 off one process at the second step)."""
    groups = ddp.bucket_groups + ddp.expert_parallel_bucket_groups

    def rearmed(force_all_reduce: bool = False) -> None:
        finish(force_all_reduce)
        for group in groups:
            group.param_gather_dispatched = False
    return rearmed


def _then(first: Callable[[], None], second: Callable[[], None]) -> Callable[[], None]:
    def both() -> None:
        first()
        second()
    return both
