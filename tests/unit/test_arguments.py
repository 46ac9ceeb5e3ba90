"""Flags: Megatron-LM spellings into typed configs; bad combinations are one line, exit 2,
before any process group exists."""

from __future__ import annotations

import pytest

from megatron_lgs.arguments import parse_args
from megatron_lgs.run_config import ConfigError
from megatron_lgs.validation import validate
from tests.conftest import _base_env
from tests.forked_ranks import run_ranks


def test_defaults_are_the_embedded_tiny_run():
    cfg = parse_args([], world_size=1)
    assert cfg.model.num_layers == 4 and cfg.model.hidden_size == 128
    assert cfg.parallel.data_parallel_size == 1
    assert cfg.precision.name == "fp32"
    assert cfg.checkpoint.save  # the main job writes a checkpoint by default


def test_megatron_flag_names_reach_their_dataclasses():
    cfg = parse_args([
        "--num-layers", "6", "--hidden-size", "96", "--num-attention-heads", "6",
        "--tensor-model-parallel-size", "2", "--use-distributed-optimizer",
        "--overlap-grad-reduce", "--ddp-bucket-size", "1000", "--bf16", "--clip-grad", "0.5",
        "--lr-decay-style", "WSD", "--lr-wsd-decay-iters", "10", "--disable-bias-linear",
        "--global-batch-size", "32", "--micro-batch-size", "2", "--exit-interval", "7",
    ], world_size=4)
    assert cfg.model.num_layers == 6 and not cfg.model.add_bias_linear
    assert cfg.parallel.tensor_model_parallel_size == 2 and cfg.parallel.data_parallel_size == 2
    assert cfg.optim.use_distributed_optimizer and cfg.optim.overlap_grad_reduce
    assert cfg.optim.ddp_bucket_size == 1000 and cfg.optim.clip_grad == 0.5
    assert cfg.precision.bf16 and cfg.training.exit_interval == 7


