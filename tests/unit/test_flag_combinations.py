"""Generated combinations of model and parallelism flags: each is refused in one line, exit 2,
or builds megatron-core's TransformerConfig. A combination that megatron-core refuses only once
the model is built would otherwise fail after the process groups start, with its traceback.
Three such gaps were found this way (--moe-ffn-hidden-size without experts, biased experts
split over TP, a capacity factor under sinkhorn), and two more by training such combinations
for an iteration (--expert-tensor-parallel-size without experts, Megatron-FSDP without a
sharding strategy); all five are refused now (`test_arguments.py`)."""

from __future__ import annotations

import random

from megatron_lgs.arguments import parse_args
from megatron_lgs.model import transformer_config
from megatron_lgs.platform import get_platform

CHOICES = {
    "--num-layers": ["1", "2", "4"], "--hidden-size": ["64", "96", "128"],
    "--num-attention-heads": ["2", "3", "4", "8"], "--ffn-hidden-size": ["100", "128"],
    "--seq-length": ["32", "64"], "--position-embedding-type": ["rope", "learned_absolute"],
    "--normalization": ["RMSNorm", "LayerNorm"], "--swiglu": None, "--openai-gelu": None,
    "--disable-bias-linear": None, "--add-qkv-bias": None, "--qk-layernorm": None,
    "--group-query-attention": None, "--num-query-groups": ["1", "2", "4"],
    "--kv-channels": ["16", "32"], "--num-experts": ["2", "4"], "--moe-router-topk": ["1", "2"],
    "--moe-ffn-hidden-size": ["32", "64"], "--moe-token-dispatcher-type": ["allgather", "alltoall"],
    "--moe-router-load-balancing-type": ["aux_loss", "sinkhorn", "none", "seq_aux_loss"],
    "--moe-expert-capacity-factor": ["1.0"], "--moe-aux-loss-coeff": ["0", "0.01"],
    "--overlap-moe-expert-parallel-comm": None, "--recompute-granularity": ["full", "selective"],
    "--recompute-method": ["uniform", "block"], "--recompute-num-layers": ["1", "2"],
    "--tensor-model-parallel-size": ["1", "2"], "--pipeline-model-parallel-size": ["1", "2"],
    "--context-parallel-size": ["1", "2"], "--expert-model-parallel-size": ["1", "2"],
    "--expert-tensor-parallel-size": ["1", "2"], "--sequence-parallel": None,
    "--num-layers-per-virtual-pipeline-stage": ["1"], "--use-distributed-optimizer": None,
    "--use-megatron-fsdp": None, "--data-parallel-sharding-strategy": ["optim", "no_shard"],
    "--bf16": None, "--fp16": None, "--micro-batch-size": ["1", "2"],
    "--global-batch-size": ["8", "16"],
}


def test_a_combination_is_refused_in_one_line_or_builds_the_model_config(capsys) -> None:
    rng, platform, built = random.Random(0), get_platform(), 0
    for _ in range(600):
        argv = ["--no-save"]
        for flag in rng.sample(sorted(CHOICES), rng.randint(1, 10)):
            argv += [flag] if CHOICES[flag] is None else [flag, rng.choice(CHOICES[flag])]
        world = rng.choice([1, 2, 4, 8])
        try:
            cfg = parse_args(argv, world_size=world)
        except SystemExit as exc:
            err = capsys.readouterr().err.strip().splitlines()
            assert exc.code == 2 and len(err) == 1, (argv, world, err)
            continue
        transformer_config(cfg, platform)  # megatron-core's own checks of the config
        built += 1
    assert built > 60  # the generator reaches accepted combinations, not only refusals
