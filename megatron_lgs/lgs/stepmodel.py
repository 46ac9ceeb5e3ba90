"""The whole-step model: one training step of a run, term by term, from kernels to the sync.

Per micro-batch and pipeline stage, every op of a layer is timed by `layercost` on `kernels`
(GEMMs on a roofline with the profile's shape-dependent efficiency; attention with its s^2
part, fused or as batched GEMMs plus softmax/dropout traffic; memory-bound norms, activations,
dropouts, RoPE and FP8 casts), and the model-parallel communication is added where Megatron
puts it on the critical path:

- tensor parallel: each linear layer's collectives (all-reduces, or with sequence parallelism
  all-gathers and reduce-scatters, 4 forward and 6 backward per layer) on the intra-node link
  (inter-node when tp > gpus_per_node), exposed beyond the GEMM the code pairs each with
  (`tpcomm`);
- context parallel: the K/V ring (cp - 1 hops forward, K/V and their gradients backward),
  overlapped with the attention kernel, exposed beyond it;
- MoE (`moecost`): dispatch and combine all-to-alls on the expert-parallel group, forward and
  backward, exposed (megatron-core 0.16's default) or, with `moe_a2a_overlap`, beside another
  micro-batch's compute, and with expert tensor
  parallelism the gather and scatter of the dispatched tokens over its group
  (`tpcomm.expert_tp_comm`);
- pipeline: one activation send forward and one gradient send backward per micro-batch and
  virtual chunk (s b h / tp bytes with sequence parallelism or 2021's scatter-gather, which
  all-gathers it over TP after receiving; s b h without either), blocking as in 1F1B,
  or, interleaved with `overlap_p2p_comm`, exposed only beyond one chunk's compute;
- recompute: `full` runs each layer's forward (with its communication) again before its
  backward (with `recompute_num_layers` N, Megatron's block method: the first N layers of
  each model chunk), `selective` the modules of `recompute_modules`
  (`layercost.selective_recompute`);
- FP8 amax all-reduces, blocking, at NCCL's latency: delayed scaling's once per chunk and
  micro-batch each way over TP x DP x CP or TP x CP (`fp8_amax_reduction`), current scaling's
  per layer over TP under sequence parallelism (`layercost.current_scaling_amax`);
- host: each layer direction lasts at least the time the host needs to issue its kernels
  (`host_overhead`, binding only for small layers).

The pipeline runs M micro-batches: compute ends at M max_k c_k + (sum_k c_k - max_k c_k) / v
(c_k = forward + backward of stage k per micro-batch; v virtual stages), the 1F1B / interleaved
bubble being the second term, plus, interleaved with overlapped sends, the sends its warm-up
and cool-down wait for (`interleaved_fill_latency`), and with FP8 the weight cache the first
micro-batch makes on its way through every stage (`fp8_weight_cache`). The data-parallel
gradient sync is the LGS replay (`timeline`) on those stage times, with Megatron's default
buckets unless thresholds are given. After it: with tied embeddings and a pipeline, the
all-reduce of the embedding's gradient between the first and the last stage
(`tied_embedding_sync`); the distributed optimizer's parameter all-gather (ZeRO 1/2;
overlapped with the next forward when `overlap_param_gather`), or ZeRO 3's per-micro-batch
gathers, and the optimizer step as a memory-bound pass over this GPU's shard, and the gradient
bookkeeping around the GEMMs (the per-micro-batch accumulation the GEMMs do not fuse, the
per-step zeroing and scaling or flattening of the gradient buffer), both counted in
`gradbuffer`. Every NCCL collective that
runs beside compute (the replay's reductions, the overlapped gathers, ZeRO's per-micro-batch
traffic, TE's asynchronous TP collectives, the overlapped all-to-alls) holds
`gpus.NCCL_COMM_SMS` SMs the compute lacks meanwhile. The GEMMs and attention of a job of N
GPUs run at the pace of the slowest of the N (`gpus.slowest_gpu`). Every number is a prediction.
"""

