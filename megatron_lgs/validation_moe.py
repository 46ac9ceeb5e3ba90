"""The trainer's rules for mixture-of-experts flags, which `validation.validate` calls in its
order. Most are megatron-core 0.16.1's own, which it would raise only once the model is built,
after the process groups start; here they are said before any of them does."""

from __future__ import annotations

from megatron_lgs.run_config import Config, ConfigError


def validate_experts(cfg: Config) -> None:
    m, par = cfg.model, cfg.parallel
    pp, ep = par.pipeline_model_parallel_size, par.expert_model_parallel_size
    if m.moe_router_topk < 1:
        raise ConfigError(f"--moe-router-topk must be at least 1, got {m.moe_router_topk}")
    if m.num_experts is None and ep > 1:
        raise ConfigError("--expert-model-parallel-size > 1 needs --num-experts")
    if m.num_experts is not None:
        if m.num_experts < 1 or m.num_experts % ep:
            raise ConfigError(f"--num-experts ({m.num_experts}) must be a positive multiple of "
                              f"--expert-model-parallel-size ({ep})")
        if not 1 <= m.moe_router_topk <= m.num_experts:
            raise ConfigError(f"--moe-router-topk ({m.moe_router_topk}) must be in 1.."
                              f"{m.num_experts}")
    # megatron-core 0.16.1's TransformerConfig refuses this even on a dense model: a softmax
    # over the one chosen score has no gradient unless it runs before the top-k
    # (--moe-router-pre-softmax, which this trainer does not offer) or sinkhorn balances.
    if m.moe_router_topk == 1 and m.moe_router_load_balancing_type != "sinkhorn":
        raise ConfigError("--moe-router-topk 1 needs --moe-router-load-balancing-type sinkhorn "
                          "in megatron-core 0.16.1 (a softmax over one chosen score has no "
                          "gradient); route to 2 or more experts")
    if (m.num_experts is not None and m.moe_router_load_balancing_type == "sinkhorn"
            and m.moe_aux_loss_coeff > 0):
        raise ConfigError("--moe-router-load-balancing-type sinkhorn balances without an "
                          "auxiliary loss, and megatron-core 0.16.1 refuses one beside it: add "
                          "--moe-aux-loss-coeff 0")
    if m.num_experts is None:
        if m.moe_ffn_hidden_size is not None:
            raise ConfigError("--moe-ffn-hidden-size sizes the experts: it needs --num-experts")
        if par.expert_tensor_parallel_size is not None:
            raise ConfigError("--expert-tensor-parallel-size splits the experts: it needs "
                              "--num-experts")
        return
    # The experts' layout folds over a stage's TP x CP x DP ranks on its own (megatron-core's
    # "MoE parallel folding"): EP may span TP ranks, so EP x TP x PP need not divide the world.
    if par.world_size % (par.expert_tp * ep * pp):
        raise ConfigError(f"world size ({par.world_size}) must be divisible by expert TP x EP x "
                          f"PP ({par.expert_tp} x {ep} x {pp})")
    # 0.16.1 puts a layer's weights in the experts' process groups (`allreduce` False) only at
    # EP > 1: at EP 1 experts split otherwise than the dense layers are reduced over the dense
    # data-parallel group as if they were dense, and train apart from one process (TP2 with
    # expert TP 1: the two TP ranks' experts each see half the tokens and never meet). Fixed
    # upstream in Megatron-LM #5916 (2026-07-25); `test_expert_groups_pin.py` holds the pin.
    if ep == 1 and par.expert_tp != par.tensor_model_parallel_size:
        raise ConfigError(f"--expert-tensor-parallel-size ({par.expert_tp}) other than TP "
                          f"({par.tensor_model_parallel_size}) needs --expert-model-parallel-size "
                          "> 1 in megatron-core 0.16.1, which otherwise reduces the experts' "
                          "gradients as dense ones")
    if m.add_bias_linear and par.expert_tp > 1:
        raise ConfigError(f"megatron-core 0.16.1 cannot split experts with linear biases over "
                          f"TP (expert TP {par.expert_tp}): add --disable-bias-linear "
                          f"or --expert-tensor-parallel-size 1")
    if par.tensor_model_parallel_size > 1 and not par.sequence_parallel:
        raise ConfigError("MoE with --tensor-model-parallel-size > 1 needs --sequence-parallel "
                          "(megatron-core's MoE layer refuses to train without it)")
    if m.moe_expert_capacity_factor is not None and \
            m.moe_router_load_balancing_type == "sinkhorn":
        raise ConfigError("--moe-expert-capacity-factor needs the aux_loss, seq_aux_loss or "
                          "none router in megatron-core 0.16.1, not sinkhorn")


def validate_a2a_overlap(cfg: Config) -> None:
    """What megatron-core 0.16.1's TransformerConfig asserts for the combined 1F1B schedule,
    said before any process group starts."""
    m, par = cfg.model, cfg.parallel
    if not m.overlap_moe_expert_parallel_comm:
        return
    flag = "--overlap-moe-expert-parallel-comm"
    if par.expert_model_parallel_size < 2:
        raise ConfigError(f"{flag} needs --expert-model-parallel-size > 1")
    if m.moe_token_dispatcher_type != "alltoall":
        raise ConfigError(f"{flag} needs --moe-token-dispatcher-type alltoall")
    if m.recompute_granularity == "full":
        raise ConfigError(f"{flag} does not run with --recompute-granularity full")
    if not (cfg.precision.bf16 or cfg.precision.fp16):
        raise ConfigError(f"{flag} needs --bf16 or --fp16")
    if par.pipeline_model_parallel_size > 1 and par.virtual_pipeline_size(m.num_layers) is None:
        raise ConfigError(f"{flag} with --pipeline-model-parallel-size > 1 needs virtual "
                          "stages (--num-layers-per-virtual-pipeline-stage)")
