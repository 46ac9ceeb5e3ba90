"""Flags of the parallel layouts and of activation recompute: Megatron-LM's names, their rules
checked before any process group starts (one line, exit 2)."""

from __future__ import annotations

import pytest

from megatron_lgs.arguments import parse_args
from megatron_lgs.initialize import check_platform
from megatron_lgs.platform import get_platform
from megatron_lgs.run_config import ConfigError

VPP = ["--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "1"]
A2A = ["--num-experts", "4", "--disable-bias-linear", "--overlap-moe-expert-parallel-comm"]
EP2 = ["--expert-model-parallel-size", "2"]


def test_layout_and_recompute_flags_reach_their_dataclasses():
    cfg = parse_args([*VPP, "--num-layers", "4", "--micro-batch-size", "2",
                      "--recompute-granularity", "full", "--recompute-method", "block",
                      "--recompute-num-layers", "1"], world_size=2)
    assert cfg.parallel.virtual_pipeline_size(cfg.model.num_layers) == 2
    assert cfg.parallel.data_parallel_size == 1
    assert (cfg.model.recompute_granularity, cfg.model.recompute_method,
            cfg.model.recompute_num_layers) == ("full", "block", 1)
    assert parse_args([], world_size=1).parallel.virtual_pipeline_size(4) is None


def test_uneven_pipeline_split_reaches_megatron_core():
    """Megatron-LM's uneven-split flags reach TransformerConfig, and megatron-core builds the
    layers our validation expects (`lgs.workload.layer_split`)."""
    from megatron.core.transformer.transformer_block import get_num_layers_to_build

    from megatron_lgs.model import transformer_config

    cases = [(["--pipeline-model-parallel-size", "4", "--num-layers", "14",
               "--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split",
               "--num-layers-per-virtual-pipeline-stage", "2"], 4,
              [[1, 2], [2, 2], [2, 2], [2, 1]]),
             (["--pipeline-model-parallel-size", "3", "--num-layers", "7",
               "--decoder-first-pipeline-num-layers", "1"], 3, [[1], [3], [3]]),
             # Uneven first/last stages with interleaving: chunks per rank, not layers.
             (["--pipeline-model-parallel-size", "3", "--num-layers", "10",
               "--decoder-first-pipeline-num-layers", "2", "--decoder-last-pipeline-num-layers",
               "4", "--num-virtual-stages-per-pipeline-rank", "2"], 3,
              [[1, 1], [2, 2], [2, 2]])]
    for argv, world, expected in cases:
        cfg = parse_args([*argv, "--global-batch-size", "24", "--micro-batch-size", "1"],
                         world_size=world)
        config = transformer_config(cfg, get_platform())
        vpp = len(expected[0])
        built = [[get_num_layers_to_build(config, vp_stage=c if vpp > 1 else None, pp_rank=k)
                  for c in range(vpp)] for k in range(len(expected))]
        assert built == expected


def test_kv_channels_reach_megatron_core():
    """--kv-channels: heads wider than hidden / heads, and a hidden size the heads need not
    divide."""
    from megatron_lgs.model import transformer_config

    cfg = parse_args(["--hidden-size", "60", "--num-attention-heads", "4", "--kv-channels", "32"],
                     world_size=1)
    config = transformer_config(cfg, get_platform())
    assert (config.kv_channels, cfg.model.head_dim) == (32, 32)


@pytest.mark.parametrize("argv, world, message", [
    (["--recompute-granularity", "full"], 1, "needs --recompute-method uniform|block"),
    (["--kv-channels", "0"], 1, "--kv-channels must be at least 1"),
    (["--norm-epsilon", "0"], 1, "--norm-epsilon must be positive"),
    (["--rotary-base", "500000"], 1, "--rotary-base sets RoPE's period: it needs"),
    (["--position-embedding-type", "rope", "--rotary-base", "0"], 1,
     "--rotary-base must be at least 1"),
    (["--use-rope-scaling"], 1, "--use-rope-scaling scales RoPE's frequencies: it needs"),
    (["--position-embedding-type", "rope", "--rope-scaling-factor", "32"], 1, "give both"),
    (["--position-embedding-type", "rope", "--use-rope-scaling", "--rope-scaling-factor",
      "0.5"], 1, "--rope-scaling-factor must be at least 1"),
    (["--hidden-size", "60", "--num-attention-heads", "8"], 1,
     "or give the head width with --kv-channels"),
    (["--recompute-granularity", "selective", "--recompute-num-layers", "1"], 1, "takes no"),
    (["--recompute-method", "block"], 1, "need --recompute-granularity full"),
    (["--recompute-granularity", "full", "--recompute-method", "block",
      "--recompute-num-layers", "3", "--pipeline-model-parallel-size", "2"], 2,
     "must be in 1..2"),
    (["--num-layers-per-virtual-pipeline-stage", "1"], 1, "needs --pipeline-model-parallel-size"),
    (["--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "2",
      "--num-layers", "6"], 2, "must divide the layers of each pipeline stage (3)"),
    ([*VPP, "--num-layers", "2"], 2, "at least 2 model chunks"),
    ([*VPP, "--num-layers", "4", "--micro-batch-size", "4", "--global-batch-size", "4"], 2,
     "micro-batches per step (1) divisible by --pipeline-model-parallel-size (2)"),
    (["--num-experts", "4", "--disable-bias-linear", "--tensor-model-parallel-size", "2"], 2,
     "needs --sequence-parallel"),
    (["--context-parallel-size", "2", "--seq-length", "66"], 2,
     "--seq-length (66) must be divisible by 2 x --context-parallel-size (2)"),
    (["--pipeline-model-parallel-size", "2", "--num-layers", "3"], 2,
     "or split unevenly (--decoder-first/last-pipeline-num-layers"),
    (["--pipeline-model-parallel-size", "3", "--num-layers", "8",
      "--decoder-first-pipeline-num-layers", "1"], 3,
     "pipeline split (--num-layers): num_layers 8 minus the first/last stages' 1"),
    (["--pipeline-model-parallel-size", "2", "--num-layers", "4",
      "--decoder-first-pipeline-num-layers", "1", "--account-for-loss-in-pipeline-split"], 2,
     "(--decoder-first-pipeline-num-layers): uneven first/last stages cannot be combined"),
    (["--pipeline-model-parallel-size", "2", "--num-layers", "4",
      "--decoder-last-pipeline-num-layers", "0"], 2,
     "--decoder-last-pipeline-num-layers must be at least 1"),
    ([*VPP, "--num-layers", "4", "--decoder-first-pipeline-num-layers", "1"], 2,
     "cannot be combined with --decoder-first/last-pipeline-num-layers"),
    ([*VPP, "--num-layers", "6", "--account-for-embedding-in-pipeline-split",
      "--account-for-loss-in-pipeline-split"], 2, "leave a chunk without a transformer layer"),
    ([*VPP, "--num-layers", "4", "--num-virtual-stages-per-pipeline-rank", "2"], 2,
     "both set the interleaved schedule; give one"),
    (["--num-virtual-stages-per-pipeline-rank", "2"], 1,
     "--num-virtual-stages-per-pipeline-rank needs --pipeline-model-parallel-size > 1"),
    (["--pipeline-model-parallel-size", "2", "--num-layers", "4",
      "--num-virtual-stages-per-pipeline-rank", "1"], 2, "at least 2 model chunks"),
    (["--pipeline-model-parallel-size", "2", "--num-layers", "5",
      "--decoder-first-pipeline-num-layers", "2", "--num-virtual-stages-per-pipeline-rank", "2"],
     2, "2 model chunks per pipeline rank must divide the layers of every stage (2, 3)"),
    (["--pipeline-model-parallel-size", "2", "--num-layers", "6",
      "--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split",
      "--num-virtual-stages-per-pipeline-rank", "4"], 2,
     "4 model chunks per pipeline rank leave a chunk without a transformer layer"),
    (["--pipeline-model-parallel-size", "2", "--num-layers", "5",
      "--decoder-first-pipeline-num-layers", "1", "--recompute-granularity", "full",
      "--recompute-method", "block", "--recompute-num-layers", "2"], 2,
     "must be in 1..1 (the layers of the smallest pipeline stage)"),
    ([*A2A, "--bf16"], 1, "--overlap-moe-expert-parallel-comm needs --expert-model-parallel-size"),
    ([*A2A, *EP2, "--bf16", "--moe-token-dispatcher-type", "allgather"], 2,
     "needs --moe-token-dispatcher-type alltoall"),
    ([*A2A, *EP2, "--moe-token-dispatcher-type", "alltoall"], 2, "needs --bf16 or --fp16"),
    ([*A2A, *EP2, "--bf16", "--moe-token-dispatcher-type", "alltoall", "--recompute-granularity",
      "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"], 2,
     "does not run with --recompute-granularity full"),
    ([*A2A, *EP2, "--bf16", "--moe-token-dispatcher-type", "alltoall",
      "--pipeline-model-parallel-size", "2"], 4, "needs virtual stages"),
    (["--moe-router-topk", "1"], 1, "--moe-router-topk 1 needs --moe-router-load-balancing-type"),
    (["--moe-router-topk", "0"], 1, "--moe-router-topk must be at least 1, got 0"),
    (["--num-experts", "2", "--disable-bias-linear", "--moe-router-topk", "1",
      "--moe-router-load-balancing-type", "sinkhorn"], 1, "add --moe-aux-loss-coeff 0"),
])
def test_bad_layout_and_recompute_flags_are_one_line(argv, world, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_args(argv, world_size=world)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err, err
    assert len(err.strip().splitlines()) == 1


def test_alltoall_with_expert_tensor_parallelism_is_refused_on_gloo():
    moe = ["--num-experts", "4", "--disable-bias-linear", "--tensor-model-parallel-size", "2",
           "--sequence-parallel", "--expert-model-parallel-size", "2",
           "--moe-token-dispatcher-type", "alltoall"]
    with pytest.raises(ConfigError, match="which gloo cannot"):
        check_platform(parse_args(moe, world_size=4), get_platform())
    check_platform(parse_args([*moe, "--expert-tensor-parallel-size", "1"], world_size=4),
                   get_platform())


def test_context_parallel_runs_on_this_platform_with_either_position_embedding():
    for position in ("learned_absolute", "rope"):
        check_platform(parse_args(["--context-parallel-size", "2", "--position-embedding-type",
                                   position], world_size=2), get_platform())


@pytest.mark.parametrize("router", [
    [], ["--moe-router-topk", "1"], ["--moe-router-topk", "1", "--moe-aux-loss-coeff", "0"],
    ["--moe-router-load-balancing-type", "sinkhorn"],
    ["--moe-router-load-balancing-type", "sinkhorn", "--moe-aux-loss-coeff", "0"],
    ["--moe-router-load-balancing-type", "sinkhorn", "--moe-aux-loss-coeff", "0",
     "--moe-router-topk", "1"],
    ["--moe-router-load-balancing-type", "none", "--moe-router-topk", "1"],
])
@pytest.mark.parametrize("experts", [[], ["--num-experts", "2", "--disable-bias-linear"]])
def test_router_flags_the_validation_passes_megatron_core_accepts(router, experts) -> None:
    """What parse_args lets through, megatron-core 0.16.1's TransformerConfig takes: its router
    checks (top-1 without pre-softmax, sinkhorn beside an aux loss) were tracebacks after
    start-up until the validation said them."""
    from megatron_lgs.model import transformer_config

    try:
        cfg = parse_args([*experts, *router], world_size=1)
    except SystemExit:
        return
    transformer_config(cfg, get_platform())