from __future__ import annotations

from dataclasses import dataclass

from megatron_lgs.lgs.baselines import megatron_default_bucket_bytes
from megatron_lgs.lgs.costmodel import (
    HardwareProfile,
    Link,
    all_gather_time,
    ring_allreduce_time,
)
from megatron_lgs.lgs.flops import model_flops_per_step
from megatron_lgs.lgs.gpus import (
    NCCL_COMM_SMS,
    GpuProfile,
    get_gpu,
    link_profile,
    slowest_gpu,
)
from megatron_lgs.lgs.gradbuffer import accumulate_bytes, optimizer_bytes_per_param, step_bytes
from megatron_lgs.lgs.kernels import (
    memory_time,
    nccl_beside,
    sm_contention,
    small_allreduce_time,
    tp_collective_time,
)
from megatron_lgs.lgs.layercost import (
    FP8_QUANTIZE_BYTES,
    TERMS,
    Cost,
    layer_cost,
    logits_cost,
)
from megatron_lgs.lgs.runspec import Run, layout_fields, model_fields
from megatron_lgs.lgs.stepmemory import MemoryEstimate, estimate_memory, grad_bytes
from megatron_lgs.lgs.timeline import (
    MB,
    ONE_BUCKET,
    StepPrediction,
    Thresholds,
    Workload,
    chunk_ops,
    ddp_buckets,
    replay,
)
from megatron_lgs.lgs.tpcomm import tp_link
from megatron_lgs.lgs.workload import (
    DENSE,
    EXPERT,
    Layout,
    ModelConfig,
    pipeline_split,
    stage_numel,
)


@dataclass(frozen=True)
class StepEstimate:
    run: Run
    step_time_s: float
    model_flops: float
    breakdown: dict[str, float]
    memory: MemoryEstimate
    sync: StepPrediction

    @property
    def tflops_per_gpu(self) -> float:
        return self.model_flops / self.step_time_s / self.run.num_gpus / 1e12

    @property
    def mfu(self) -> float:
        return self.tflops_per_gpu / get_gpu(self.run.gpu).peak_tflops

    @property
    def fits_memory(self) -> bool:
        return self.memory.fits


def p2p_time(r: Run, hw: HardwareProfile) -> float:
    """One pipeline send of a micro-batch's activation (or its gradient) to the next stage."""
    if r.pp == 1:
        return 0.0
    link = pipeline_link(r, hw)
    full = r.micro_batch * r.seq_length / r.cp * r.hidden * 2
    # With sequence parallelism the activation is already the s / tp shard; Megatron-LM of 2021
    # (`p2p_scatter_gather`) sent a 1 / tp slice and all-gathered it over the TP group after
    # receiving (`gather_split_1d_tensor`); megatron-core without SP sends it whole.
    split = r.sequence_parallel or r.p2p_scatter_gather
    one = link.alpha_s + (full / r.tp if split else full) / link.bandwidth_Bps
    if r.p2p_scatter_gather and not r.sequence_parallel:
        one += tp_collective_time("all_gather", full, r.tp, tp_link(r, hw))
    return one


def interleaved_fill_latency(r: Run, hw: HardwareProfile) -> float:
    """What the pipeline sends add to the interleaved schedule's warm-up and cool-down when
    overlapped (`overlap_p2p_comm`). Megatron-core runs each stage's chunks in a fixed order
    (`forward_backward_pipelining_with_interleaving`: (pp - rank - 1) x 2 + (vpp - 1) x pp
    warm-up forwards, chunk by chunk, pp micro-batches each); a micro-batch reaches chunk j of
    stage 0 only after j trips round all pp stages, one send each, while the stage has only the
    pp forwards of the chunk before to fill the wait. So every trip adds pp sends to the
    warm-up, vpp - 1 trips plus the pp - 1 sends of the first fill, and the cool-down mirrors
    it: 2 x ((vpp - 1) x pp + pp - 1) sends, whatever the micro-batch count. In the steady
    state a send hides behind a chunk's compute (`stage_costs`). A test replays that order
    event by event."""
    if r.pp == 1 or r.vpp == 1 or not r.overlap_p2p_comm:
        return 0.0
    return 2 * ((r.vpp - 1) * r.pp + r.pp - 1) * p2p_time(r, hw)


