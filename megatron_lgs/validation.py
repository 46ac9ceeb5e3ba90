"""Every rule of a run's configuration that needs more than one flag, checked up front.

A bad combination raises `ConfigError` with one line addressed to the user, before any process
group starts, instead of a traceback from inside megatron-core.
"""

from __future__ import annotations

import multiprocessing
import os
from dataclasses import asdict

from data_pipeline.tokenizer import MIN_VOCAB_SIZE
from megatron_lgs.lgs.config import LgsConfig
from megatron_lgs.lgs.gpus import PROFILES
from megatron_lgs.lgs.hardware import MEASURED, ProfileError, load_profile
from megatron_lgs.lgs.tuner import TunerConfig
from megatron_lgs.lgs.workload import SplitError, layer_split, pipeline_split
from megatron_lgs.run_config import Config, ConfigError, ModelConfig, OptimizerConfig, warmup_iters
from megatron_lgs.validation_moe import validate_a2a_overlap, validate_experts
from megatron_lgs.value_checks import check_blend_weights, check_output_dirs, check_ranges


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
    if not m.norm_epsilon > 0:
        raise ConfigError(f"--norm-epsilon must be positive, got {m.norm_epsilon}")
    if m.rotary_base < 1:
        raise ConfigError(f"--rotary-base must be at least 1, got {m.rotary_base}")
    if m.rotary_base != ModelConfig.rotary_base and m.position_embedding_type != "rope":
        raise ConfigError("--rotary-base sets RoPE's period: it needs --position-embedding-type "
                          "rope")
    if m.use_rope_scaling and m.position_embedding_type != "rope":
        raise ConfigError("--use-rope-scaling scales RoPE's frequencies: it needs "
                          "--position-embedding-type rope")
    if m.rope_scaling_factor != ModelConfig.rope_scaling_factor and not m.use_rope_scaling:
        raise ConfigError("--rope-scaling-factor is the factor of --use-rope-scaling: give both")
    if not m.rope_scaling_factor >= 1:
        raise ConfigError(f"--rope-scaling-factor must be at least 1, got "
                          f"{m.rope_scaling_factor}")
    if m.openai_gelu and m.swiglu:
        raise ConfigError("--openai-gelu picks the GELU of a GELU MLP; --swiglu has none")
    if m.kv_channels is not None and m.kv_channels < 1:
        raise ConfigError(f"--kv-channels must be at least 1, got {m.kv_channels}")
    if m.kv_channels is None and m.hidden_size % m.num_attention_heads:
        raise ConfigError(f"--hidden-size ({m.hidden_size}) must be divisible by "
                          f"--num-attention-heads ({m.num_attention_heads}), or give the "
                          "head width with --kv-channels")
    if m.group_query_attention:
        groups = m.num_query_groups or 0
        if groups < 1 or m.num_attention_heads % groups or groups % tp:
            raise ConfigError(f"--num-query-groups ({m.num_query_groups}) must divide "
                              f"--num-attention-heads and be divisible by TP ({tp})")
    if par.world_size % (tp * pp * cp):
        raise ConfigError(f"world size ({par.world_size}) must be divisible by TP x PP x CP "
                          f"({tp} x {pp} x {cp})")
    dp = par.data_parallel_size
    validate_experts(cfg)
    _validate_split(cfg)
    if t.global_batch_size % (t.micro_batch_size * dp):
        raise ConfigError(f"--global-batch-size ({t.global_batch_size}) must be divisible by "
                          f"--micro-batch-size x data-parallel size ({t.micro_batch_size} x {dp})")
    _validate_pipeline(cfg)
    if m.seq_length % (2 * cp):
        raise ConfigError(f"--seq-length ({m.seq_length}) must be divisible by 2 x "
                          f"--context-parallel-size ({cp}): each CP rank takes two chunks")
    _validate_rampup(cfg)
    _validate_recompute(m, min(_stage_layers(cfg)))
    validate_a2a_overlap(cfg)
    if par.sequence_parallel and tp == 1:
        raise ConfigError("--sequence-parallel needs --tensor-model-parallel-size > 1")
    if pr.bf16 and pr.fp16:
        raise ConfigError("--bf16 and --fp16 are mutually exclusive")
    if pr.tp_only_amax_red and not (pr.fp8_format and pr.fp8_recipe == "delayed"):
        raise ConfigError("--tp-only-amax-red applies to FP8 delayed scaling (--fp8-format with "
                          "--fp8-recipe delayed): the other recipes keep no amax history to "
                          "reduce")
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
    check_ranges(cfg)
    _validate_zero(cfg)
    _validate_instances(cfg)
    _validate_fp32_reduce_scatter(cfg.optim)
    if o.ddp_bucket_size is not None and o.ddp_bucket_size < 1:
        raise ConfigError(f"--ddp-bucket-size must be positive, got {o.ddp_bucket_size}")
    if o.ddp_bucket_size is not None and not (o.overlap_grad_reduce or o.use_megatron_fsdp
                                              or cfg.lgs.lgs):
        raise ConfigError("--ddp-bucket-size needs --overlap-grad-reduce (without it "
                          "megatron-core reduces every gradient in one bucket after the "
                          "backward and ignores the size)")
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
    if o.lr_decay_style != "WSD" and (o.lr_wsd_decay_iters is not None or
                                      o.lr_wsd_decay_style != OptimizerConfig.lr_wsd_decay_style):
        raise ConfigError(f"--lr-wsd-decay-iters and --lr-wsd-decay-style shape the decay of "
                          f"--lr-decay-style WSD; with {o.lr_decay_style} they would do nothing")
    # megatron-core anneals over the last N decay iterations; an anneal reaching into the warmup
    # would start part-way down, and N <= 0 holds the rate at --lr, then drops it to --min-lr.
    if o.lr_decay_style == "WSD" and not 1 <= o.lr_wsd_decay_iters <= decay_iters - warmup:
        raise ConfigError(f"--lr-wsd-decay-iters must be in 1..{decay_iters - warmup} (the decay "
                          f"iterations after the warmup), got {o.lr_wsd_decay_iters}")
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
    check_blend_weights(dd.domain_weights, dd.data_path)
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
    if cfg.checkpoint.override_opt_param_scheduler and \
            cfg.checkpoint.use_checkpoint_opt_param_scheduler:
        raise ConfigError("--override-opt_param-scheduler takes this run's optimizer settings, "
                          "--use-checkpoint-opt_param-scheduler the checkpoint's: give one")
    if cfg.checkpoint.ckpt_step is not None and not cfg.checkpoint.load:
        raise ConfigError("--ckpt-step picks an iteration of the checkpoints under --load: give "
                          "--load")
    if cfg.checkpoint.finetune and not cfg.checkpoint.load:
        raise ConfigError("--finetune starts from the weights of the checkpoint under --load: "
                          "give --load")
    check_output_dirs(cfg)


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


