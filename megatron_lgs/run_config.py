"""The typed configuration of one training run: one small frozen dataclass per concern.

`arguments` fills these from the command line (Megatron-LM flag spellings) and `validation`
checks the rules that span several of them, both before any process group exists.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from megatron_lgs.lgs.config import LgsConfig
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
    kv_channels: int | None = None  # one attention head's width; hidden / heads when unset
    seq_length: int = 128
    max_position_embeddings: int | None = None  # seq_length when unset
    position_embedding_type: str = "learned_absolute"
    rotary_base: int = 10000  # RoPE's theta (Llama 3: 500000)
    use_rope_scaling: bool = False  # Llama 3.1's long-context frequency scaling
    rope_scaling_factor: float = 8.0  # its factor (Llama 3.2 1B/3B: 32)
    apply_rope_fusion: bool = True  # TE's fused RoPE kernel where it runs (`model.rope_fusion`)
    normalization: str = "LayerNorm"
    norm_epsilon: float = 1e-5  # Qwen: 1e-6
    qk_layernorm: bool = False  # a norm on each query and key head (Qwen3)
    swiglu: bool = False
    openai_gelu: bool = False  # GELU's tanh approximation (GPT-2's gelu_new), not the exact one
    add_bias_linear: bool = True
    add_qkv_bias: bool = False  # biases on Q, K and V only (Qwen2), beside --disable-bias-linear
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
    # megatron-core's combined 1F1B: each micro-batch's EP all-to-alls run beside another
    # micro-batch's compute (`validation._validate_a2a_overlap` holds its conditions).
    overlap_moe_expert_parallel_comm: bool = False
    # Activation recompute (Megatron-LM's flags), passed to megatron-core's TransformerConfig.
    recompute_granularity: str | None = None  # full | selective
    recompute_method: str | None = None  # uniform | block (full only)
    recompute_num_layers: int | None = None

    @property
    def ffn_size(self) -> int:
        return self.ffn_hidden_size or 4 * self.hidden_size

    @property
    def head_dim(self) -> int:
        return self.kv_channels or self.hidden_size // self.num_attention_heads

    @property
    def query_groups(self) -> int:
        """K/V heads: the query groups with grouped-query attention, else every head."""
        if self.group_query_attention and self.num_query_groups:
            return self.num_query_groups
        return self.num_attention_heads


@dataclass(frozen=True)
class ParallelConfig:
    world_size: int = 1
    tensor_model_parallel_size: int = 1
    pipeline_model_parallel_size: int = 1
    context_parallel_size: int = 1
    expert_model_parallel_size: int = 1
    expert_tensor_parallel_size: int | None = None
    sequence_parallel: bool = False
    # Interleaved 1F1B when either is set (Megatron-LM's two flags; one at a time): the layers
    # of each model chunk, or the model chunks per pipeline rank (which also takes uneven
    # first/last stages).
    num_layers_per_virtual_pipeline_stage: int | None = None
    num_virtual_stages_per_pipeline_rank: int | None = None
    # Megatron-core's uneven pipeline splits: the first / last stage's layer count, or the
    # embedding / the loss counted as one layer of the first / last stage.
    decoder_first_pipeline_num_layers: int | None = None
    decoder_last_pipeline_num_layers: int | None = None
    account_for_embedding_in_pipeline_split: bool = False
    account_for_loss_in_pipeline_split: bool = False

    @property
    def expert_tp(self) -> int:
        """The experts' TP size: --expert-tensor-parallel-size, else TP (megatron-core's rule)."""
        return self.expert_tensor_parallel_size or self.tensor_model_parallel_size

    def split_layers(self, num_layers: int) -> int:
        """The layers the pipeline split divides: the embedding and loss count when asked."""
        return (num_layers + self.account_for_embedding_in_pipeline_split
                + self.account_for_loss_in_pipeline_split)

    def virtual_pipeline_size(self, num_layers: int) -> int | None:
        """Model chunks per pipeline rank (Megatron-LM's rule); None without interleaving."""
        if self.num_virtual_stages_per_pipeline_rank is not None:
            return self.num_virtual_stages_per_pipeline_rank
        per_stage = self.num_layers_per_virtual_pipeline_stage
        if per_stage is None:
            return None
        return self.split_layers(num_layers) // self.pipeline_model_parallel_size // per_stage

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
    # Delayed scaling's amax all-reduce over TP x CP only, not the data-parallel ranks too
    # (megatron-core's default group), as NVIDIA's MLPerf configs run it: off by default, as in
    # Megatron-LM, since the scales then differ across data-parallel replicas.
    tp_only_amax_red: bool = False

    @property
    def name(self) -> str:
        return "bf16" if self.bf16 else "fp16" if self.fp16 else "fp32"


@dataclass(frozen=True)
class OptimizerConfig:
    optimizer: str = "adam"
    lr: float = 1.5e-3
    min_lr: float = 1.5e-4
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
    # Megatron-LM's --ckpt-step: load this iteration of --load, not the tracker's latest.
    ckpt_step: int | None = None
    save_interval: int | None = None  # save at the end only when unset
    # Megatron-LM's --async-save: training goes on while megatron-core's forked writer writes.
    async_save: bool = False
    ckpt_format: str = "torch_dist"
    no_save_optim: bool = False
    no_load_optim: bool = False
    no_load_rng: bool = False
    finetune: bool = False
    # Megatron-LM's: a resume takes this run's LR schedule (and clipping, Adam's betas and
    # epsilon), or the checkpoint's, where they differ (schedule_resume); with neither the
    # resume is refused.
    override_opt_param_scheduler: bool = False
    use_checkpoint_opt_param_scheduler: bool = False


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


def warmup_iters(cfg: Config) -> int:
    o = cfg.optim
    if o.lr_warmup_fraction is not None:
        return int(o.lr_warmup_fraction * (o.lr_decay_iters or cfg.training.train_iters))
    return o.lr_warmup_iters

