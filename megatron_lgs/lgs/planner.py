"""Layout search on the whole-step model: every TP, PP (even splits, or with the embedding and
loss counted as layers where only that divides the model), virtual stages, CP, EP (with experts
split over TP or not), micro-batch, recompute and ZeRO stage that divides the model and the
GPUs, memory first, fastest first.

Branch and bound: the pipeline's compute end (`stepmodel.compute_phase`) is a lower bound of a
layout's step, so layouts are replayed in the order of that bound and the search stops once the
bound exceeds the k-th best whole step found; the answer is the exact top k of the space.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

from megatron_lgs.lgs.grid import GRID_MB
from megatron_lgs.lgs.runcheck import RunError, check_run
from megatron_lgs.lgs.runspec import Run
from megatron_lgs.lgs.stepmemory import MemoryEstimate, estimate_memory
from megatron_lgs.lgs.stepmodel import StepEstimate, compute_phase, predict_run, stage_params
from megatron_lgs.lgs.timeline import MB, Thresholds

TP = (1, 2, 4, 8, 16)
CP = (1, 2, 4)
MICRO = (1, 2, 4, 8)
RECOMPUTE = ("none", "selective", "full")
MAX_PP = 64


@dataclass(frozen=True)
class Plan:
    estimate: StepEstimate
    # LGS's thresholds and what they do: None for Megatron-FSDP (ZeRO 2/3), whose buckets are
    # its own (the trainer refuses --lgs with --use-megatron-fsdp).
    thresholds_mb: tuple[int, int] | None
    threshold_step_s: float  # the step with those thresholds
    grid_spread: float | None  # (slowest - fastest) grid step / fastest

    @property
    def run(self) -> Run:
        return self.estimate.run


def _divisors(n: int, cap: int) -> list[int]:
    return [d for d in range(1, min(n, cap) + 1) if n % d == 0]


def _splits(num_layers: int) -> Iterator[tuple[int, bool]]:
    """(pp, whether the embedding and loss count as layers): even splits, and the stage
    counts that only divide the layers with the embedding and the loss counted (a 126-layer
    model on 8 stages, as NVIDIA's Llama 3.1 405B recipe runs it)."""
    for pp in range(1, MAX_PP + 1):
        if num_layers % pp == 0:
            yield pp, False
        elif pp > 1 and (num_layers + 2) % pp == 0 and (num_layers + 2) // pp >= 2:
            yield pp, True


def layouts(base: Run) -> Iterator[Run]:
    """Every valid layout of `base`'s model on `base.num_gpus` at its global batch."""
    n, experts = base.num_gpus, base.num_experts
    even = replace(base, decoder_first_pipeline_num_layers=0, decoder_last_pipeline_num_layers=0,
                   account_for_embedding_in_pipeline_split=False,
                   account_for_loss_in_pipeline_split=False)
    for tp in TP:
        for pp, counted in _splits(base.num_layers):
            split = replace(even, account_for_embedding_in_pipeline_split=counted,
                            account_for_loss_in_pipeline_split=counted)
            for cp in CP:
                if n % (tp * pp * cp):
                    continue
                dp = n // (tp * pp * cp)
                for ep in _divisors(experts, 64) if experts else [1]:
                    yield from _inner(split, tp, pp, cp, dp, ep)


def _virtual_stages(split: Run, pp: int) -> list[int]:
    """Every virtual-stage count that divides a stage's layers (the embedding and the loss
    counted where `split` counts them): megatron-core takes any, and the published recipes
    run 5, 7, 10, 12 and 20 as well as powers of two."""
    if pp == 1:
        return [1]
    counted = split.account_for_embedding_in_pipeline_split + \
        split.account_for_loss_in_pipeline_split
    return _divisors((split.num_layers + counted) // pp, split.num_layers)


def _inner(base: Run, tp: int, pp: int, cp: int, dp: int, ep: int) -> Iterator[Run]:
    pure_dp = (tp, pp, cp, ep) == (1, 1, 1, 1)
    # Experts split over the TP ranks (megatron-core's default) or whole on each (etp 1, at EP
    # > 1: at EP 1 megatron-core 0.16.1 reduces such experts' gradients as dense ones, and the
    # trainer refuses it); the all-to-all dispatcher (the one megatron-core overlaps), its
    # all-to-alls beside another micro-batch's compute or not (megatron-core's combined 1F1B).
    etps = (tp, 1) if base.num_experts and tp > 1 and ep > 1 else (tp,)
    overlaps = (False, True) if base.num_experts and ep > 1 else (False,)
    for mb in MICRO:
        for vpp in _virtual_stages(base, pp):
            for recompute in RECOMPUTE:
                for zero in (0, 1, 2, 3) if pure_dp else (0, 1):
                    for etp, a2a in itertools.product(etps, overlaps):
                        r = replace(base, tp=tp, pp=pp, cp=cp, dp=dp, ep=ep, etp=etp, vpp=vpp,
                                    micro_batch=mb, recompute=recompute, zero=zero,
                                    distributed_optimizer=zero >= 1, sequence_parallel=tp > 1,
                                    moe_a2a_overlap=a2a, moe_dispatcher="alltoall")
                        try:
                            check_run(r)
                        except RunError:
                            continue
                        # The trainer refuses a model chunk without a transformer layer.
                        if min(map(min, r.layer_split())) >= 1:
                            yield r


def memory(r: Run) -> MemoryEstimate:
    return estimate_memory(r, stage_params(r))


def fits(r: Run) -> bool:
    return memory(r).fits


Candidate = tuple[float, int, Run]


def candidates(base: Run, unfit: list[Run] | None = None) -> list[Candidate]:
    """Every layout that fits in memory with its lower bound (the pipeline's compute end);
    `unfit` collects those that do not."""
    out = []
    for i, r in enumerate(layouts(base)):
        if fits(r):
            out.append((compute_phase(r)[1], i, r))
        elif unfit is not None:
            unfit.append(r)
    return out


def best_of(cands: list[Candidate], top: int = 5,
            where: Callable[[Run], bool] = lambda r: True,
            known: dict[Run, StepEstimate] | None = None) -> list[StepEstimate]:
    """The `top` fastest predicted layouts among `cands` that satisfy `where`, fastest first.
    `known`: predictions to reuse and to add to, shared by searches over the same candidates
    (the planner's questions replay mostly the layouts its main search did)."""
    heap = [c for c in cands if where(c[2])]
    heapq.heapify(heap)
    known = {} if known is None else known
    best: list[StepEstimate] = []
    while heap:
        bound, _, r = heapq.heappop(heap)
        if len(best) >= top and bound >= best[-1].step_time_s:
            break
        if r not in known:
            known[r] = predict_run(r)
        best.append(known[r])
        best.sort(key=lambda e: e.step_time_s)
        del best[top:]
    return best


def search(base: Run, top: int = 5) -> list[StepEstimate]:
    """The `top` fastest predicted layouts of `base`'s model that fit in memory."""
    return best_of(candidates(base), top)


def threshold_sweep(r: Run, grid_mb: list[int] = GRID_MB) -> list[StepEstimate]:
    return [predict_run(r, Thresholds(i * MB, e * MB)) for i in grid_mb for e in grid_mb]


def lgs_applies(r: Run) -> bool:
    """LGS regroups megatron-core DDP's buckets: ZeRO 0/1, not Megatron-FSDP's ZeRO 2/3."""
    return r.zero < 2


def with_thresholds(est: StepEstimate, grid_mb: list[int] = GRID_MB) -> Plan:
    """LGS thresholds for a layout: the fastest grid point whose staging (2 x intra) still fits."""
    if not lgs_applies(est.run):
        return Plan(est, None, est.step_time_s, None)
    sweep = threshold_sweep(est.run, grid_mb)
    room = est.memory.limit_bytes - est.memory.peak_bytes
    ok = [e for e in sweep if 2 * e.sync.thresholds.intra_bytes <= room] or sweep[:1]
    pick = min(ok, key=lambda e: (round(e.step_time_s, 9), e.sync.thresholds.intra_bytes,
                                  e.sync.thresholds.inter_bytes))
    steps = [e.step_time_s for e in sweep]
    th = pick.sync.thresholds
    return Plan(est, (th.intra_bytes // MB, th.inter_bytes // MB), pick.step_time_s,
                (max(steps) - min(steps)) / min(steps))


def model_flags(r: Run) -> list[str]:
    """pretrain_gpt.py flags of the model a Run describes (GPT with learned positions and
    LayerNorm; a launch config keeps its own model flags instead)."""
    f = [f"--num-layers {r.num_layers}", f"--hidden-size {r.hidden}",
         f"--ffn-hidden-size {r.ffn_hidden}", f"--num-attention-heads {r.heads}",
         f"--seq-length {r.seq_length}", f"--max-position-embeddings {r.seq_length}",
         f"--vocab-size {r.vocab}", f"--{r.precision}"]
    if r.kv_heads != r.heads:
        f += ["--group-query-attention", f"--num-query-groups {r.kv_heads}"]
    if r.head_dim * r.heads != r.hidden:
        f.append(f"--kv-channels {r.head_dim}")
    if r.swiglu:
        f.append("--swiglu")
    elif r.bias_gelu_fusion:  # the fused bias-GeLU the plan times is the trainer's tanh GELU
        f.append("--openai-gelu")
    if r.untie_embeddings:
        f.append("--untie-embeddings-and-output-weights")
    if r.num_experts:
        # Without linear biases, as the MoE models the presets stand for (launch/configs/
        # gpt-100b-moe.sh, Mixtral, Qwen3): megatron-core 0.16.1 cannot split biased experts
        # over TP, which the planner searches.
        f += [f"--num-experts {r.num_experts}", f"--moe-router-topk {r.moe_topk}",
              "--disable-bias-linear"]
        if r.moe_ffn_hidden:
            f.append(f"--moe-ffn-hidden-size {r.moe_ffn_hidden}")
    return f


def layout_flags(p: Plan, global_batch: int) -> list[str]:
    """Megatron-LM flags of a plan's layout, batch and (DDP layouts) LGS thresholds."""
    r = p.run
    f = [f"--tensor-model-parallel-size {r.tp}"]
    if r.sequence_parallel:
        f.append("--sequence-parallel")
    f.append(f"--pipeline-model-parallel-size {r.pp}")
    counted = r.account_for_embedding_in_pipeline_split + r.account_for_loss_in_pipeline_split
    if r.account_for_embedding_in_pipeline_split:
        f.append("--account-for-embedding-in-pipeline-split")
    if r.account_for_loss_in_pipeline_split:
        f.append("--account-for-loss-in-pipeline-split")
    if r.vpp > 1:
        per_chunk = (r.num_layers + counted) // (r.pp * r.vpp)
        f.append(f"--num-layers-per-virtual-pipeline-stage {per_chunk}")
    if r.cp > 1:
        f.append(f"--context-parallel-size {r.cp}")
    if r.ep > 1:
        f.append(f"--expert-model-parallel-size {r.ep}")
    if r.num_experts and r.etp != r.tp:
        f.append(f"--expert-tensor-parallel-size {r.etp}")
    if r.num_experts:  # the dispatcher the planner plans (`_inner`)
        f.append(f"--moe-token-dispatcher-type {r.moe_dispatcher}")
    if r.moe_a2a_overlap:
        f.append("--overlap-moe-expert-parallel-comm")
    if r.zero == 1:
        f += ["--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather"]
    elif r.zero >= 2:
        strategy = "optim_grads" if r.zero == 2 else "optim_grads_params"
        # Both overlaps, as the model times them (Megatron-FSDP forces them at ZeRO-3; at
        # ZeRO-2 it forces the reduce-scatter's and gathers the weights blocking unless told).
        f += ["--use-megatron-fsdp", f"--data-parallel-sharding-strategy {strategy}",
              "--overlap-grad-reduce", "--overlap-param-gather"]
        if r.zero == 2:  # the trainer checkpoints Megatron-FSDP's shards at ZeRO-3 only
            f.append("--no-save")
    else:
        f.append("--overlap-grad-reduce")
    if r.recompute == "full":
        f += ["--recompute-granularity full", "--recompute-method uniform",
              "--recompute-num-layers 1"]
    elif r.recompute == "selective":
        f.append("--recompute-granularity selective")
    f += [f"--micro-batch-size {r.micro_batch}", f"--global-batch-size {global_batch}"]
    if p.thresholds_mb is not None:
        f += ["--lgs", f"--lgs-intra-threshold-mb {p.thresholds_mb[0]}",
              f"--lgs-inter-threshold-mb {p.thresholds_mb[1]}"]
    return f