# SplitError's field -> the flag to name.
_SPLIT_FLAGS = {"num_layers": "--num-layers",
                "decoder_first_pipeline_num_layers": "--decoder-first-pipeline-num-layers"}


def _stage_layers(cfg: Config) -> list[int]:
    """Transformer layers of each pipeline stage, as megatron-core builds them."""
    par = cfg.parallel
    split = layer_split(cfg.model.num_layers, par.pipeline_model_parallel_size, 1,
                        *pipeline_split(par).values())
    return [sum(chunks) for chunks in split]


def _validate_split(cfg: Config) -> None:
    """The pipeline split megatron-core will build (`lgs.workload.layer_split`), one line."""
    m, par = cfg.model, cfg.parallel
    pp = par.pipeline_model_parallel_size
    uneven = (par.decoder_first_pipeline_num_layers, par.decoder_last_pipeline_num_layers)
    for flag, value in zip(("--decoder-first-pipeline-num-layers",
                            "--decoder-last-pipeline-num-layers"), uneven, strict=True):
        if value is not None and value < 1:
            raise ConfigError(f"{flag} must be at least 1, got {value}")
    if any(v is not None for v in uneven) and par.num_layers_per_virtual_pipeline_stage:
        raise ConfigError("--num-layers-per-virtual-pipeline-stage cannot be combined with "
                          "--decoder-first/last-pipeline-num-layers (their stages hold different "
                          "layer counts); give the model chunks per pipeline rank with "
                          "--num-virtual-stages-per-pipeline-rank, as Megatron-LM asks")
    if not any(uneven) and not (par.account_for_embedding_in_pipeline_split
                                or par.account_for_loss_in_pipeline_split):
        if m.num_layers % pp:
            raise ConfigError(f"--num-layers ({m.num_layers}) must be divisible by "
                              f"--pipeline-model-parallel-size ({pp}), or split unevenly "
                              "(--decoder-first/last-pipeline-num-layers, "
                              "--account-for-embedding/loss-in-pipeline-split)")
        return
    try:
        _stage_layers(cfg)  # the virtual chunks: _validate_pipeline
    except SplitError as e:
        raise ConfigError(f"pipeline split ({_SPLIT_FLAGS.get(e.field, e.field)}): {e}") from None


