"""One training run as the whole-step model sees it: model shape, layout, batch, hardware.

`run_from_dict` reads the JSON form `python -m megatron_lgs.lgs.simulate predict` takes and
raises `RunError(field, reason)` for a missing or inconsistent field (the rules across fields
are `runcheck`'s). Three kinds of unset field
are read from the run itself (`run_defaults`, and `read_run` says which): the pipeline split of
a model whose layers do not divide over its stages, the experts' TP (etp 1) where experts
are narrower than hidden or etp = tp cannot fit, and the software of an FP16 run without a
distributed optimizer, CP or experts, Megatron-LM of 2021 (`run_defaults.FP16_SOFTWARE`, and no
sequence parallelism), which replaces the defaults below. Defaults of the nullable fields (null
or absent): gpus_per_node 8,
nic_gbit_per_gpu the profile's usual fabric, ffn_hidden 4 x hidden, kv_heads = heads, head_dim
hidden / heads (the width of one attention head, Megatron's --kv-channels; Qwen3's 128 beside a
hidden of 2048 and 32 heads), cp 1, dp derived, ep 1, vpp 1, recompute none (selective:
Megatron-LM's --recompute-granularity selective, of the `recompute_modules` below), precision
bf16 (fp16 on V100), swiglu false, num_experts 0 (dense), moe_topk 2, distributed_optimizer
false, sequence_parallel true when tp > 1 (megatron-core needs it for MoE with TP and
Megatron-LM's examples set it), and the extensions: zero (0, or 1 with the distributed
optimizer; 2/3 are Megatron-FSDP optim_grads / optim_grads_params, modelled with pp 1; this
trainer runs them with pure data parallelism and the planner proposes them only there), etp
(expert TP, = tp, or 1 as above), moe_ffn_hidden (= ffn_hidden), flash_attention (true,
false on V100), tp_comm_overlap (false, Megatron-LM's default), overlap_grad_reduce (true),
ddp_bucket_size (null: megatron-core DDP's default, max(40M, 1M x DP) parameters a gradient
bucket; N: Megatron-LM's --ddp-bucket-size, a bucket closing once it holds N parameters, so a
small N gives a bucket, and a collective, per weight tensor), dfa_bucket_cap_mb (null:
megatron-core's DDP; N: NeMo 1's distributed optimizer, Apex's DistributedFusedAdam with
`bucket_cap_mb` N, buckets of N MiB of gradients with tensors cut across them, reduced as they
fill on the first stage of a schedule without virtual stages and after each model chunk's last
backward elsewhere (interleaved: pp-rank backwards later), as megatron-core's schedules run
Apex's grad_sync_func; the trainer runs megatron-core's DDP only), overlap_param_gather (=
overlap_grad_reduce), untie_embeddings (true), grad_buffer (true: megatron-core's FP32 main-grad
buffer with fused weight-gradient accumulation; false: Megatron-LM of 2021, FP16 gradients in
param.grad, see `gradbuffer`), overlap_p2p_comm (true: Megatron-Core's
--overlap-p2p-communication, which applies to interleaved schedules only), p2p_scatter_gather
(false; true: Megatron-LM of 2021's default scatter-gather of pipeline sends over the TP group),
tp_async_backward (true: Transformer Engine runs the column-parallel backward's collectives
beside the gradient GEMMs; false: Megatron-LM of 2021's blocking all-reduce, see `tpcomm`),
grad_reduce_in_fp32 (true: gradients accumulated and reduced in FP32, what Megatron-LM's
arguments force with BF16; false: megatron-core's DDP config left at BF16, as NeMo's
Megatron-Bridge performance recipes set it; FP16 runs always use FP16), fp8_recipe (delayed,
Megatron-LM's --fp8-recipe default; current: per-tensor current scaling, NeMo's FP8-CS; read
only when precision is fp8), fp8_params (true: the weights are FP8 parameters, Megatron-LM's
--fp8-param-gather as Megatron-Bridge's FP8 recipes set it; false: BF16 weights beside
Transformer Engine's cached FP8 copy and transpose, 2 B more a parameter, see `stepmemory`; read
only when precision is fp8), tp_only_amax_red (false, Megatron-LM's default: delayed scaling's
amax all-reduce runs over TP x DP x CP; true, its --tp-only-amax-red: over TP x CP only; read
only with fp8 and fp8_recipe delayed, see `stepmodel.fp8_amax_reduction`), async_amax_reduction
(false; true: Transformer Engine before 1.6 under NVTE_ASYNC_AMAX_REDUCTION=1, the all-reduce
waited for only at the next FP8 module, so hidden), and megatron-core's uneven pipeline splits:
decoder_first_pipeline_num_layers / decoder_last_pipeline_num_layers (null: the even share) and
account_for_embedding_in_pipeline_split / account_for_loss_in_pipeline_split (false), with
Megatron-LM's flag names, recompute_num_layers (null: full recompute of every layer; N:
Megatron's block method, the first N layers of each model chunk), moe_a2a_overlap (false; true:
megatron-core's EP all-to-all overlap, --overlap-moe-expert-parallel-comm, Bridge's
moe_a2a_overlap; it needs ep > 1, virtual stages when pp > 1 and no full recompute),
delay_wgrad_compute (false; true: with moe_a2a_overlap, megatron-core's --delay-wgrad-compute,
weight gradients apart from and after the data gradients, as Megatron-LM's, Megatron-Bridge's
and the ModelZoo's overlap recipes set it), qk_layernorm (false; true: a norm on each query and
key head, Qwen3's, --qk-layernorm), position_embedding (learned_absolute, Megatron-LM's
--position-embedding-type default; rope: rotary embeddings applied to every query and key,
charged as element-wise passes; none), rope_fusion (true, Megatron-LM's default: Transformer
Engine's fused kernel; false, its --no-rope-fusion: megatron-core's unfused torch ops; read only
with rope), bias_gelu_fusion (true, Megatron-LM's default: a GELU MLP's bias add and activation
in one kernel, megatron-core's fused bias-GeLU; false: two, one more read and write of FC1's
output forward, as Megatron-LM's --no-bias-gelu-fusion and this trainer's exact GELU run them;
read only without swiglu), dropout (0.1, Megatron-LM's --hidden-dropout and
--attention-dropout; Llama, Qwen and Mixtral recipes set 0.0, which keeps no dropout masks:
memory only, see `stepmemory`),
recompute_modules (Megatron-LM's --recompute-modules, read with recompute "selective"; its
default ["core_attn"]; the modules modelled are core_attn, moe (the whole MoE block, its
all-to-alls included), moe_act (each routed token's expert activation, recomputed before its
second GEMM's backward) and layernorm (with Transformer Engine's spec the attention norm and a
dense MLP's norm are fused into the next GEMM, so only an MoE layer's pre-MLP norm is
recomputed); see `layercost` and `stepmemory`), and moe_dispatcher (alltoall: megatron-core's
all-to-all dispatcher over NCCL, one copy of a token per routed expert; allgather: its
allgather dispatcher (Megatron-LM's and the trainer's default), every token of the expert-TP x
EP group gathered on every rank and the outputs reduce-scattered back,
`moecost.allgather_dispatch_time`; flex: its flex dispatcher with DeepEP's or HybridEP's
kernels, one copy per GPU and across nodes one per node, `moecost.flex_dispatch_time`, modelled
with etp 1), and optimizer_state_bytes (12: the bytes a parameter of the optimizer's own shard
keeps, Megatron's FP32 main weight and two FP32 Adam moments; NeMo 1's distributed_fused_adam,
Apex's DistributedFusedAdam, keeps 10 with its FP32 default beside BF16 weights, the main
weights' low 16 bits only (`store_param_remainders`), 4 with `dtype: bf16` and BF16 weights
(BF16 moments; the weights serve as main), 6 with `dtype: bf16` and FP8 weights (a BF16 main
copy), 12 with FP32 and FP8 weights; see `stepmemory` and `gradbuffer`), and
make_vocab_size_divisible_by (null: vocab is the embedding's rows as given; N: vocab is the
tokenizer's, padded to a multiple of N x TP as Megatron-LM's --make-vocab-size-divisible-by
does, `Run.padded_vocab`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

from megatron_lgs.lgs.gpus import GPUS
from megatron_lgs.lgs.run_defaults import assume
from megatron_lgs.lgs.runcheck import RECOMPUTE_MODULES, RunError, check_run, divides
from megatron_lgs.lgs.workload import (
    Layout,
    ModelConfig,
    SplitError,
    layer_split,
    pipeline_split,
)
from megatron_lgs.vocab_padding import padded_vocab_size

# The model keeps lists per stage and per model chunk and replays each stage's schedule: 1024
# stages, or 4096 chunks, take ~1 s on 2 cores, 4096 stages ~27 s. The published runs of
# bench/ hold at most 64 stages (Narayanan's 1T) and 112 chunks (the H100 README's 462B); a
# pp of 10^9 had exhausted memory, a vpp of 10^5 run for minutes.
MAX_PIPELINE_STAGES, MAX_MODEL_CHUNKS = 1024, 4096


@dataclass(frozen=True)
class Run:
    id: str
    gpu: str
    num_gpus: int
    num_layers: int
    hidden: int
    heads: int
    vocab: int
    seq_length: int
    tp: int
    pp: int
    micro_batch: int
    global_batch: int
    gpus_per_node: int = 8
    nic_gbit_per_gpu: float | None = None
    ffn_hidden: int = 0
    kv_heads: int = 0
    cp: int = 1
    dp: int = 0
    ep: int = 1
    etp: int = 0
    vpp: int = 1
    recompute: str = "none"
    precision: str = "bf16"
    swiglu: bool = False
    num_experts: int = 0
    moe_topk: int = 2
    moe_ffn_hidden: int = 0
    distributed_optimizer: bool = False
    zero: int = 0
    sequence_parallel: bool = False
    flash_attention: bool = True
    tp_comm_overlap: bool = False
    overlap_grad_reduce: bool = True
    ddp_bucket_size: int = 0  # 0: megatron-core's default, max(40M, 1M x DP) parameters
    dfa_bucket_cap_mb: int = 0  # 0: megatron-core's DDP; N: Apex DistributedFusedAdam's buckets
    overlap_param_gather: bool = True
    untie_embeddings: bool = True
    grad_buffer: bool = True
    overlap_p2p_comm: bool = True
    p2p_scatter_gather: bool = False
    tp_async_backward: bool = True
    grad_reduce_in_fp32: bool = True
    fp8_recipe: str = "delayed"
    fp8_params: bool = True
    tp_only_amax_red: bool = False
    async_amax_reduction: bool = False
    decoder_first_pipeline_num_layers: int = 0
    decoder_last_pipeline_num_layers: int = 0
    account_for_embedding_in_pipeline_split: bool = False
    account_for_loss_in_pipeline_split: bool = False
    recompute_num_layers: int = 0
    head_dim: int = 0  # 0: hidden / heads
    moe_a2a_overlap: bool = False
    delay_wgrad_compute: bool = False
    qk_layernorm: bool = False
    position_embedding: str = "learned_absolute"
    rope_fusion: bool = True
    bias_gelu_fusion: bool = True
    dropout: float = 0.1
    recompute_modules: tuple[str, ...] = ("core_attn",)
    moe_dispatcher: str = "alltoall"
    optimizer_state_bytes: int = 12
    # 0: `vocab` is the padded size; N: the tokenizer's, padded to a multiple of N x TP as
    # Megatron-LM's --make-vocab-size-divisible-by does (the planner's runs, which vary TP).
    make_vocab_size_divisible_by: int = 0

    def __post_init__(self) -> None:
        if not self.head_dim:
            object.__setattr__(self, "head_dim", self.hidden // self.heads)

    def recomputed_layers(self, stage: int) -> int:
        """Layers of `stage` whose forward runs again in the backward under full recompute:
        every layer (the uniform method), or with `recompute_num_layers` N Megatron's block
        method, the first N layers of each model chunk."""
        if self.recompute != "full":
            return 0
        chunks = self.layer_split()[stage]
        n = self.recompute_num_layers
        return sum(min(n, c) for c in chunks) if n else sum(chunks)

    def layer_split(self) -> list[list[int]]:
        """Transformer layers per [stage][virtual chunk] (`workload.layer_split`)."""
        return layer_split(self.num_layers, self.pp, self.vpp, *pipeline_split(self).values())

    @property
    def stage_layers(self) -> list[int]:
        return [sum(chunks) for chunks in self.layer_split()]

    @property
    def num_micro_batches(self) -> int:
        return self.global_batch // (self.micro_batch * self.dp)

    @property
    def padded_vocab(self) -> int:
        """The embedding's and output layer's rows: `vocab` padded as the trainer pads it."""
        div = self.make_vocab_size_divisible_by
        return padded_vocab_size(self.vocab, div, self.tp) if div else self.vocab

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def expert_ffn(self) -> int:
        return self.moe_ffn_hidden or self.ffn_hidden

    @property
    def expert_dp(self) -> int:
        """The expert layers' data-parallel size: the GPUs of a stage over EP x expert TP."""
        return self.tp * self.cp * self.dp // (self.ep * self.etp)