def fp8_weight_cache(r: Run, gpu: GpuProfile) -> float:
    """What Transformer Engine's FP8 weight cache adds to the step. Each model chunk's first
    forward of a step makes it (megatron-core's `set_is_first_microbatch`; TE keeps it for the
    later micro-batches): BF16 weights cast and transposed to FP8, FP8_QUANTIZE_BYTES of the
    recipe per element, FP8 parameters (`fp8_params`) only transposed, 2 B. The first
    micro-batch meets every chunk of every stage in turn before any other can follow it, so the
    step grows by the stages' cache times added up (a test replays megatron-core's order). The
    GEMM weights of the layers only: the embedding and the output layer stay BF16."""
    if r.precision != "fp8":
        return 0.0
    per_element = 2.0 if r.fp8_params else FP8_QUANTIZE_BYTES[r.fp8_recipe]
    return memory_time(r.num_layers * sum(layer_gemm_weights(r)) * per_element, gpu)


def fp8_amax_reduction(r: Run) -> float:
    """One of Transformer Engine's delayed-scaling amax all-reduces: megatron-core wraps a
    model chunk's forward in one `fp8_autocast` (`get_fp8_context`), whose exit, and the
    backward of the chunk's first FP8 module, reduce the amaxes of every FP8 tensor of the
    chunk in one blocking all-reduce (`reduce_tensor_across_group_op_max`, `async_op=False`;
    TE 1.6 to 2.11), so twice per micro-batch and chunk on the compute stream's path. Its
    group (`get_amax_reduction_group`) is TP x DP x CP, the num_gpus / pp ranks megatron-core
    lays out contiguously, or TP x CP with `tp_only_amax_red`; a few KB, so NCCL's latency.
    Current scaling keeps no amax history and reduces nothing here; TE before 1.6 could run it
    asynchronously (`async_amax_reduction`), waiting for it only at the next FP8 module."""
    if r.precision != "fp8" or r.fp8_recipe != "delayed" or r.async_amax_reduction:
        return 0.0
    ranks = r.tp * r.cp if r.tp_only_amax_red else r.num_gpus // r.pp
    return small_allreduce_time(ranks, r.gpus_per_node)


def stage_costs(r: Run, gpu: GpuProfile, hw: HardwareProfile) -> list[Cost]:
    layer = layer_cost(r, gpu, hw)
    amax = r.vpp * fp8_amax_reduction(r)
    stage_layers = r.stage_layers
    one = p2p_time(r, hw)
    out = []
    for k, (dense, expert) in enumerate(stage_params(r)):
        c = Cost()
        c.add(layer, stage_layers[k])
        if r.recompute == "full":  # block recompute: only the first N layers of each chunk
            c.bwd["recompute"] = r.recomputed_layers(k) * layer.bwd["recompute"]
        if k == r.pp - 1:
            c.add(logits_cost(r, gpu))
        c.fwd["pp_p2p"] = c.bwd["pp_p2p"] = r.vpp * one
        c.fwd["fp8_amax_reduction"] += amax  # beside current scaling's, per layer
        c.bwd["fp8_amax_reduction"] += amax
        if r.vpp > 1 and r.overlap_p2p_comm:
            # Interleaved with --overlap-p2p-communication (Megatron-Core's default): each
            # chunk's send/recv is posted asynchronously and waited for only before the
            # chunk that needs it, so it hides behind one chunk's compute.
            chunk = stage_layers[k] / r.vpp
            c.fwd["pp_p2p"] = r.vpp * max(0.0, one - chunk * layer.fwd_s)
            c.bwd["pp_p2p"] = r.vpp * max(0.0, one - chunk * layer.bwd_s)
        embedding = r.padded_vocab * r.hidden / r.tp if k == 0 else 0.0
        c.bwd["grad_buffer"] = memory_time(accumulate_bytes(r, dense + expert, embedding), gpu)
        out.append(c)
    return out


