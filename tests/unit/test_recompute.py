"""Activation recompute (megatron-core's, from Megatron-LM's flags) changes memory, not math:
full (uniform and block) and selective recompute give the losses of a run without it."""

from __future__ import annotations

import pytest

from megatron_lgs.arguments import parse_args
from megatron_lgs.model import transformer_config
from megatron_lgs.platform import get_platform
from tests.conftest import report, run_pretrain

STEPS = ["--train-iters", "3", "--log-interval", "1", "--eval-iters", "0"]


@pytest.fixture(scope="module")
def no_recompute(data_cache) -> list[float]:
    from tests.conftest import TINY_GPT

    return run_pretrain([*TINY_GPT, "--data-cache-dir", data_cache, *STEPS]).logged_losses()


@pytest.mark.parametrize("flags", [
    ["--recompute-granularity", "full", "--recompute-method", "uniform",
     "--recompute-num-layers", "1"],
    ["--recompute-granularity", "full", "--recompute-method", "block",
     "--recompute-num-layers", "2"],
    ["--recompute-granularity", "selective"],
], ids=["full-uniform", "full-block", "selective"])
def test_recompute_gives_the_same_losses(no_recompute, tiny, flags):
    # The flags reach megatron-core's TransformerConfig, which does the recomputing.
    config = transformer_config(parse_args([*tiny, *flags], world_size=1), get_platform())
    assert (config.recompute_granularity, config.recompute_method) == (flags[1], (
        flags[3] if len(flags) > 2 else None))
    run = run_pretrain([*tiny, *STEPS, *flags])
    got = run.logged_losses()
    assert len(got) == len(no_recompute) == 3
    worst = max(abs(a - b) for a, b in zip(no_recompute, got, strict=True))
    report(f"recompute {' '.join(flags[1::2])}: max |loss - no recompute| {worst:.1e}")
    assert worst < 1e-6, (no_recompute, got)