REQUIRED = ("id", "gpu", "num_gpus", "num_layers", "hidden", "heads", "vocab", "seq_length",
            "tp", "pp", "micro_batch", "global_batch")
# What the issue's `predict` interface names: REQUIRED and these nullable fields. Every other
# field is this model's own extension, which a caller of that interface does not know.
ISSUE_FIELDS = REQUIRED + ("gpus_per_node", "nic_gbit_per_gpu", "ffn_hidden", "kv_heads", "cp",
                           "dp", "ep", "vpp", "recompute", "precision", "swiglu", "num_experts",
                           "moe_topk", "distributed_optimizer", "sequence_parallel")
_FIELDS = frozenset(f.name for f in fields(Run))
_INTS = {f.name for f in fields(Run) if f.type == "int"}
_ZERO_ALLOWED = ("num_experts", "zero")  # the other integer fields keep 0 for "the default"
_BOOLS = {f.name for f in fields(Run) if f.type == "bool"}


def _typed(name: str, value: Any) -> Any:
    if name in _BOOLS:
        if not isinstance(value, bool):
            raise RunError(name, f"must be true or false, got {value!r}")
        return value
    if name in _INTS:
        if isinstance(value, bool) or not isinstance(value, int):
            raise RunError(name, f"must be an integer, got {value!r}")
        least = 0 if name in _ZERO_ALLOWED else 1
        if value < least:
            raise RunError(name, f"must be >= {least}, got {value}")
        return value
    if name == "nic_gbit_per_gpu":
        if (isinstance(value, bool) or not isinstance(value, int | float)
                or not math.isfinite(value) or value <= 0):
            raise RunError(name, f"must be a positive finite number, got {value!r}")
        return float(value)
    if name == "recompute_modules":
        if not isinstance(value, list | tuple) or not value or any(
                m not in RECOMPUTE_MODULES for m in value):
            raise RunError(name, f"must be a non-empty list of {RECOMPUTE_MODULES} (the "
                                 f"modules modelled), got {value!r}")
        return tuple(value)
    if name == "dropout":
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1:
            raise RunError(name, f"must be a probability in [0, 1), got {value!r}")
        return float(value)
    return str(value)