def sync_workload(r: Run, hw: HardwareProfile) -> Workload:
    """The LGS replay's view of the run (its DP group is data x context ranks)."""
    model = ModelConfig(num_layers=r.num_layers, hidden=r.hidden, ffn_hidden=r.ffn_hidden,
                        num_heads=r.heads, vocab=r.padded_vocab, seq_length=r.seq_length,
                        num_query_groups=r.kv_heads, swiglu=r.swiglu,
                        num_experts=r.num_experts, moe_topk=r.moe_topk,
                        moe_ffn_hidden=r.moe_ffn_hidden or None,
                        untie_embeddings=r.untie_embeddings, kv_channels=r.head_dim)
    lay = Layout(tp=r.tp, pp=r.pp, dp=r.dp * r.cp, ep=r.ep, etp=r.etp,
                 gpus_per_node=min(r.gpus_per_node, r.num_gpus),
                 micro_batch_size=r.micro_batch, num_micro_batches=r.num_micro_batches,
                 grad_bytes=grad_bytes(r), distributed_optimizer=r.distributed_optimizer,
                 **pipeline_split(r))
    return Workload(model, lay, hw)


def ddp_bucket_params(r: Run) -> int:
    """Parameters a data-parallel gradient bucket holds: Apex DistributedFusedAdam's
    `bucket_cap_mb` MiB of gradients, else megatron-core DDP's --ddp-bucket-size or its
    default over the data-parallel group with CP."""
    if r.dfa_bucket_cap_mb:
        return r.dfa_bucket_cap_mb * MB // grad_bytes(r)
    return r.ddp_bucket_size or megatron_default_bucket_bytes(r.dp * r.cp, 1)


def ddp_thresholds(r: Run, w: Workload) -> Thresholds:
    """The data-parallel engine's buckets, of `ddp_bucket_params`: megatron-core's hold whole
    tensors, Apex's cut them (`timeline.ddp_buckets`)."""
    return ddp_buckets(ddp_bucket_params(r) * w.layout.grad_bytes, split=r.dfa_bucket_cap_mb > 0)


def _gather_time(w: Workload, hw: HardwareProfile, numel: dict[str, float]) -> float:
    """Hierarchical all-gather of this stage's BF16 weights over their data-parallel groups."""
    total = 0.0
    for group in (DENSE, EXPERT):
        n = numel[group] * 2.0
        if n == 0:
            continue
        g, m = w.layout.group_shape(group)
        total += all_gather_time(n, g, hw.intra) + all_gather_time(n / g, m, hw.inter)
    return total


def _first_buckets(r: Run, w: Workload, stage: int) -> dict[str, float]:
    """Parameters per gradient group of the bucket the stage's forward reaches first.
    megatron-core fills a buffer's buckets in backward order, closing one at its size
    (`ddp_bucket_params`), so the first in forward order holds what is left over at the
    chunk's start (the embedding, on the first stage), or the last bucket closed; Apex's
    buckets, which cut tensors, hold at most their size."""
    size = ddp_bucket_params(r)
    first = {DENSE: 0.0, EXPERT: 0.0}
    closed = dict(first)
    for op in chunk_ops(w.model, w.layout, stage, r.vpp)[-1]:
        for g in op.grads:
            first[g.group] += g.numel
            if first[g.group] >= size:
                closed[g.group], first[g.group] = first[g.group], 0.0
    most = size if r.dfa_bucket_cap_mb else float("inf")
    return {group: min(first[group] or closed[group], most) for group in first}


