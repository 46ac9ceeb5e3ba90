"""Flags of the parallel layouts and of activation recompute: Megatron-LM's names, their rules
checked before any process group starts (one line, exit 2)."""

from __future__ import annotations

import pytest

from megatron_lgs.arguments import parse_args
from megatron_lgs.initialize import check_platform
from megatron_lgs.platform import get_platform

VPP = ["--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "1"]


def test_layout_and_recompute_flags_reach_their_dataclasses():
    cfg = parse_args([*VPP, "--num-layers", "4", "--micro-batch-size", "2",
                      "--recompute-granularity", "full", "--recompute-method", "block",
                      "--recompute-num-layers", "1"], world_size=2)
    assert cfg.parallel.virtual_pipeline_size(cfg.model.num_layers) == 2
    assert cfg.parallel.data_parallel_size == 1
    assert (cfg.model.recompute_granularity, cfg.model.recompute_method,
            cfg.model.recompute_num_layers) == ("full", "block", 1)
    assert parse_args([], world_size=1).parallel.virtual_pipeline_size(4) is None


@pytest.mark.parametrize("argv, world, message", [
    (["--recompute-granularity", "full"], 1, "needs --recompute-method uniform|block"),
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
])
def test_bad_layout_and_recompute_flags_are_one_line(argv, world, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_args(argv, world_size=world)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err, err
    assert len(err.strip().splitlines()) == 1


def test_context_parallel_runs_on_this_platform_with_either_position_embedding():
    for position in ("learned_absolute", "rope"):
        check_platform(parse_args(["--context-parallel-size", "2", "--position-embedding-type",
                                   position], world_size=2), get_platform())