def run_to_dict(r: Run) -> dict[str, Any]:
    """`r` as `run_from_dict` reads it back: the integers Run keeps at 0 for "the default" as
    null, the recompute modules as a list."""
    d = asdict(r)
    d["recompute_modules"] = list(r.recompute_modules)
    return {k: None if k in _INTS and k not in _ZERO_ALLOWED and v == 0 else v
            for k, v in d.items()}


def run_from_dict(d: dict[str, Any]) -> Run:
    """A validated Run; unknown keys are ignored, nulls take the documented defaults."""
    return read_run(d)[0]


def read_run(d: dict[str, Any]) -> tuple[Run, dict[str, Any]]:
    """`run_from_dict`'s Run, and the fields it left null that were read from the run itself
    rather than given a fixed default (`run_defaults.assume`)."""
    if not isinstance(d, dict):
        raise RunError("run", "must be a JSON object")
    given = {k: v for k, v in d.items() if k in _FIELDS and v is not None}
    for name in REQUIRED:
        if name not in given:
            raise RunError(name, "missing")
    vals = {k: _typed(k, v) for k, v in given.items()}
    if vals["gpu"] not in GPUS:
        raise RunError("gpu", f"unknown gpu {vals['gpu']!r}; known: {sorted(GPUS)}")
    vals.setdefault("ffn_hidden", 4 * vals["hidden"])
    vals.setdefault("kv_heads", vals["heads"])
    if "head_dim" not in vals:
        divides("hidden", f"hidden {vals['hidden']} not divisible by heads {vals['heads']} "
                 "(give head_dim)", vals["heads"], vals["hidden"])
    tp, pp, cp = vals["tp"], vals["pp"], vals.get("cp", 1)
    if vals["num_gpus"] % (tp * pp * cp):
        raise RunError("num_gpus", f"{vals['num_gpus']} not divisible by tp x pp x cp = "
                                   f"{tp * pp * cp}")
    dp = vals["num_gpus"] // (tp * pp * cp)
    if vals.setdefault("dp", dp) != dp:
        raise RunError("dp", f"tp x pp x cp x dp = {tp * pp * cp * vals['dp']} != num_gpus "
                             f"{vals['num_gpus']}")
    vals.setdefault("precision", "fp16" if vals["gpu"] == "v100-32gb" else "bf16")
    if pp > MAX_PIPELINE_STAGES:
        raise RunError("pp", f"{pp} stages exceed the model's limit of {MAX_PIPELINE_STAGES}")
    if (chunks := pp * vals.get("vpp", 1)) > MAX_MODEL_CHUNKS:
        raise RunError("vpp", f"pp x vpp = {chunks} model chunks exceed the model's limit of "
                              f"{MAX_MODEL_CHUNKS}")
    try:
        assumed = assume(vals)
    except SplitError as e:
        raise RunError(e.field, str(e)) from None
    vals.update(assumed)
    vals.setdefault("etp", vals["tp"])
    vals.setdefault("sequence_parallel", vals["tp"] > 1)
    vals.setdefault("flash_attention", vals["gpu"] != "v100-32gb")
    dist = vals.get("distributed_optimizer", False)
    if dist and vals.get("zero", 1) == 0:
        raise RunError("zero", "0 contradicts distributed_optimizer true")
    vals.setdefault("zero", 1 if dist else 0)
    vals["distributed_optimizer"] = vals["zero"] >= 1
    vals.setdefault("overlap_param_gather", vals.get("overlap_grad_reduce", True))
    run = Run(**vals)
    check_run(run)
    return run, assumed