def _validate_pipeline(cfg: Config) -> None:
    par, t = cfg.parallel, cfg.training
    per_chunk, chunks = (par.num_layers_per_virtual_pipeline_stage,
                         par.num_virtual_stages_per_pipeline_rank)
    pp = par.pipeline_model_parallel_size
    if per_chunk is None and chunks is None:
        return
    if per_chunk is not None and chunks is not None:
        raise ConfigError("--num-layers-per-virtual-pipeline-stage and "
                          "--num-virtual-stages-per-pipeline-rank both set the interleaved "
                          "schedule; give one")
    flag = ("--num-layers-per-virtual-pipeline-stage" if chunks is None
            else "--num-virtual-stages-per-pipeline-rank")
    if pp < 2:
        raise ConfigError(f"{flag} needs --pipeline-model-parallel-size > 1")
    if per_chunk is not None:
        stage = par.split_layers(cfg.model.num_layers) // pp
        if per_chunk < 1 or stage % per_chunk:
            raise ConfigError(f"{flag} ({per_chunk}) must divide the layers of each pipeline "
                              f"stage ({stage})")
    vpp = par.virtual_pipeline_size(cfg.model.num_layers)
    if vpp < 2:
        raise ConfigError(f"{flag} must leave at least 2 model chunks per pipeline stage "
                          "(otherwise drop the flag)")
    try:
        split = layer_split(cfg.model.num_layers, pp, vpp, *pipeline_split(par).values())
    except SplitError:
        units = _stage_layers(cfg)  # the embedding and loss count where the split counts them
        units[0] += par.account_for_embedding_in_pipeline_split
        units[-1] += par.account_for_loss_in_pipeline_split
        raise ConfigError(f"{flag}: {vpp} model chunks per pipeline rank must divide the layers "
                          f"of every stage ({', '.join(map(str, units))})") from None
    if min(min(c) for c in split) < 1:
        raise ConfigError(f"{flag}: {vpp} model chunks per pipeline rank leave a chunk without a "
                          "transformer layer (the embedding or loss counted in the split fills "
                          "it)")
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
    if par.virtual_pipeline_size(cfg.model.num_layers) and (start // unit % pp
                                                              or increment // unit % pp):
        raise ConfigError("--rampup-batch-size with the interleaved schedule: every step's "
                          f"micro-batch count must be divisible by PP ({pp})")


def _validate_recompute(m: ModelConfig, per_stage: int) -> None:
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
        if not 1 <= layers <= per_stage:
            raise ConfigError(f"--recompute-num-layers ({layers}) must be in 1..{per_stage} "
                              f"(the layers of the smallest pipeline stage)")


def _validate_zero(cfg: Config) -> None:
    o, par, ckpt = cfg.optim, cfg.parallel, cfg.checkpoint
    if o.data_parallel_sharding_strategy != "no_shard" and not o.use_megatron_fsdp:
        raise ConfigError("--data-parallel-sharding-strategy is a Megatron-FSDP setting: add "
                          "--use-megatron-fsdp (ZeRO-1/2 without it: --use-distributed-optimizer)")
    if o.use_megatron_fsdp:
        if o.data_parallel_sharding_strategy == "no_shard":
            raise ConfigError("--use-megatron-fsdp needs --data-parallel-sharding-strategy "
                              "optim, optim_grads or optim_grads_params (ZeRO-1/2/3): with "
                              "no_shard megatron-core 0.16.1's optimizer step finds no weight "
                              "buffer to gather")
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