def _gather_exposed(r: Run, w: Workload, stage: int, gather_s: float, fwd_s: float,
                    first_s: float) -> float:
    """What the distributed optimizer's overlapped parameter all-gather (`gather_s` for the
    stage) leaves exposed. Megatron-core chains the gathers in forward order, one bucket at a
    time: each is launched when the forward reaches the bucket before it. The first bucket
    (`first_s`, `_first_buckets`) is launched when the forward reaches it and waited on at
    once (`finish_param_sync` in 0.16's param_and_grad_buffer.py; with virtual stages the
    schedule launches it just before), so it is exposed; the rest of chunk 0 hides behind its
    own first forward (fwd_s / vpp; without virtual stages the first micro-batch's whole
    forward) and every later chunk behind the pp warm-up forwards of the chunk before it
    (pp fwd_s / vpp)."""
    chunks = [sum(stage_numel(ops).values())
              for ops in chunk_ops(w.model, w.layout, stage, r.vpp)[::-1]]
    total, step = sum(chunks), fwd_s / r.vpp
    first_s = min(first_s, gather_s * chunks[0] / total)
    exposed = first_s + max(0.0, gather_s * chunks[0] / total - first_s - step)
    for n in chunks[1:]:
        exposed += max(0.0, gather_s * n / total - r.pp * step)
    return exposed


def pipeline_link(r: Run, hw: HardwareProfile) -> Link:
    """The link between pipeline stages: megatron-core puts PP outermost, stages tp x cp x dp
    ranks apart, so they share NVLink only when the whole job is one node."""
    return hw.intra if r.num_gpus <= r.gpus_per_node else hw.inter


def tied_embedding_sync(r: Run, hw: HardwareProfile) -> float:
    """The all-reduce of a tied word embedding's gradient between the first and the last
    pipeline stage, which hold one copy each: megatron-core 0.16's `finalize_model_grads`
    (`_allreduce_word_embedding_grads`) runs it after the data-parallel sync has finished and
    before the optimizer, on the whole vocab x hidden / tp main-grad slice."""
    if r.pp == 1 or r.untie_embeddings:
        return 0.0
    return ring_allreduce_time(r.padded_vocab * r.hidden / r.tp * grad_bytes(r), 2,
                               pipeline_link(r, hw))


def layer_gemm_weights(r: Run) -> tuple[int, int]:
    """(attention, MLP or local experts) GEMM weights of one layer on one GPU."""
    h, t = r.hidden, r.tp
    mats = 3 if r.swiglu else 2
    attn = h * (r.q_dim + 2 * r.kv_dim) // t + r.q_dim * h // t
    if r.num_experts:
        return attn, r.num_experts // r.ep * mats * h * r.expert_ffn // r.etp
    return attn, mats * h * r.ffn_hidden // t


def stage_params(r: Run) -> list[tuple[float, float]]:
    """(dense, expert) parameters one GPU of each pipeline stage holds (as `workload` counts)."""
    h = r.hidden
    attn, mlp = layer_gemm_weights(r)
    if r.num_experts:
        # workload's MoE layer carries one norm and the router
        dense, expert = attn + h + h * r.num_experts, mlp
    else:
        dense, expert = attn + 2 * h + mlp, 0
    emb = r.padded_vocab * h // r.tp
    out = []
    for k, per in enumerate(r.stage_layers):
        d = per * dense + (emb if k == 0 else 0)
        if k == r.pp - 1:
            d += h + (emb if r.untie_embeddings or r.pp > 1 else 0)
        out.append((float(d), float(per * expert)))
    return out


def run_gpu(r: Run) -> GpuProfile:
    """The profile `r` computes at: its GPU as the slowest of the run's (`gpus.slowest_gpu`)."""
    return slowest_gpu(get_gpu(r.gpu), r.num_gpus)