def unknown_fields(d: dict[str, Any]) -> list[str]:
    """Keys of a run's JSON object that are not run fields (ignored: a misspelt field would
    otherwise take its default unseen)."""
    return [k for k in d if k not in _FIELDS]


def inert_fields(d: dict[str, Any], r: Run) -> list[str]:
    """Fields a run's JSON object sets (non-null) that cannot act on run `r`: the software
    ignores them there (or refuses them, as Megatron-LM refuses --overlap-param-gather without
    a distributed optimizer) and the model ignores them: FP8 knobs without FP8, delayed
    scaling's amax knobs under current scaling, MoE knobs without experts, TP knobs at tp 1,
    RoPE fusion without RoPE, the parameter-gather overlap without a distributed optimizer,
    the interleaved schedule's send overlap without virtual stages, pipeline knobs at pp 1,
    the NIC on a single node."""
    no_fp8 = r.precision != "fp8"
    no_delayed = no_fp8 or r.fp8_recipe != "delayed"
    rules = {
        "fp8_recipe": no_fp8, "fp8_params": no_fp8,
        "tp_only_amax_red": no_delayed, "async_amax_reduction": no_delayed,
        "moe_topk": not r.num_experts, "moe_ffn_hidden": not r.num_experts,
        "moe_dispatcher": not r.num_experts,
        "sequence_parallel": r.tp == 1, "tp_comm_overlap": r.tp == 1,
        "tp_async_backward": r.tp == 1,
        "rope_fusion": r.position_embedding != "rope",
        "bias_gelu_fusion": r.swiglu,
        "overlap_param_gather": r.zero == 0,
        "overlap_p2p_comm": r.vpp == 1, "p2p_scatter_gather": r.pp == 1,
        "nic_gbit_per_gpu": r.num_gpus <= r.gpus_per_node,
    }
    return [k for k, v in d.items() if v is not None and rules.get(k, False)]