@pytest.mark.parametrize("argv, world, message", [
    (["--num-attention-heads", "3", "--hidden-size", "96", "--tensor-model-parallel-size", "2"],
     2, "divisible by --tensor-model-parallel-size"),
    (["--tensor-model-parallel-size", "2"], 3, "world size (3) must be divisible by TP x PP"),
    (["--global-batch-size", "10", "--micro-batch-size", "4"], 1, "--global-batch-size (10)"),
    (["--global-batch-size", "8", "--micro-batch-size", "4"], 4, "data-parallel size"),
    (["--bf16", "--fp16"], 1, "mutually exclusive"),
    (["--openai-gelu", "--swiglu"], 1, "--openai-gelu picks the GELU of a GELU MLP"),
    (["--moe-ffn-hidden-size", "32"], 1, "it needs --num-experts"),
    (["--expert-tensor-parallel-size", "2"], 1, "splits the experts: it needs --num-experts"),
    (["--num-experts", "2", "--disable-bias-linear", "--expert-tensor-parallel-size", "2"], 1,
     "divisible by expert TP x EP x PP (2 x 1 x 1)"),
    (["--num-experts", "4", "--disable-bias-linear", "--tensor-model-parallel-size", "2",
      "--sequence-parallel", "--expert-model-parallel-size", "4",
      "--expert-tensor-parallel-size", "1"], 2, "divisible by expert TP x EP x PP (1 x 4 x 1)"),
    (["--use-megatron-fsdp", "--no-save"], 2, "--use-megatron-fsdp needs"),
    (["--num-experts", "2", "--tensor-model-parallel-size", "2", "--sequence-parallel"], 2,
     "cannot split experts with linear biases over TP (expert TP 2)"),
    (["--num-experts", "2", "--moe-expert-capacity-factor", "1", "--moe-aux-loss-coeff", "0",
      "--moe-router-load-balancing-type", "sinkhorn", "--moe-router-topk", "1"], 1,
     "--moe-expert-capacity-factor needs the aux_loss"),
    (["--lr-warmup-iters", "500", "--train-iters", "100"], 1, "warmup"),
    (["--lr-decay-style", "WSD"], 1, "--lr-wsd-decay-iters"),
    (["--sequence-parallel"], 1, "--sequence-parallel needs"),
    (["--optimizer", "sgd", "--use-distributed-optimizer"], 1, "supports only --optimizer adam"),
    (["--vocab-size", "100"], 1, "--vocab-size must be at least 257"),
    (["--loss-spike-action", "rollback", "--no-save"], 1, "needs --save"),
    (["--finetune"], 1, "--finetune starts from the weights of the checkpoint under --load"),
    (["--async-save", "--no-save"], 1, "--async-save needs --save"),
    (["--lgs-compress", "int8", "--lgs-gpus-per-node", "2"], 1,
     "--lgs-gpus-per-node, --lgs-compress needs --lgs"),
    (["--lgs", "--lgs-inter-threshold-mb", "0"], 1, "--lgs-inter-threshold-mb must be > 0"),
    (["--lgs", "--lgs-memory-cap-mb", "-1"], 1, "--lgs-memory-cap-mb must be > 0"),
    (["--lgs", "--ddp-bucket-size", "1000"], 1, "--ddp-bucket-size and --lgs"),
    (["--ddp-bucket-size", "1000"], 2, "--ddp-bucket-size needs --overlap-grad-reduce"),
    (["--context-parallel-size", "2", "--seq-length", "30"], 2, "divisible by 2 x "),
    (["--lgs", "--lgs-layer-weighting", "flops"], 1, "invalid choice"),
    (["--lgs", "--lgs-autotune-inter-min-mb", "8", "--lgs-autotune-inter-max-mb", "4"], 1,
     "--lgs-autotune-inter-min-mb must be > 0 and <="),
    (["--num-distributed-optimizer-instances", "2", "--no-save"], 2,
     "needs --use-distributed-optimizer"),
    (["--num-distributed-optimizer-instances", "4", "--use-distributed-optimizer", "--no-save",
      "--global-batch-size", "48"], 6, "must be >= 1 and divide the data-parallel size (6)"),
    (["--num-distributed-optimizer-instances", "2", "--use-distributed-optimizer"], 2,
     "checkpoints of replicated optimizer instances are not wired yet"),
    (["--num-distributed-optimizer-instances", "2", "--use-distributed-optimizer", "--no-save",
      "--lgs"], 2, "--lgs replaces the reduction"),
    (["--reduce-scatter-with-fp32-accumulation"], 2, "needs --use-distributed-optimizer"),
    (["--reduce-scatter-with-fp32-accumulation", "--use-distributed-optimizer", "--no-save",
      "--num-distributed-optimizer-instances", "2"], 2, "megatron-core refuses it"),
])
def test_bad_combinations_are_rejected(argv, world, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_args(argv, world_size=world)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err
    assert len(err.strip().splitlines()) == 1


def _float_flags() -> list[str]:
    from megatron_lgs.arguments import build_parser, finite_float

    return [a.option_strings[-1] for a in build_parser()._actions if a.type is finite_float]


def test_every_float_flag_refuses_nan_and_infinity(capsys):
    flags = _float_flags()
    assert "--lr" in flags and "--hidden-dropout" in flags and len(flags) >= 30
    for flag in flags:
        for value in ("nan", "inf", "-inf"):
            with pytest.raises(SystemExit) as exit_info:
                parse_args([f"{flag}={value}"], world_size=1)
            err = capsys.readouterr().err.strip().splitlines()
            assert exit_info.value.code == 2 and len(err) == 1, (flag, value, err)
            assert f"argument {flag}: must be a finite number" in err[0], (flag, value, err)


@pytest.mark.parametrize("argv, message", [
    (["--hidden-dropout", "1"], "--hidden-dropout must be in [0, 1)"),
    (["--attention-dropout", "-0.1"], "--attention-dropout must be in [0, 1)"),
    (["--init-method-std", "0"], "--init-method-std must be positive"),
    (["--moe-aux-loss-coeff", "-1"], "--moe-aux-loss-coeff must be non-negative"),
    (["--moe-z-loss-coeff", "-1"], "--moe-z-loss-coeff must be non-negative"),
    (["--moe-expert-capacity-factor", "0"], "--moe-expert-capacity-factor must be positive"),
    (["--min-lr=-1e-5", "--lr", "1e-3"], "--min-lr must be non-negative"),
    (["--weight-decay", "-0.1"], "--weight-decay must be non-negative"),
    (["--clip-grad", "-1"], "--clip-grad must be non-negative"),
    (["--adam-beta1", "1"], "--adam-beta1 must be in [0, 1)"),
    (["--adam-beta2", "1.5"], "--adam-beta2 must be in [0, 1)"),
    (["--adam-eps", "0"], "--adam-eps must be positive"),
    (["--sgd-momentum", "-0.5"], "--sgd-momentum must be non-negative"),
    (["--optimizer-offload-fraction", "1.5"], "--optimizer-offload-fraction must be in [0, 1]"),
    (["--loss-scale", "-1"], "--loss-scale must be positive"),
    (["--initial-loss-scale", "0"], "--initial-loss-scale must be positive"),
    (["--min-loss-scale", "-1"], "--min-loss-scale must be positive"),
    (["--domain-weights", "code=nan", "prose=1"], "a finite weight, got 'code=nan'"),
    (["--data-path", "inf", "/a", "1", "/b"], "--data-path weights must be finite"),
    (["--data-path", "-1", "/a", "1", "/b"], "--data-path weights must be finite, non-negative"),
    (["--data-path", "x", "/a", "1", "/b"], "--data-path: 'x' is not a weight"),
])
def test_values_no_flag_means_are_refused(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_args(argv, world_size=1)
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(err) == 1 and message in err[0], err


def test_the_edges_of_each_range_are_accepted():
    parse_args(["--hidden-dropout", "0", "--attention-dropout", "0.99", "--clip-grad", "0",
                "--weight-decay", "0", "--min-lr", "0", "--adam-beta1", "0",
                "--optimizer-offload-fraction", "1", "--moe-aux-loss-coeff", "0",
                "--data-path", "0", "/a", "2", "/b"], world_size=1)


def test_experts_folded_over_the_tp_ranks_are_accepted():
    """EP may span a stage's TP ranks where the experts are not split over TP (megatron-core's
    MoE parallel folding): EP4 x TP2 on 4 ranks. Refused until 2026-12-07."""
    cfg = parse_args(["--num-experts", "4", "--disable-bias-linear", "--tensor-model-parallel-size",
                      "2", "--sequence-parallel", "--expert-model-parallel-size", "4",
                      "--expert-tensor-parallel-size", "1"], world_size=4)
    assert cfg.parallel.data_parallel_size == 2 and cfg.parallel.expert_tp == 1


def test_validate_raises_config_error_for_callers_that_build_configs():
    cfg = parse_args([], world_size=1)
    broken = type(cfg)(model=type(cfg.model)(num_attention_heads=5), parallel=cfg.parallel)
    with pytest.raises(ConfigError, match="--hidden-size"):
        validate(broken)


@pytest.mark.parametrize("argv, env, message", [
    (["--num-attention-heads", "3", "--tensor-model-parallel-size", "2"], {},
     "must be divisible by --tensor-model-parallel-size"),
    (["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2"],
     {"WORLD_SIZE": "6", "RANK": "0"}, "world size (6) must be divisible"),
    (["--global-batch-size", "12", "--micro-batch-size", "8"], {},
     "--global-batch-size (12) must be divisible"),
    (["--fp8-format", "e5m9"], {}, "invalid choice: 'e5m9'"),
    (["--fp8-format", "e4m3"], {}, "needs Transformer Engine"),
    (["--no-such-flag"], {}, "unrecognized arguments: --no-such-flag"),
])
def test_entry_point_fails_in_one_line_before_any_process_group(argv, env, message):
    # WORLD_SIZE without MASTER_ADDR: had the script tried to start a process group, it would
    # have failed with a different, multi-line error (or hung until the timeout).
    full_env = {**_base_env(), **env}
    full_env.pop("MASTER_ADDR", None)
    code, stdout, stderr = run_ranks("pretrain_gpt", argv, 1, full_env, timeout=120)
    assert code == 2
    lines = stderr.strip().splitlines()
    assert lines == [lines[0]] and lines[0].startswith("pretrain_gpt.py: error: ")
    assert message in lines[0]
    assert "Traceback" not in stdout + stderr


@pytest.mark.parametrize("flag", ["--save", "--tensorboard-dir", "--data-cache-dir"])
def test_an_output_folder_that_cannot_be_one_is_refused_up_front(flag, tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("")
    for path, said in ((afile, "exists and is not a directory"),
                       (afile / "sub", f"{afile} is not a directory")):
        with pytest.raises(SystemExit) as exit_info:
            parse_args([flag, str(path)], world_size=1)
        err = capsys.readouterr().err.strip().splitlines()
        assert exit_info.value.code == 2 and len(err) == 1 and said in err[0], err
    fresh = tmp_path / "new" / "deeper"
    parse_args([flag, str(fresh)], world_size=1)
    assert not fresh.parent.exists()  # checked, not created