def run_links(r: Run, gpu: GpuProfile) -> HardwareProfile:
    """The links of `r`'s nodes and NIC, for the gradient-sync replay."""
    return link_profile(gpu, min(r.gpus_per_node, r.num_gpus), r.nic_gbit_per_gpu)


def compute_phase(r: Run, hw: HardwareProfile | None = None) -> tuple[list[Cost], float, int]:
    """Stage costs per micro-batch, the end of all pipeline compute, and the bottleneck stage
    (`hw` None: the links of `r`'s GPU and NIC).

    The compute end is a lower bound of the step (every later term is >= 0): the planner
    prunes with it before replaying the gradient sync.
    """
    gpu = run_gpu(r)
    hw = hw or run_links(r, gpu)
    costs = stage_costs(r, gpu, hw)
    if r.zero >= 2:
        w = sync_workload(r, hw)
        for c, (dense, expert) in zip(costs, stage_params(r), strict=True):
            numel = {DENSE: dense, EXPERT: expert}
            # Sharded gradients cannot accumulate: every micro-batch's backward reduce-scatters
            # them. The last one's reduction is the replay's (its tail and SM share); the
            # m - 1 before it run beside their backward, spread here over the m micro-batches.
            # ZeRO 3 also gathers the weights before each micro-batch's forward and backward.
            # In a backward the gathers and the reduce-scatters cross the same links, so they
            # hide behind its compute together, not each behind all of it (which had full
            # recompute predict some network-bound steps faster than none); ZeRO 2's is the
            # same with no gather (nccl_beside of nothing is nothing).
            ag, rs = _sharded_traffic(r, w, hw, numel)
            fwd_s, bwd_s = c.fwd_s, c.bwd_s
            earlier = (r.num_micro_batches - 1) / r.num_micro_batches
            alone = nccl_beside(ag, bwd_s, gpu)
            c.bwd["dp_grad_sync"] = earlier * (nccl_beside(rs + ag, bwd_s, gpu) - alone)
            if ag:
                c.fwd["param_all_gather"] = nccl_beside(ag, fwd_s, gpu)
                c.bwd["param_all_gather"] = alone
    per_mb = [c.fwd_s + c.bwd_s for c in costs]
    crit = max(range(r.pp), key=lambda k: per_mb[k])
    end = (r.num_micro_batches * per_mb[crit] + (sum(per_mb) - per_mb[crit]) / r.vpp
           + interleaved_fill_latency(r, hw) + fp8_weight_cache(r, gpu))
    return costs, end, crit


def _sharded_traffic(r: Run, w: Workload, hw: HardwareProfile,
                     numel: dict[str, float]) -> tuple[float, float]:
    """(the BF16 weights' all-gather, the gradients' reduce-scatter) of one stage's `numel`
    parameters in each micro-batch's backward under ZeRO 2/3 (no gather in ZeRO 2)."""
    gather = _gather_time(w, hw, numel)
    return (gather if r.zero >= 3 else 0.0), gather * grad_bytes(r) / 2


def _sync_cover(r: Run, w: Workload, hw: HardwareProfile, costs: list[Cost],
                numel: list[dict[str, float]]) -> list[float]:
    """Per stage, the stretch of the last backward that the replay's gradient reductions
    can hide behind. Under ZeRO 2/3 the links carry that backward's weight gathers and (the
    spread share of) the earlier micro-batches' reductions too, so the reductions hide only
    behind the compute those leave: with the whole backward as cover, the last micro-batch's
    reductions ran on links its gathers held, and a network-bound ZeRO-3 step came out one
    gather short (fewer micro-batches a step made each one cheaper)."""
    if r.zero < 2:
        return [c.bwd_s for c in costs]
    return [c.bwd_s - c.bwd["dp_grad_sync"] - _sharded_traffic(r, w, hw, n)[0]
            for c, n in zip(costs, numel, strict=True)]