def model_fields(m: ModelConfig) -> dict[str, Any]:
    """The Run fields of an LGS-simulator model (`workload.ModelConfig`)."""
    return dict(num_layers=m.num_layers, hidden=m.hidden, ffn_hidden=m.ffn_hidden,
                heads=m.num_heads, kv_heads=m.num_query_groups or m.num_heads, vocab=m.vocab,
                seq_length=m.seq_length, swiglu=m.swiglu, num_experts=m.num_experts,
                moe_topk=m.moe_topk, moe_ffn_hidden=m.moe_ffn_hidden or 0,
                untie_embeddings=m.untie_embeddings, head_dim=m.head_dim)


def layout_fields(m: ModelConfig, lay: Layout) -> dict[str, Any]:
    """The Run fields of an LGS-simulator layout (`workload.Layout`) for model `m`."""
    return dict(num_gpus=lay.world, tp=lay.tp, pp=lay.pp, dp=lay.dp, ep=lay.ep,
                etp=lay.etp if m.num_experts else lay.tp, gpus_per_node=lay.gpus_per_node,
                micro_batch=lay.micro_batch_size, sequence_parallel=lay.tp > 1,
                global_batch=lay.micro_batch_size * lay.num_micro_batches * lay.dp,
                zero=1 if lay.distributed_optimizer else 0,
                distributed_optimizer=lay.distributed_optimizer,
                grad_reduce_in_fp32=lay.grad_bytes == 4, **pipeline_split(lay))
