"""The rules a run (`runspec.Run`) must satisfy across its fields, and the values a field may
take: `check_run` raises `RunError(field, reason)` naming the field that breaks one. Kept apart
from `runspec`, which reads a run's JSON form into a `Run` and calls `check_run` on it; the
planner calls it on every layout it builds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from megatron_lgs.lgs.gpus import GPUS
from megatron_lgs.lgs.workload import SplitError, group_ranks_per_node

if TYPE_CHECKING:
    from megatron_lgs.lgs.runspec import Run

RECOMPUTE = ("none", "selective", "full")
RECOMPUTE_MODULES = ("core_attn", "moe", "moe_act", "layernorm")
MOE_DISPATCHERS = ("alltoall", "allgather", "flex")
PRECISIONS = ("bf16", "fp16", "fp8")
FP8_RECIPES = ("delayed", "current")
POSITION_EMBEDDINGS = ("learned_absolute", "rope", "none")
MAX_STAGE_TENSORS = 1_000_000  # `_check_stage_tensors`


class RunError(ValueError):
    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"field {field!r}: {reason}")
        self.field = field


def divides(field: str, what: str, a: int, b: int) -> None:
    if b % a:
        raise RunError(field, f"{what}")


def fills_nodes(num_gpus: int, gpus_per_node: int) -> bool:
    """Whether `num_gpus` make whole nodes of `gpus_per_node` (or part of one node)."""
    return gpus_per_node >= 1 and num_gpus % min(num_gpus, gpus_per_node) == 0


def stage_tensors_per_layer(r: Run) -> int:
    """The weight tensors `workload` builds for one layer's gradients: two a local expert
    plus the router and the attention's three (QKV, projection, norm), or six dense."""
    return 2 * (r.num_experts // r.ep) + 4 if r.num_experts else 6


def _check_stage_tensors(r: Run) -> None:
    """Refuse a run whose stages hold more weight tensors than `MAX_STAGE_TENSORS`: the model
    builds every layer's gradient tensors to replay megatron-core's buckets (`workload`), so
    its time and memory grow with them (a million take ~40 s on 2 cores), and a mistyped
    layer or expert count would otherwise run for hours or exhaust memory."""
    layers, per_layer = -(-r.num_layers // r.pp), stage_tensors_per_layer(r)
    if layers * per_layer > MAX_STAGE_TENSORS:
        field = "num_experts" if per_layer > 6 else "num_layers"
        raise RunError(field, f"{layers} layers of {per_layer} weight tensors on a pipeline "
                              f"stage exceed the model's limit of {MAX_STAGE_TENSORS:,} "
                              "tensors a stage")


def check_run(r: Run) -> None:
    """Cross-field rules of a run (raises RunError naming the field)."""
    if r.recompute not in RECOMPUTE:
        raise RunError("recompute", f"must be one of {RECOMPUTE}, got {r.recompute!r}")
    if r.precision not in PRECISIONS:
        raise RunError("precision", f"must be one of {PRECISIONS}, got {r.precision!r}")
    if r.fp8_recipe not in FP8_RECIPES:
        raise RunError("fp8_recipe", f"must be one of {FP8_RECIPES}, got {r.fp8_recipe!r}")
    if r.position_embedding not in POSITION_EMBEDDINGS:
        raise RunError("position_embedding",
                       f"must be one of {POSITION_EMBEDDINGS}, got {r.position_embedding!r}")
    gpu = GPUS[r.gpu]
    if r.precision == "fp8" and gpu.fp8_tflops is None:
        raise RunError("precision", f"{r.gpu} has no FP8 tensor cores")
    if r.precision == "bf16" and not gpu.bf16:
        raise RunError("precision", f"{r.gpu} has no BF16; use fp16")
    if r.zero > 3:
        raise RunError("zero", f"must be 0..3, got {r.zero}")
    divides("heads", f"heads {r.heads} not divisible by tp {r.tp}", r.tp, r.heads)
    divides("kv_heads", f"heads {r.heads} not divisible by kv_heads {r.kv_heads}", r.kv_heads,
             r.heads)
    divides("kv_heads", f"kv_heads {r.kv_heads} not divisible by tp {r.tp}", r.tp, r.kv_heads)
    if r.recompute_modules != ("core_attn",) and r.recompute != "selective":
        raise RunError("recompute_modules", "takes recompute \"selective\" (Megatron-LM's "
                                            "--recompute-granularity selective)")
    if r.dfa_bucket_cap_mb and r.ddp_bucket_size:
        raise RunError("dfa_bucket_cap_mb", "Apex's DistributedFusedAdam has its own buckets; "
                                            "ddp_bucket_size is megatron-core DDP's")
    if r.dfa_bucket_cap_mb and not r.overlap_grad_reduce:
        raise RunError("dfa_bucket_cap_mb", "takes overlap_grad_reduce true (Apex's "
                                            "overlap_grad_sync)")
    if r.ddp_bucket_size and not r.overlap_grad_reduce:
        raise RunError("ddp_bucket_size", "takes overlap_grad_reduce true (without it "
                                          "megatron-core reduces every gradient in one bucket)")
    if r.recompute_num_layers and r.recompute != "full":
        raise RunError("recompute_num_layers", "takes recompute \"full\" (Megatron's block "
                                               "method)")
    _check_stage_tensors(r)
    try:
        r.layer_split()
    except SplitError as e:
        raise RunError(e.field, str(e)) from None
    if r.vpp > 1 and r.pp == 1:
        raise RunError("vpp", "virtual stages need pp > 1")
    divides("global_batch", f"global_batch {r.global_batch} not divisible by micro_batch x dp "
             f"= {r.micro_batch * r.dp}", r.micro_batch * r.dp, r.global_batch)
    if r.vpp > 1 and r.num_micro_batches % r.pp:
        raise RunError("global_batch", f"interleaving needs micro-batches "
                                       f"({r.num_micro_batches}) divisible by pp {r.pp}")
    if r.cp > 1 and r.seq_length % (2 * r.cp):
        raise RunError("seq_length", f"seq_length {r.seq_length} not divisible by 2 x cp")
    if not fills_nodes(r.num_gpus, r.gpus_per_node):
        raise RunError("gpus_per_node", f"{r.num_gpus} GPUs do not fill nodes of "
                                        f"{r.gpus_per_node}")
    if r.num_experts:
        if not 1 <= r.moe_topk <= r.num_experts:
            raise RunError("moe_topk", f"must be in 1..num_experts, got {r.moe_topk}")
        divides("ep", f"num_experts {r.num_experts} not divisible by ep {r.ep}", r.ep,
                 r.num_experts)
        divides("ep", f"ep x etp = {r.ep} x {r.etp} does not divide tp x cp x dp = "
                 f"{r.tp * r.cp * r.dp} (etp, the experts' TP, is tp unless given)",
                 r.ep * r.etp, r.tp * r.cp * r.dp)
        if r.tp > 1 and not r.sequence_parallel:
            raise RunError("sequence_parallel", "MoE with tp > 1 needs sequence parallelism")
    elif r.ep > 1:
        raise RunError("ep", "expert parallelism needs num_experts > 0")
    elif r.etp != r.tp:
        raise RunError("etp", f"expert tensor parallelism ({r.etp}) needs num_experts > 0")
    _check_node_groups(r)
    if r.moe_dispatcher not in MOE_DISPATCHERS:
        raise RunError("moe_dispatcher", f"must be one of {MOE_DISPATCHERS}, got "
                                         f"{r.moe_dispatcher!r}")
    if r.moe_dispatcher == "flex" and (not r.num_experts or r.ep == 1 or r.etp != 1
                                       or r.ep % min(r.ep, r.gpus_per_node)):
        raise RunError("moe_dispatcher", "flex is modelled for MoE with ep > 1, etp 1 and an "
                                         "EP group of whole nodes or part of one")
    if r.moe_a2a_overlap and (r.ep == 1 or r.recompute == "full" or (r.pp > 1 and r.vpp == 1)):
        raise RunError("moe_a2a_overlap", "megatron-core's EP all-to-all overlap needs ep > 1, "
                                          "no full recompute and, with pp > 1, virtual stages")
    if r.moe_a2a_overlap and r.moe_dispatcher == "allgather":
        raise RunError("moe_a2a_overlap", "megatron-core's EP all-to-all overlap runs with the "
                                          "alltoall or flex dispatcher, not allgather")
    if r.delay_wgrad_compute and not r.moe_a2a_overlap:
        raise RunError("delay_wgrad_compute", "megatron-core 0.16 delays the weight gradients "
                                              "only with the EP all-to-all overlap "
                                              "(moe_a2a_overlap)")
    if r.zero >= 2 and r.pp > 1:
        raise RunError("zero", "Megatron-FSDP (zero 2/3) is modelled without pipeline "
                               "parallelism (pp 1)")


def _check_node_groups(r: Run) -> None:
    """The gradient sync's replay places a data-parallel group's ranks evenly on its nodes
    (`workload.Layout.group_shape`); a group that does not (12 DP ranks of TP1 on nodes of 8,
    one node holding ranks of two pipeline stages) is refused, not mispriced."""
    gpn = min(r.gpus_per_node, r.num_gpus)
    groups = [("dp", r.dp * r.cp, r.tp)]
    if r.num_experts:
        groups.append(("ep", r.expert_dp, r.ep * r.etp))
    for field, size, inner in groups:
        if group_ranks_per_node(size, inner, gpn) is None:
            raise RunError(field, f"a data-parallel group of {size} ranks, {gpn // inner} a "
                                  f"node, does not fill nodes of {gpn} GPUs evenly, which the "
                                  "model's gradient sync does not place")
