"""Command-line flags (Megatron-LM spellings) parsed once into typed configs, validated up front.

`parse_args()` turns argv into a `Config` of small dataclasses, one per concern, and checks every
cross-flag rule before any process group exists: a bad combination costs one clear line on
stderr and exit code 2, never a traceback from inside megatron-core.

The defaults are the embedded run: a tiny GPT on the bundled corpus, small enough for a CPU.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
from dataclasses import asdict, dataclass, field
from typing import NoReturn

from data_pipeline.tokenizer import MIN_VOCAB_SIZE
from megatron_lgs.lgs.config import COMPRESSIONS, LgsConfig
from megatron_lgs.lgs.costmodel import PROFILES
from megatron_lgs.lgs.hardware import MEASURED, ProfileError, load_profile
from megatron_lgs.lgs.plan import WEIGHTINGS
from megatron_lgs.lgs.tuner import TunerConfig
from megatron_lgs.stability import StabilityConfig


class ConfigError(ValueError):
    """A flag combination that cannot run; the message is one line, addressed to the user."""


@dataclass(frozen=True)
class ModelConfig:
    num_layers: int = 4
    hidden_size: int = 128
    ffn_hidden_size: int | None = None  # 4 x hidden when unset, as in Megatron-LM
    num_attention_heads: int = 4
    group_query_attention: bool = False
    num_query_groups: int | None = None
    seq_length: int = 128
    max_position_embeddings: int | None = None  # seq_length when unset
    position_embedding_type: str = "learned_absolute"
    normalization: str = "LayerNorm"
    swiglu: bool = False
    add_bias_linear: bool = True
    untie_embeddings_and_output_weights: bool = False
    init_method_std: float = 0.02
    hidden_dropout: float = 0.0
    attention_dropout: float = 0.0
    make_vocab_size_divisible_by: int = 128
    transformer_impl: str = "auto"  # local on CPU, transformer_engine where TE runs
    # Mixture of experts (dense when num_experts is unset).
    num_experts: int | None = None
    moe_ffn_hidden_size: int | None = None
    moe_router_topk: int = 2
    moe_router_load_balancing_type: str = "aux_loss"
    moe_aux_loss_coeff: float = 1e-2  # Switch Transformer's
    moe_z_loss_coeff: float | None = None
    moe_expert_capacity_factor: float | None = None  # None: dropless
    moe_token_drop_policy: str = "probs"
    moe_token_dispatcher_type: str = "allgather"
    moe_grouped_gemm: bool = False
    # Activation recompute (Megatron-LM's flags), passed to megatron-core's TransformerConfig.
    recompute_granularity: str | None = None  # full | selective
    recompute_method: str | None = None  # uniform | block (full only)
    recompute_num_layers: int | None = None

    @property
    def ffn_size(self) -> int:
        return self.ffn_hidden_size or 4 * self.hidden_size


@dataclass(frozen=True)
class ParallelConfig:
    world_size: int = 1
    tensor_model_parallel_size: int = 1
    pipeline_model_parallel_size: int = 1
    context_parallel_size: int = 1
    expert_model_parallel_size: int = 1
    expert_tensor_parallel_size: int | None = None
    sequence_parallel: bool = False
    num_layers_per_virtual_pipeline_stage: int | None = None  # interleaved 1F1B when set

    def virtual_pipeline_size(self, num_layers: int) -> int | None:
        """Model chunks per pipeline rank (Megatron-LM's rule); None without interleaving."""
        per_stage = self.num_layers_per_virtual_pipeline_stage
        if per_stage is None:
            return None
        return num_layers // self.pipeline_model_parallel_size // per_stage

    @property
    def data_parallel_size(self) -> int:
        model_parallel = (
            self.tensor_model_parallel_size
            * self.pipeline_model_parallel_size
            * self.context_parallel_size
        )
        return self.world_size // model_parallel


@dataclass(frozen=True)
class PrecisionConfig:
    bf16: bool = False
    fp16: bool = False
    loss_scale: float | None = None  # static scale; dynamic scaling when unset
    initial_loss_scale: float = 2.0**32
    min_loss_scale: float = 1.0
    loss_scale_window: int = 1000
    hysteresis: int = 2
    fp8_format: str | None = None
    # Megatron-LM's FP8 defaults, written here and always passed to megatron-core, which builds
    # Transformer Engine's recipe from them (TE's own DelayedScaling defaults differ: history
    # 1024, algorithm "max"; they never apply to our runs).
    fp8_recipe: str = "delayed"
    fp8_margin: int = 0
    fp8_amax_history_len: int = 1
    fp8_amax_compute_algo: str = "most_recent"

    @property
    def name(self) -> str:
        return "bf16" if self.bf16 else "fp16" if self.fp16 else "fp32"


@dataclass(frozen=True)
class OptimizerConfig:
    optimizer: str = "adam"
    lr: float = 3e-3
    min_lr: float = 3e-4
    lr_decay_style: str = "cosine"
    lr_decay_iters: int | None = None  # train_iters when unset
    lr_warmup_iters: int = 0
    lr_warmup_fraction: float | None = None
    lr_wsd_decay_style: str = "exponential"
    lr_wsd_decay_iters: int | None = None
    weight_decay: float = 0.01
    clip_grad: float = 1.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.95
    adam_eps: float = 1e-8
    sgd_momentum: float = 0.9
    use_distributed_optimizer: bool = False
    overlap_grad_reduce: bool = False
    overlap_param_gather: bool = False
    ddp_bucket_size: int | None = None
    # megatron-core's two-level form: the distributed optimizer sharded inside each of N groups
    # of data-parallel ranks (reduce-scatter inside, all-reduce of the shard across them).
    num_distributed_optimizer_instances: int = 1
    # megatron-core's all-to-all reduce-scatter with a local FP32 sum, for every gradient
    # reduce-scatter (megatron's buckets and LGS's hops). On gloo it moves (p-1)/p of the
    # buffer where gloo's own reduce-scatter moves as much as an all-reduce (README, LGS).
    reduce_scatter_with_fp32_accumulation: bool = False
    # ZeRO-3 (parameters sharded too): Megatron-FSDP; implies the distributed optimizer.
    use_megatron_fsdp: bool = False
    data_parallel_sharding_strategy: str = "no_shard"
    # ZeRO-Offload: megatron-core's HybridDeviceOptimizer keeps this fraction of the optimizer
    # state and its Adam step in host memory (GPU runs only).
    optimizer_cpu_offload: bool = False
    optimizer_offload_fraction: float = 1.0

    @property
    def distributed_optimizer(self) -> bool:
        return self.use_distributed_optimizer or self.use_megatron_fsdp


@dataclass(frozen=True)
class TrainingConfig:
    micro_batch_size: int = 8
    global_batch_size: int = 16
    train_iters: int = 400
    seed: int = 1234
    eval_interval: int = 50
    eval_iters: int = 4
    exit_interval: int | None = None
    exit_duration_in_mins: float | None = None
    exit_signal_handler: bool = False
    iterations_to_skip: tuple[int, ...] = ()
    log_interval: int = 10
    # Megatron-LM's --rampup-batch-size START INCREMENT SAMPLES: the global batch grows from
    # START by INCREMENT, evenly over the first SAMPLES samples, up to --global-batch-size.
    rampup_batch_size: tuple[int, int, int] | None = None


@dataclass(frozen=True)
class CheckpointConfig:
    save: str | None = "checkpoints/tiny-gpt"
    load: str | None = None
    save_interval: int | None = None  # save at the end only when unset
    # Megatron-LM's --async-save: training goes on while megatron-core's forked writer writes.
    async_save: bool = False
    ckpt_format: str = "torch_dist"
    no_save_optim: bool = False
    no_load_optim: bool = False
    no_load_rng: bool = False
    finetune: bool = False


@dataclass(frozen=True)
class LoggingConfig:
    tensorboard_dir: str | None = None
    wandb_project: str | None = None
    wandb_exp_name: str | None = None
    wandb_save_dir: str | None = None


@dataclass(frozen=True)
class DataArgs:
    # Prepared datasets (python -m data_pipeline prepare), Megatron's "DIR" or "W1 DIR1 W2 DIR2";
    # empty: the embedded corpus, prepared on first use into data_cache_dir.
    data_path: tuple[str, ...] = ()
    domain_weights: tuple[tuple[str, float], ...] = ()  # per-domain form: code=0.7 prose=0.3
    vocab_size: int = 4096  # size of the BPE vocabulary trained on the embedded corpus
    # tokenizer.json for --data-path Megatron prefixes that have no manifest of ours
    tokenizer_model: str | None = None
    eod_mask_loss: bool = False  # Megatron-LM's default: predict the end-of-document token too
    data_cache_dir: str = ".cache/data"
    num_workers: int = 0
    data_mix: str = "static"  # dynamic: per-domain validation loss drives the weights
    data_mix_interval: int = 20
    data_mix_eta: float = 1.0
    data_mix_floor: float = 0.05
    data_mix_smoothing: float = 0.5


@dataclass(frozen=True)
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    optim: OptimizerConfig = field(default_factory=OptimizerConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    data: DataArgs = field(default_factory=DataArgs)
    stability: StabilityConfig = field(default_factory=StabilityConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    lgs: LgsConfig = field(default_factory=LgsConfig)

    def to_dict(self) -> dict:
        return asdict(self)


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad flag in one line instead of the usage block."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def _add(group: argparse._ArgumentGroup, name: str, default: object, **kwargs: object) -> None:
    if isinstance(default, bool) and "action" not in kwargs:
        kwargs["action"] = "store_false" if default else "store_true"
    elif "type" not in kwargs and default is not None and "action" not in kwargs:
        kwargs["type"] = type(default)
    group.add_argument(name, default=default, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="pretrain_gpt.py",
        description="GPT pretraining on megatron-core. With no flags: a tiny GPT on the "
        "embedded corpus, on whatever this machine has.",
    )
    m, par, pr, o, t, c, d = (ModelConfig(), ParallelConfig(), PrecisionConfig(),
                              OptimizerConfig(), TrainingConfig(), CheckpointConfig(), DataArgs())
    st, lg, lgs = StabilityConfig(), LoggingConfig(), LgsConfig()

    g = p.add_argument_group("model")
    _add(g, "--num-layers", m.num_layers)
    _add(g, "--hidden-size", m.hidden_size)
    _add(g, "--ffn-hidden-size", m.ffn_hidden_size, type=int)
    _add(g, "--num-attention-heads", m.num_attention_heads)
    _add(g, "--group-query-attention", m.group_query_attention)
    _add(g, "--num-query-groups", m.num_query_groups, type=int)
    _add(g, "--seq-length", m.seq_length)
    _add(g, "--max-position-embeddings", m.max_position_embeddings, type=int)
    _add(g, "--position-embedding-type", m.position_embedding_type,
         choices=["learned_absolute", "rope"])
    _add(g, "--normalization", m.normalization, choices=["LayerNorm", "RMSNorm"])
    _add(g, "--swiglu", m.swiglu)
    g.add_argument("--disable-bias-linear", dest="add_bias_linear", action="store_false")
    _add(g, "--untie-embeddings-and-output-weights", m.untie_embeddings_and_output_weights)
    _add(g, "--init-method-std", m.init_method_std)
    _add(g, "--hidden-dropout", m.hidden_dropout)
    _add(g, "--attention-dropout", m.attention_dropout)
    _add(g, "--make-vocab-size-divisible-by", m.make_vocab_size_divisible_by)
    _add(g, "--transformer-impl", m.transformer_impl,
         choices=["auto", "local", "transformer_engine"])

    g = p.add_argument_group("mixture of experts")
    _add(g, "--num-experts", m.num_experts, type=int)
    _add(g, "--moe-ffn-hidden-size", m.moe_ffn_hidden_size, type=int)
    _add(g, "--moe-router-topk", m.moe_router_topk)
    _add(g, "--moe-router-load-balancing-type", m.moe_router_load_balancing_type,
         choices=["aux_loss", "seq_aux_loss", "sinkhorn", "none"])
    _add(g, "--moe-aux-loss-coeff", m.moe_aux_loss_coeff)
    _add(g, "--moe-z-loss-coeff", m.moe_z_loss_coeff, type=float)
    _add(g, "--moe-expert-capacity-factor", m.moe_expert_capacity_factor, type=float)
    _add(g, "--moe-token-drop-policy", m.moe_token_drop_policy, choices=["probs", "position"])
    _add(g, "--moe-token-dispatcher-type", m.moe_token_dispatcher_type,
         choices=["allgather", "alltoall"])
    _add(g, "--moe-grouped-gemm", m.moe_grouped_gemm)

    g = p.add_argument_group("parallelism")
    _add(g, "--tensor-model-parallel-size", par.tensor_model_parallel_size)
    _add(g, "--pipeline-model-parallel-size", par.pipeline_model_parallel_size)
    _add(g, "--context-parallel-size", par.context_parallel_size)
    _add(g, "--expert-model-parallel-size", par.expert_model_parallel_size)
    _add(g, "--expert-tensor-parallel-size", par.expert_tensor_parallel_size, type=int)
    _add(g, "--sequence-parallel", par.sequence_parallel)
    _add(g, "--num-layers-per-virtual-pipeline-stage", par.num_layers_per_virtual_pipeline_stage,
         type=int, help="interleaved pipeline schedule: layers in each model chunk")

    g = p.add_argument_group("activation recompute")
    _add(g, "--recompute-granularity", m.recompute_granularity, type=str,
         choices=["full", "selective"])
    _add(g, "--recompute-method", m.recompute_method, type=str, choices=["uniform", "block"])
    _add(g, "--recompute-num-layers", m.recompute_num_layers, type=int)

    g = p.add_argument_group("precision")
    _add(g, "--bf16", pr.bf16)
    _add(g, "--fp16", pr.fp16)
    _add(g, "--loss-scale", pr.loss_scale, type=float)
    _add(g, "--initial-loss-scale", pr.initial_loss_scale)
    _add(g, "--min-loss-scale", pr.min_loss_scale)
    _add(g, "--loss-scale-window", pr.loss_scale_window)
    _add(g, "--hysteresis", pr.hysteresis)
    _add(g, "--fp8-format", pr.fp8_format, type=str, choices=["e4m3", "hybrid"])
    _add(g, "--fp8-recipe", pr.fp8_recipe, choices=["tensorwise", "delayed", "mxfp8", "blockwise"])
    _add(g, "--fp8-margin", pr.fp8_margin)
    _add(g, "--fp8-amax-history-len", pr.fp8_amax_history_len,
         help="delayed scaling: amax history window (Transformer Engine's own default is 1024)")
    _add(g, "--fp8-amax-compute-algo", pr.fp8_amax_compute_algo, choices=["most_recent", "max"],
         help="delayed scaling: amax of the window (Transformer Engine's own default is max)")

    g = p.add_argument_group("optimizer and learning rate")
    _add(g, "--optimizer", o.optimizer, choices=["adam", "sgd"])
    _add(g, "--lr", o.lr)
    _add(g, "--min-lr", o.min_lr)
    _add(g, "--lr-decay-style", o.lr_decay_style,
         choices=["constant", "linear", "cosine", "inverse-square-root", "WSD"])
    _add(g, "--lr-decay-iters", o.lr_decay_iters, type=int)
    _add(g, "--lr-warmup-iters", o.lr_warmup_iters)
    _add(g, "--lr-warmup-fraction", o.lr_warmup_fraction, type=float)
    _add(g, "--lr-wsd-decay-style", o.lr_wsd_decay_style,
         choices=["exponential", "linear", "cosine", "minus_sqrt"])
    _add(g, "--lr-wsd-decay-iters", o.lr_wsd_decay_iters, type=int)
    _add(g, "--weight-decay", o.weight_decay)
    _add(g, "--clip-grad", o.clip_grad)
    _add(g, "--adam-beta1", o.adam_beta1)
    _add(g, "--adam-beta2", o.adam_beta2)
    _add(g, "--adam-eps", o.adam_eps)
    _add(g, "--sgd-momentum", o.sgd_momentum)
    _add(g, "--use-distributed-optimizer", o.use_distributed_optimizer)
    _add(g, "--overlap-grad-reduce", o.overlap_grad_reduce)
    _add(g, "--overlap-param-gather", o.overlap_param_gather)
    _add(g, "--ddp-bucket-size", o.ddp_bucket_size, type=int)
    _add(g, "--num-distributed-optimizer-instances", o.num_distributed_optimizer_instances,
         help="shard the distributed optimizer inside N groups of data-parallel ranks "
              "(e.g. one per node) and all-reduce the shards across them")
    _add(g, "--reduce-scatter-with-fp32-accumulation", o.reduce_scatter_with_fp32_accumulation,
         help="reduce-scatter gradients as an all-to-all plus a local FP32 sum "
              "(megatron-core's implementation; needs --use-distributed-optimizer)")
    _add(g, "--use-megatron-fsdp", o.use_megatron_fsdp,
         help="Megatron-FSDP (implies --use-distributed-optimizer)")
    _add(g, "--data-parallel-sharding-strategy", o.data_parallel_sharding_strategy,
         choices=["no_shard", "optim", "optim_grads", "optim_grads_params"],
         help="with --use-megatron-fsdp: optim_grads_params is ZeRO-3")
    _add(g, "--optimizer-cpu-offload", o.optimizer_cpu_offload,
         help="keep optimizer state and its step in host memory (needs a GPU)")
    _add(g, "--optimizer-offload-fraction", o.optimizer_offload_fraction)

    g = p.add_argument_group("layer-wise gradient sync (LGS)")
    _add(g, "--lgs", lgs.lgs, help="hierarchical layer-wise gradient sync on megatron's DDP")
    _add(g, "--lgs-intra-threshold-mb", lgs.lgs_intra_threshold_mb,
         help="bucket bytes that fire a sync (intra-node hop)")
    _add(g, "--lgs-inter-threshold-mb", lgs.lgs_inter_threshold_mb,
         help="largest inter-node message")
    _add(g, "--lgs-thresholds", lgs.lgs_thresholds, choices=["manual", "auto"],
         help="auto: the cost model's optimum for this layout and --lgs-hardware")
    _add(g, "--lgs-hardware", lgs.lgs_hardware, type=str,
         help="cost-model profile for auto: a name, 'measured' (probe this job's links and "
              "compute at start-up) or a profile file from python -m megatron_lgs.lgs.calibrate "
              "(default: from the GPU; a100-hdr without one)")
    _add(g, "--lgs-layer-weighting", lgs.lgs_layer_weighting, choices=list(WEIGHTINGS))
    _add(g, "--lgs-memory-cap-mb", lgs.lgs_memory_cap_mb, type=float,
         help="most unsynchronized gradient bytes in flight")
    _add(g, "--lgs-split-large-tensors", lgs.lgs_split_large_tensors)
    _add(g, "--lgs-gpus-per-node", lgs.lgs_gpus_per_node, type=int,
         help="ranks per node (default: LOCAL_WORLD_SIZE or SLURM_NTASKS_PER_NODE)")
    _add(g, "--lgs-compress", lgs.lgs_compress, choices=list(COMPRESSIONS),
         help="int8: inter-node hop in INT8 with error feedback")
    _add(g, "--lgs-compress-block", lgs.lgs_compress_block)
    _add(g, "--lgs-trace-dir", lgs.lgs_trace_dir, type=str,
         help="write a Chrome trace of the bucket timeline per rank")
    _add(g, "--lgs-trace-steps", lgs.lgs_trace_steps)
    _add(g, "--lgs-autotune", lgs.lgs_autotune,
         help="refine the thresholds online by interleaved A/B trials")
    _add(g, "--lgs-autotune-min-mb", lgs.lgs_autotune_min_mb)
    _add(g, "--lgs-autotune-max-mb", lgs.lgs_autotune_max_mb)
    _add(g, "--lgs-autotune-inter-min-mb", lgs.lgs_autotune_inter_min_mb, type=float,
         help="the inter-node message cap's own search range (default: the intra range)")
    _add(g, "--lgs-autotune-inter-max-mb", lgs.lgs_autotune_inter_max_mb, type=float)
    _add(g, "--lgs-autotune-throughput-margin", lgs.lgs_autotune_throughput_margin)
    _add(g, "--lgs-autotune-loss-margin", lgs.lgs_autotune_loss_margin)

    g = p.add_argument_group("batch and run")
    _add(g, "--micro-batch-size", t.micro_batch_size)
    _add(g, "--global-batch-size", t.global_batch_size)
    _add(g, "--train-iters", t.train_iters)
    _add(g, "--seed", t.seed)
    _add(g, "--eval-interval", t.eval_interval)
    _add(g, "--eval-iters", t.eval_iters)
    _add(g, "--exit-interval", t.exit_interval, type=int)
    _add(g, "--exit-duration-in-mins", t.exit_duration_in_mins, type=float)
    _add(g, "--exit-signal-handler", t.exit_signal_handler,
         help="on SIGTERM or SIGUSR1: save a checkpoint at the end of the step and exit 0")
    g.add_argument("--iterations-to-skip", type=int, nargs="+", default=[],
                   help="iterations whose batches are consumed without an update")
    _add(g, "--log-interval", t.log_interval)
    g.add_argument("--rampup-batch-size", type=int, nargs=3, default=None,
                   metavar=("START", "INCREMENT", "SAMPLES"),
                   help="grow the global batch from START by INCREMENT over SAMPLES samples")

    g = p.add_argument_group("stability")
    _add(g, "--loss-spike-action", st.spike_action, choices=["log", "skip", "rollback"],
         dest="spike_action")
    _add(g, "--loss-spike-window", st.spike_window, dest="spike_window")
    _add(g, "--loss-spike-zscore", st.spike_zscore, dest="spike_zscore")
    _add(g, "--grad-norm-spike-factor", st.grad_norm_spike_factor)
    _add(g, "--inject-nan-at", st.inject_nan_at, type=int, help="test hook: NaN loss here")
    _add(g, "--inject-inf-grad-at", st.inject_inf_grad_at, type=int,
         help="test hook: this iteration's gradients are inf, its loss is untouched")
    _add(g, "--inject-spike-at", st.inject_spike_at, type=int,
         help="test hook: this iteration's per-token losses x --inject-spike-scale")
    _add(g, "--inject-spike-scale", st.inject_spike_scale)

    g = p.add_argument_group("logging")
    _add(g, "--tensorboard-dir", lg.tensorboard_dir, type=str)
    _add(g, "--wandb-project", lg.wandb_project, type=str, help="W&B, offline mode only")
    _add(g, "--wandb-exp-name", lg.wandb_exp_name, type=str)
    _add(g, "--wandb-save-dir", lg.wandb_save_dir, type=str)

    g = p.add_argument_group("checkpointing")
    _add(g, "--save", c.save, type=str)
    g.add_argument("--no-save", dest="save", action="store_const", const=None,
                   help="do not write checkpoints")
    _add(g, "--load", c.load, type=str)
    _add(g, "--save-interval", c.save_interval, type=int)
    _add(g, "--ckpt-format", c.ckpt_format, choices=["torch_dist"])
    _add(g, "--async-save", c.async_save,
         help="write checkpoints in a forked process while training continues")
    _add(g, "--no-save-optim", c.no_save_optim)
    _add(g, "--no-load-optim", c.no_load_optim)
    _add(g, "--no-load-rng", c.no_load_rng)
    _add(g, "--finetune", c.finetune)

    g = p.add_argument_group("data")
    g.add_argument("--data-path", nargs="+", default=[],
                   help="prepared dataset dirs or Megatron .bin/.idx prefixes: DIR, or "
                        "WEIGHT DIR pairs")
    _add(g, "--tokenizer-model", d.tokenizer_model, type=str,
         help="tokenizer.json of --data-path Megatron prefixes not written by our prepare")
    g.add_argument("--domain-weights", nargs="+", default=[], metavar="DOMAIN=WEIGHT",
                   help="blend by domain instead of by dataset")
    _add(g, "--data-mix", d.data_mix, choices=["static", "dynamic"])
    _add(g, "--data-mix-interval", d.data_mix_interval,
         help="iterations between weight updates (dynamic)")
    _add(g, "--data-mix-eta", d.data_mix_eta)
    _add(g, "--data-mix-floor", d.data_mix_floor)
    _add(g, "--data-mix-smoothing", d.data_mix_smoothing)
    _add(g, "--vocab-size", d.vocab_size)
    _add(g, "--eod-mask-loss", d.eod_mask_loss, help="no loss on end-of-document tokens")
    _add(g, "--data-cache-dir", d.data_cache_dir)
    _add(g, "--num-workers", d.num_workers)
    return p


def _pick(cls: type, ns: argparse.Namespace, **extra: object) -> object:
    names = {f for f in cls.__dataclass_fields__}
    values = {k: v for k, v in vars(ns).items() if k in names}
    values.update(extra)
    return cls(**values)


def _domain_weights(items: list[str]) -> tuple[tuple[str, float], ...]:
    pairs = []
    for item in items:
        name, _, weight = item.partition("=")
        try:
            pairs.append((name, float(weight)))
        except ValueError:
            raise ConfigError(f"--domain-weights takes DOMAIN=WEIGHT, got {item!r}") from None
    return tuple(pairs)


def world_size_from_env() -> int:
    """World size as torchrun or Slurm will give it, read before any process group exists."""
    for var in ("WORLD_SIZE", "SLURM_NTASKS"):
        if os.environ.get(var):
            return int(os.environ[var])
    return 1


def validate(cfg: Config) -> None:
    """Every rule that needs more than one flag. Raises ConfigError with a one-line message."""
    m, par, t, o, pr = cfg.model, cfg.parallel, cfg.training, cfg.optim, cfg.precision
    positive = {
        "--num-layers": m.num_layers, "--hidden-size": m.hidden_size,
        "--num-attention-heads": m.num_attention_heads, "--seq-length": m.seq_length,
        "--micro-batch-size": t.micro_batch_size, "--global-batch-size": t.global_batch_size,
        "--train-iters": t.train_iters, "--log-interval": t.log_interval,
        "--eval-interval": t.eval_interval, "--vocab-size": cfg.data.vocab_size,
        "--tensor-model-parallel-size": par.tensor_model_parallel_size,
        "--pipeline-model-parallel-size": par.pipeline_model_parallel_size,
        "--context-parallel-size": par.context_parallel_size,
        "--expert-model-parallel-size": par.expert_model_parallel_size,
    }
    for flag, value in positive.items():
        if value < 1:
            raise ConfigError(f"{flag} must be at least 1, got {value}")
    if cfg.data.vocab_size < MIN_VOCAB_SIZE:
        raise ConfigError(f"--vocab-size must be at least {MIN_VOCAB_SIZE} (256 byte tokens and "
                          f"the end-of-document token), got {cfg.data.vocab_size}")
    if t.seed < 0:
        raise ConfigError(f"--seed must be non-negative, got {t.seed}")
    tp, pp, cp = par.tensor_model_parallel_size, par.pipeline_model_parallel_size, \
        par.context_parallel_size
    if m.num_attention_heads % tp:
        raise ConfigError(f"--num-attention-heads ({m.num_attention_heads}) must be divisible by "
                          f"--tensor-model-parallel-size ({tp})")
    if m.hidden_size % m.num_attention_heads:
        raise ConfigError(f"--hidden-size ({m.hidden_size}) must be divisible by "
                          f"--num-attention-heads ({m.num_attention_heads})")
    if m.group_query_attention:
        groups = m.num_query_groups or 0
        if groups < 1 or m.num_attention_heads % groups or groups % tp:
            raise ConfigError(f"--num-query-groups ({m.num_query_groups}) must divide "
                              f"--num-attention-heads and be divisible by TP ({tp})")
    if par.world_size % (tp * pp * cp):
        raise ConfigError(f"world size ({par.world_size}) must be divisible by TP x PP x CP "
                          f"({tp} x {pp} x {cp})")
    dp = par.data_parallel_size
    if par.world_size % (par.expert_model_parallel_size * tp * pp) and \
            par.expert_model_parallel_size > 1:
        raise ConfigError(f"world size ({par.world_size}) must be divisible by EP x TP x PP")
    ep = par.expert_model_parallel_size
    if m.num_experts is None and ep > 1:
        raise ConfigError("--expert-model-parallel-size > 1 needs --num-experts")
    if m.num_experts is not None:
        if m.num_experts < 1 or m.num_experts % ep:
            raise ConfigError(f"--num-experts ({m.num_experts}) must be a positive multiple of "
                              f"--expert-model-parallel-size ({ep})")
        if not 1 <= m.moe_router_topk <= m.num_experts:
            raise ConfigError(f"--moe-router-topk ({m.moe_router_topk}) must be in 1.."
                              f"{m.num_experts}")
    if m.num_layers % pp:
        raise ConfigError(f"--num-layers ({m.num_layers}) must be divisible by "
                          f"--pipeline-model-parallel-size ({pp})")
    if t.global_batch_size % (t.micro_batch_size * dp):
        raise ConfigError(f"--global-batch-size ({t.global_batch_size}) must be divisible by "
                          f"--micro-batch-size x data-parallel size ({t.micro_batch_size} x {dp})")
    _validate_pipeline(cfg)
    if m.seq_length % (2 * cp):
        raise ConfigError(f"--seq-length ({m.seq_length}) must be divisible by 2 x "
                          f"--context-parallel-size ({cp}): each CP rank takes two chunks")
    _validate_rampup(cfg)
    _validate_recompute(m, pp)
    if m.num_experts is not None and tp > 1 and not par.sequence_parallel:
        raise ConfigError("MoE with --tensor-model-parallel-size > 1 needs --sequence-parallel "
                          "(megatron-core's MoE layer refuses to train without it)")
    if par.sequence_parallel and tp == 1:
        raise ConfigError("--sequence-parallel needs --tensor-model-parallel-size > 1")
    if pr.bf16 and pr.fp16:
        raise ConfigError("--bf16 and --fp16 are mutually exclusive")
    if pr.fp8_amax_history_len < 1 or pr.fp8_margin < 0:
        raise ConfigError("--fp8-amax-history-len must be at least 1 and --fp8-margin at least 0")
    if (m.max_position_embeddings or m.seq_length) < m.seq_length:
        raise ConfigError(f"--max-position-embeddings ({m.max_position_embeddings}) is smaller "
                          f"than --seq-length ({m.seq_length})")
    if o.optimizer == "sgd" and o.distributed_optimizer:
        raise ConfigError("--use-distributed-optimizer supports only --optimizer adam in "
                          "megatron-core 0.16.1")
    if o.overlap_param_gather and not o.distributed_optimizer:
        raise ConfigError("--overlap-param-gather needs --use-distributed-optimizer")
    _validate_zero(cfg)
    _validate_instances(cfg)
    _validate_fp32_reduce_scatter(cfg.optim)
    if o.ddp_bucket_size is not None and o.ddp_bucket_size < 1:
        raise ConfigError(f"--ddp-bucket-size must be positive, got {o.ddp_bucket_size}")
    if o.lr < o.min_lr:
        raise ConfigError(f"--lr ({o.lr}) is smaller than --min-lr ({o.min_lr})")
    if o.lr_warmup_fraction is not None and not 0.0 <= o.lr_warmup_fraction < 1.0:
        raise ConfigError(f"--lr-warmup-fraction must be in [0, 1), got {o.lr_warmup_fraction}")
    decay_iters = o.lr_decay_iters or t.train_iters
    warmup = warmup_iters(cfg)
    if warmup >= decay_iters:
        raise ConfigError(f"warmup ({warmup} iterations) must be shorter than the decay "
                          f"({decay_iters} iterations)")
    if o.lr_decay_style == "WSD" and o.lr_wsd_decay_iters is None:
        raise ConfigError("--lr-decay-style WSD needs --lr-wsd-decay-iters")
    if t.eval_iters < 0:
        raise ConfigError(f"--eval-iters must be at least 0, got {t.eval_iters}")
    if t.exit_interval is not None and t.exit_interval < 1:
        raise ConfigError(f"--exit-interval must be at least 1, got {t.exit_interval}")
    if cfg.checkpoint.async_save and not cfg.checkpoint.save:
        raise ConfigError("--async-save needs --save (there is no checkpoint to write)")
    if cfg.checkpoint.async_save and "fork" not in multiprocessing.get_all_start_methods():
        raise ConfigError("--async-save forks the checkpoint writer (megatron-core's "
                          "TemporalAsyncCaller), and this platform cannot fork")
    if cfg.checkpoint.save_interval is not None and cfg.checkpoint.save_interval < 1:
        raise ConfigError(f"--save-interval must be at least 1, got {cfg.checkpoint.save_interval}")
    dd = cfg.data
    if len(dd.data_path) > 1 and dd.domain_weights:
        raise ConfigError("--data-path WEIGHT DIR pairs and --domain-weights are two ways to "
                          "weight the blend; give one (a single --data-path DIR is fine)")
    if dd.data_path and len(dd.data_path) > 1 and dd.data_mix == "dynamic":
        raise ConfigError("--data-mix dynamic mixes domains: use --data-path DIR with "
                          "--domain-weights")
    if any(w < 0 for _, w in dd.domain_weights) or \
            (dd.domain_weights and sum(w for _, w in dd.domain_weights) <= 0):
        raise ConfigError("--domain-weights must be non-negative and not all zero")
    if dd.data_mix_interval < 1 or not 0 <= dd.data_mix_floor < 1 or \
            not 0 <= dd.data_mix_smoothing < 1 or dd.data_mix_eta <= 0:
        raise ConfigError("--data-mix-interval >= 1, --data-mix-eta > 0, and --data-mix-floor "
                          "and --data-mix-smoothing in [0, 1) are required")
    if dd.data_mix == "dynamic" and t.eval_iters < 1:
        raise ConfigError("--data-mix dynamic measures per-domain validation loss: it needs "
                          "--eval-iters >= 1")
    st = cfg.stability
    if st.spike_window < 2 or st.spike_zscore <= 0 or st.grad_norm_spike_factor <= 1:
        raise ConfigError("--loss-spike-window must be >= 2, --loss-spike-zscore > 0 and "
                          "--grad-norm-spike-factor > 1")
    if st.spike_action == "rollback" and not cfg.checkpoint.save:
        raise ConfigError("--loss-spike-action rollback needs --save (it reloads the last "
                          "checkpoint written there)")
    if t.exit_duration_in_mins is not None and t.exit_duration_in_mins <= 0:
        raise ConfigError(f"--exit-duration-in-mins must be positive, got "
                          f"{t.exit_duration_in_mins}")
    _validate_lgs(cfg)
    if cfg.checkpoint.load and not os.path.isdir(cfg.checkpoint.load):
        raise ConfigError(f"--load {cfg.checkpoint.load}: no such directory")


def _validate_lgs(cfg: Config) -> None:
    lgs, defaults = cfg.lgs, LgsConfig()
    if not lgs.lgs:
        changed = [f"--{k.replace('_', '-')}" for k, v in asdict(lgs).items()
                   if k != "lgs" and v != getattr(defaults, k)]
        if changed:
            raise ConfigError(f"{', '.join(changed)} needs --lgs")
        return
    for flag, value in (("--lgs-intra-threshold-mb", lgs.lgs_intra_threshold_mb),
                        ("--lgs-inter-threshold-mb", lgs.lgs_inter_threshold_mb),
                        ("--lgs-memory-cap-mb", lgs.lgs_memory_cap_mb)):
        if value is not None and value <= 0:
            raise ConfigError(f"{flag} must be > 0, got {value}")
    for flag, value in (("--lgs-gpus-per-node", lgs.lgs_gpus_per_node),
                        ("--lgs-compress-block", lgs.lgs_compress_block),
                        ("--lgs-trace-steps", lgs.lgs_trace_steps)):
        if value is not None and value < 1:
            raise ConfigError(f"{flag} must be at least 1, got {value}")
    _validate_hardware(lgs.lgs_hardware)
    if lgs.lgs_hardware == MEASURED and cfg.parallel.pipeline_model_parallel_size > 1:
        raise ConfigError("--lgs-hardware measured probes a one-stage model; with pipeline "
                          "parallelism save a profile from a run without it (python -m "
                          "megatron_lgs.lgs.calibrate --out FILE ...) and pass the file")
    if not 0 < lgs.lgs_autotune_min_mb <= lgs.lgs_autotune_max_mb:
        raise ConfigError("--lgs-autotune-min-mb must be > 0 and <= --lgs-autotune-max-mb")
    try:  # the tuner's own check of both ranges (the inter one defaults to the intra one)
        TunerConfig(min_mb=lgs.lgs_autotune_min_mb, max_mb=lgs.lgs_autotune_max_mb,
                    inter_min_mb=lgs.lgs_autotune_inter_min_mb,
                    inter_max_mb=lgs.lgs_autotune_inter_max_mb)
    except ValueError:
        raise ConfigError("--lgs-autotune-inter-min-mb must be > 0 and <= "
                          "--lgs-autotune-inter-max-mb (defaults: the intra range)") from None
    if not 0 <= lgs.lgs_autotune_throughput_margin < 1 or lgs.lgs_autotune_loss_margin < 0:
        raise ConfigError("--lgs-autotune-throughput-margin must be in [0, 1) and "
                          "--lgs-autotune-loss-margin >= 0")
    if cfg.optim.use_megatron_fsdp:
        raise ConfigError("--lgs groups megatron DDP's gradient buckets; Megatron-FSDP "
                          "(--use-megatron-fsdp) has its own, so use one or the other")
    if cfg.optim.ddp_bucket_size is not None:
        raise ConfigError("--ddp-bucket-size and --lgs both set bucket sizes; LGS plans its "
                          "buckets from --lgs-intra/inter-threshold-mb")


def _validate_hardware(spec: str | None) -> None:
    """--lgs-hardware: a built-in profile, `measured` or a readable profile file."""
    if spec is None or spec in PROFILES or spec == MEASURED:
        return
    if not spec.endswith(".json") and not os.path.exists(spec):
        raise ConfigError(f"--lgs-hardware {spec!r} is not one of {', '.join(sorted(PROFILES))}, "
                          f"'{MEASURED}' or a profile file (.json)")
    try:
        load_profile(spec)
    except ProfileError as exc:
        raise ConfigError(f"--lgs-hardware {exc}") from None


def _validate_fp32_reduce_scatter(o: OptimizerConfig) -> None:
    if not o.reduce_scatter_with_fp32_accumulation:
        return
    if not o.use_distributed_optimizer or o.use_megatron_fsdp:
        raise ConfigError("--reduce-scatter-with-fp32-accumulation replaces the distributed "
                          "optimizer's reduce-scatter: it needs --use-distributed-optimizer "
                          "(and not --use-megatron-fsdp)")
    if o.num_distributed_optimizer_instances > 1:
        raise ConfigError("--reduce-scatter-with-fp32-accumulation does not combine with "
                          "--num-distributed-optimizer-instances > 1 (megatron-core refuses it)")


def _validate_instances(cfg: Config) -> None:
    o, par = cfg.optim, cfg.parallel
    n = o.num_distributed_optimizer_instances
    if n == 1:
        return
    dp_cp = par.data_parallel_size * par.context_parallel_size
    if n < 1 or dp_cp % n:
        raise ConfigError(f"--num-distributed-optimizer-instances ({n}) must be >= 1 and divide "
                          f"the data-parallel size ({dp_cp})")
    if not o.use_distributed_optimizer or o.use_megatron_fsdp:
        raise ConfigError("--num-distributed-optimizer-instances needs "
                          "--use-distributed-optimizer (and not --use-megatron-fsdp)")
    if cfg.lgs.lgs:
        raise ConfigError("--num-distributed-optimizer-instances is megatron-core's own two-level "
                          "reduction; --lgs replaces the reduction, so use one or the other")
    if cfg.checkpoint.save or cfg.checkpoint.load:
        raise ConfigError("--num-distributed-optimizer-instances > 1: checkpoints of replicated "
                          "optimizer instances are not wired yet; run with --no-save and "
                          "without --load")


def _validate_pipeline(cfg: Config) -> None:
    par, t = cfg.parallel, cfg.training
    per_stage, pp = par.num_layers_per_virtual_pipeline_stage, par.pipeline_model_parallel_size
    if per_stage is None:
        return
    if pp < 2:
        raise ConfigError("--num-layers-per-virtual-pipeline-stage needs "
                          "--pipeline-model-parallel-size > 1")
    if per_stage < 1 or (cfg.model.num_layers // pp) % per_stage:
        raise ConfigError(f"--num-layers-per-virtual-pipeline-stage ({per_stage}) must divide "
                          f"the layers of each pipeline stage ({cfg.model.num_layers // pp})")
    if par.virtual_pipeline_size(cfg.model.num_layers) < 2:
        raise ConfigError("--num-layers-per-virtual-pipeline-stage must leave at least 2 model "
                          "chunks per pipeline stage (otherwise drop the flag)")
    micro_batches = t.global_batch_size // (t.micro_batch_size * par.data_parallel_size)
    if micro_batches % pp:
        raise ConfigError(f"the interleaved schedule needs micro-batches per step "
                          f"({micro_batches}) divisible by --pipeline-model-parallel-size ({pp})")


def _validate_rampup(cfg: Config) -> None:
    """megatron-core's batch-size calculator asserts these; here they are one line each."""
    t, par = cfg.training, cfg.parallel
    if t.rampup_batch_size is None:
        return
    start, increment, samples = t.rampup_batch_size
    unit = t.micro_batch_size * par.data_parallel_size
    if not 0 < start < t.global_batch_size or increment < 1 or samples < 1:
        raise ConfigError(f"--rampup-batch-size {start} {increment} {samples}: START must be in "
                          f"1..{t.global_batch_size - 1}, INCREMENT >= 1 and SAMPLES >= 1")
    if (t.global_batch_size - start) % increment:
        raise ConfigError(f"--rampup-batch-size: --global-batch-size - START "
                          f"({t.global_batch_size - start}) must be a multiple of INCREMENT "
                          f"({increment})")
    if start % unit or increment % unit:
        raise ConfigError(f"--rampup-batch-size: START ({start}) and INCREMENT ({increment}) must "
                          f"be multiples of --micro-batch-size x data-parallel size ({unit})")
    pp = par.pipeline_model_parallel_size
    if par.num_layers_per_virtual_pipeline_stage and (start // unit % pp or increment // unit % pp):
        raise ConfigError("--rampup-batch-size with the interleaved schedule: every step's "
                          f"micro-batch count must be divisible by PP ({pp})")


def _validate_recompute(m: ModelConfig, pp: int) -> None:
    """Megatron-LM's rules: full recompute names its method and layer count; selective
    recomputes the attention core of every layer and takes neither."""
    granularity, method, layers = m.recompute_granularity, m.recompute_method, \
        m.recompute_num_layers
    if granularity is None:
        if method is not None or layers is not None:
            raise ConfigError("--recompute-method and --recompute-num-layers need "
                              "--recompute-granularity full")
    elif granularity == "selective":
        if method is not None or layers is not None:
            raise ConfigError("--recompute-granularity selective takes no --recompute-method or "
                              "--recompute-num-layers (those are for full recompute)")
    else:
        if method is None or layers is None:
            raise ConfigError("--recompute-granularity full needs --recompute-method "
                              "uniform|block and --recompute-num-layers")
        per_stage = m.num_layers // pp
        if not 1 <= layers <= per_stage:
            raise ConfigError(f"--recompute-num-layers ({layers}) must be in 1..{per_stage} "
                              f"(the layers of one pipeline stage)")


def _validate_zero(cfg: Config) -> None:
    o, par, ckpt = cfg.optim, cfg.parallel, cfg.checkpoint
    if o.data_parallel_sharding_strategy != "no_shard" and not o.use_megatron_fsdp:
        raise ConfigError("--data-parallel-sharding-strategy is a Megatron-FSDP setting: add "
                          "--use-megatron-fsdp (ZeRO-1/2 without it: --use-distributed-optimizer)")
    if o.use_megatron_fsdp:
        if o.data_parallel_sharding_strategy != "optim_grads_params" and \
                (ckpt.save or ckpt.load):
            raise ConfigError("--use-megatron-fsdp checkpoints save each rank's shard and are "
                              "written and tested for --data-parallel-sharding-strategy "
                              "optim_grads_params (ZeRO-3) only; for ZeRO-1/2 use "
                              "--use-distributed-optimizer, or run with --no-save")
        if par.world_size != par.data_parallel_size or par.expert_model_parallel_size > 1:
            raise ConfigError("--use-megatron-fsdp is wired and tested for pure data "
                              "parallelism only; use TP/PP/CP/EP with --use-distributed-optimizer")
    if o.optimizer_cpu_offload:
        if not o.use_distributed_optimizer or o.use_megatron_fsdp:
            raise ConfigError("--optimizer-cpu-offload needs --use-distributed-optimizer "
                              "(megatron-core offloads the distributed optimizer's shard)")
        if not 0.0 < o.optimizer_offload_fraction <= 1.0:
            raise ConfigError(f"--optimizer-offload-fraction must be in (0, 1], got "
                              f"{o.optimizer_offload_fraction}")


def warmup_iters(cfg: Config) -> int:
    o = cfg.optim
    if o.lr_warmup_fraction is not None:
        return int(o.lr_warmup_fraction * (o.lr_decay_iters or cfg.training.train_iters))
    return o.lr_warmup_iters


def config_from_namespace(ns: argparse.Namespace, world_size: int) -> Config:
    return Config(
        model=_pick(ModelConfig, ns),
        parallel=_pick(ParallelConfig, ns, world_size=world_size),
        precision=_pick(PrecisionConfig, ns),
        optim=_pick(OptimizerConfig, ns),
        training=_pick(TrainingConfig, ns, iterations_to_skip=tuple(ns.iterations_to_skip),
                       rampup_batch_size=tuple(ns.rampup_batch_size) if ns.rampup_batch_size
                       else None),
        checkpoint=_pick(CheckpointConfig, ns),
        data=_pick(DataArgs, ns, data_path=tuple(ns.data_path),
                   domain_weights=_domain_weights(ns.domain_weights)),
        stability=_pick(StabilityConfig, ns),
        logging=_pick(LoggingConfig, ns),
        lgs=_pick(LgsConfig, ns),
    )


def parse_args(argv: list[str] | None = None, world_size: int | None = None) -> Config:
    """Parse and validate; on a bad flag print one line and exit with status 2."""
    parser = build_parser()
    ns = parser.parse_args(argv)
    try:
        cfg = config_from_namespace(ns, world_size or world_size_from_env())
        validate(cfg)
    except ConfigError as exc:
        parser.exit(2, f"{parser.prog}: error: {exc}\n")
    return cfg


def fail(message: str) -> NoReturn:
    """Stop the run with one clear line (for checks that need the platform, e.g. FP8 on CPU)."""
    sys.stderr.write(f"pretrain_gpt.py: error: {message}\n")
    raise SystemExit(2)