def workload_compute(w: Workload) -> tuple[list[float], list[float], float]:
    """Per-stage forward and backward time per micro-batch and the end of all compute, for the
    LGS simulator's workload on a built-in GPU profile (`timeline.predict_step`): the run is
    the workload's model and layout with the defaults of `runspec.layout_fields` (BF16, no
    recompute, flash attention, sequence parallelism when TP > 1, no virtual stages)."""
    r = Run(id="lgs-workload", gpu=w.hw.gpu, **model_fields(w.model),
            **layout_fields(w.model, w.layout))
    costs, end, _ = compute_phase(r, w.hw)
    return [c.fwd_s for c in costs], [c.bwd_s for c in costs], end


def predict_run(r: Run, thresholds: Thresholds | None = None, *,
                flat_buckets: bool = False) -> StepEstimate:
    """The whole step of `r`; `thresholds` None: megatron-core DDP's buckets
    (`ddp_thresholds`); else LGS's engine at those thresholds, or (`flat_buckets`) a DDP that
    reduces buckets of the intra threshold one after another on one channel (PyTorch DDP's
    `bucket_cap_mb`)."""
    gpu = run_gpu(r)
    hw = run_links(r, gpu)
    w = sync_workload(r, hw)
    costs, compute_end, crit = compute_phase(r, hw)
    numel = [{DENSE: d, EXPERT: e} for d, e in stage_params(r)]
    per_mb = [c.fwd_s + c.bwd_s for c in costs]
    m = r.num_micro_batches
    breakdown = {k: m * (costs[crit].fwd[k] + costs[crit].bwd[k]) for k in TERMS}
    breakdown["pipeline_bubble"] = compute_end - m * per_mb[crit]
    lgs = thresholds is not None and not flat_buckets  # LGS's two-channel engine
    own = ddp_thresholds(r, w)  # the run's own engine: megatron-core's DDP or Apex's
    if thresholds is None:
        thresholds = own if r.overlap_grad_reduce else ONE_BUCKET
    own_engine = thresholds == own
    sync = replay(w, thresholds, [c.fwd_s for c in costs], _sync_cover(r, w, hw, costs, numel),
                  compute_end, bucket_later_stages=not own_engine, pipelined_hops=lgs,
                  vpp=r.vpp if own_engine or lgs else 1,
                  apex=own_engine and r.dfa_bucket_cap_mb > 0)
    breakdown["dp_grad_sync"] += max(0.0, sync.step_time_s - compute_end)
    breakdown["embedding_grad_sync"] = tied_embedding_sync(r, hw)
    after = 0.0
    for k, n in enumerate(numel):
        shard = n[DENSE] / (r.dp * r.cp) + n[EXPERT] / w.layout.expert_dp
        local = shard if r.zero >= 1 else n[DENSE] + n[EXPERT]
        opt = memory_time(local * optimizer_bytes_per_param(r), gpu)
        buf = memory_time(step_bytes(r, shard if r.zero >= 2 else n[DENSE] + n[EXPERT]), gpu)
        gather = _gather_time(w, hw, n) if r.zero in (1, 2) else 0.0
        if r.overlap_param_gather and gather:
            first = _gather_time(w, hw, _first_buckets(r, w, k))
            exposed = _gather_exposed(r, w, k, gather, costs[k].fwd_s, first)
            hidden = gather - exposed
            gather = exposed + sm_contention(hidden, hidden, gpu, NCCL_COMM_SMS)
        if opt + buf + gather >= after:
            after, tail = opt + buf + gather, (opt, buf, gather)
    breakdown["optimizer"] = tail[0]
    breakdown["grad_buffer"] += tail[1]
    breakdown["param_all_gather"] += tail[2]
    step = sync.step_time_s + breakdown["embedding_grad_sync"] + after
    mem = estimate_memory(r, stage_params(r))
    return StepEstimate(r, step, model_flops_per_step(r), breakdown, mem, sync)
