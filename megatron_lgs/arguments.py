"""Command-line flags (Megatron-LM spellings) parsed once into typed configs, validated up front.

`parse_args()` turns argv into a `Config` of small dataclasses, one per concern, and checks every
cross-flag rule before any process group exists: a bad combination costs one clear line on
stderr and exit code 2, never a traceback from inside megatron-core.

The defaults are the embedded run: a tiny GPT on the bundled corpus, small enough for a CPU.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from typing import NoReturn

from megatron_lgs.lgs.config import COMPRESSIONS, LgsConfig
from megatron_lgs.lgs.plan import WEIGHTINGS
from megatron_lgs.run_config import (
    CheckpointConfig,
    Config,
    ConfigError,
    DataArgs,
    LoggingConfig,
    ModelConfig,
    OptimizerConfig,
    ParallelConfig,
    PrecisionConfig,
    TrainingConfig,
)
from megatron_lgs.stability import StabilityConfig
from megatron_lgs.validation import validate


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad flag in one line instead of the usage block."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def finite_float(text: str) -> float:
    """A float flag's value: NaN and infinities are refused, since no flag means them and
    each would reach the run unchecked (a NaN compares false with every bound)."""
    value = float(text)
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value


def _add(group: argparse._ArgumentGroup, name: str, default: object, **kwargs: object) -> None:
    if isinstance(default, bool) and "action" not in kwargs:
        kwargs["action"] = "store_false" if default else "store_true"
    elif "type" not in kwargs and default is not None and "action" not in kwargs:
        kwargs["type"] = type(default)
    if kwargs.get("type") is float:
        kwargs["type"] = finite_float
    group.add_argument(name, default=default, **kwargs)


TRAINER_PROG = "pretrain_gpt.py"


def build_parser(prog: str = TRAINER_PROG) -> argparse.ArgumentParser:
    p = _Parser(
        prog=prog,
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
    _add(g, "--kv-channels", m.kv_channels, type=int,
         help="width of one attention head (default: hidden size / heads)")
    _add(g, "--seq-length", m.seq_length)
    _add(g, "--max-position-embeddings", m.max_position_embeddings, type=int)
    _add(g, "--position-embedding-type", m.position_embedding_type,
         choices=["learned_absolute", "rope"])
    _add(g, "--rotary-base", m.rotary_base, help="RoPE's base period (theta)")
    _add(g, "--use-rope-scaling", m.use_rope_scaling,
         help="scale RoPE's low frequencies as Llama 3.1 does")
    _add(g, "--rope-scaling-factor", m.rope_scaling_factor,
         help="the factor of --use-rope-scaling")
    g.add_argument("--no-rope-fusion", dest="apply_rope_fusion", action="store_false",
                   help="rotate queries and keys with torch ops, not Transformer Engine's "
                   "fused kernel (used by default on a GPU with TE)")
    _add(g, "--normalization", m.normalization, choices=["LayerNorm", "RMSNorm"])
    _add(g, "--norm-epsilon", m.norm_epsilon, help="epsilon of every LayerNorm/RMSNorm")
    _add(g, "--qk-layernorm", m.qk_layernorm, help="normalize each query and key head")
    _add(g, "--swiglu", m.swiglu)
    _add(g, "--openai-gelu", m.openai_gelu, help="GELU's tanh approximation, as OpenAI's GPT-2 "
         "computes it (Hugging Face's gelu_new); default the exact, erf GELU")
    g.add_argument("--disable-bias-linear", dest="add_bias_linear", action="store_false")
    _add(g, "--add-qkv-bias", m.add_qkv_bias, help="biases on the query, key and value "
         "projections only (with --disable-bias-linear)")
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
    _add(g, "--overlap-moe-expert-parallel-comm", m.overlap_moe_expert_parallel_comm,
         help="run each micro-batch's expert-parallel all-to-alls beside another "
         "micro-batch's compute (megatron-core's combined 1F1B schedule)")

    g = p.add_argument_group("parallelism")
    _add(g, "--tensor-model-parallel-size", par.tensor_model_parallel_size)
    _add(g, "--pipeline-model-parallel-size", par.pipeline_model_parallel_size)
    _add(g, "--context-parallel-size", par.context_parallel_size)
    _add(g, "--expert-model-parallel-size", par.expert_model_parallel_size)
    _add(g, "--expert-tensor-parallel-size", par.expert_tensor_parallel_size, type=int)
    _add(g, "--sequence-parallel", par.sequence_parallel)
    _add(g, "--num-layers-per-virtual-pipeline-stage", par.num_layers_per_virtual_pipeline_stage,
         type=int, help="interleaved pipeline schedule: layers in each model chunk")
    _add(g, "--num-virtual-stages-per-pipeline-rank", par.num_virtual_stages_per_pipeline_rank,
         type=int, help="interleaved pipeline schedule: model chunks per pipeline rank (also "
         "with uneven first/last stages)")
    _add(g, "--decoder-first-pipeline-num-layers", par.decoder_first_pipeline_num_layers,
         type=int, help="uneven pipeline: layers of the first stage")
    _add(g, "--decoder-last-pipeline-num-layers", par.decoder_last_pipeline_num_layers,
         type=int, help="uneven pipeline: layers of the last stage")
    _add(g, "--account-for-embedding-in-pipeline-split",
         par.account_for_embedding_in_pipeline_split,
         help="count the embedding as one layer of the first stage")
    _add(g, "--account-for-loss-in-pipeline-split", par.account_for_loss_in_pipeline_split,
         help="count the output layer and loss as one layer of the last stage")

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
    _add(g, "--tp-only-amax-red", pr.tp_only_amax_red,
         help="delayed scaling: reduce the amaxes over TP x CP only, not the data-parallel "
              "ranks too (a blocking all-reduce twice a micro-batch and model chunk)")

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
    _add(g, "--ckpt-step", c.ckpt_step, type=int,
         help="load this iteration of --load instead of its latest (rewinding a run)")
    _add(g, "--save-interval", c.save_interval, type=int)
    _add(g, "--ckpt-format", c.ckpt_format, choices=["torch_dist"])
    _add(g, "--async-save", c.async_save,
         help="write checkpoints in a forked process while training continues")
    _add(g, "--no-save-optim", c.no_save_optim)
    _add(g, "--no-load-optim", c.no_load_optim)
    _add(g, "--no-load-rng", c.no_load_rng)
    _add(g, "--finetune", c.finetune)
    # Megatron-LM's spelling, and the all-hyphen one.
    g.add_argument("--override-opt_param-scheduler", "--override-opt-param-scheduler",
                   dest="override_opt_param_scheduler", action="store_true",
                   help="on resume, take this run's LR schedule, clipping and Adam betas/eps "
                   "where they differ from the checkpoint's (the step count continues)")
    g.add_argument("--use-checkpoint-opt_param-scheduler", "--use-checkpoint-opt-param-scheduler",
                   dest="use_checkpoint_opt_param_scheduler", action="store_true",
                   help="on resume, keep the checkpoint's LR schedule, clipping and Adam "
                   "betas/eps where this run's differ")

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
            pairs.append((name, finite_float(weight)))
        except (ValueError, argparse.ArgumentTypeError):
            raise ConfigError(f"--domain-weights takes DOMAIN=WEIGHT, a finite weight, got "
                              f"{item!r}") from None
    return tuple(pairs)


def world_size_from_env() -> int:
    """World size as torchrun or Slurm will give it, read before any process group exists."""
    for var in ("WORLD_SIZE", "SLURM_NTASKS"):
        if os.environ.get(var):
            return int(os.environ[var])
    return 1



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


def parse_args(argv: list[str] | None = None, world_size: int | None = None,
               prog: str = TRAINER_PROG) -> Config:
    """Parse and validate; on a bad flag print one line, `prog: error: ...`, and exit with
    status 2 (`prog`: the command whose flags these are)."""
    parser = build_parser(prog)
    ns = parser.parse_args(argv)
    try:
        cfg = config_from_namespace(ns, world_size or world_size_from_env())
        validate(cfg)
    except ConfigError as exc:
        parser.exit(2, f"{parser.prog}: error: {exc}\n")
    return cfg


def fail(message: str, prog: str = TRAINER_PROG) -> NoReturn:
    """Stop the run with one clear line (for checks that need the platform, e.g. FP8 on CPU)."""
    sys.stderr.write(f"{prog}: error: {message}\n")
    raise SystemExit(2)
