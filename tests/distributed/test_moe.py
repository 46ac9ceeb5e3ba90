"""MoE GPT on CPU: experts on two ranks (EP=2) with both token dispatchers."""

from __future__ import annotations

import pytest

from tests.conftest import run_pretrain

pytestmark = pytest.mark.slow

MOE = ["--num-experts", "4", "--moe-router-topk", "2", "--disable-bias-linear",
       "--train-iters", "4", "--log-interval", "1"]


def test_expert_parallel_dispatchers_agree_and_train(tiny, tmp_path):
    losses = {}
    for dispatcher in ("allgather", "alltoall"):
        run = run_pretrain([*tiny, *MOE, "--expert-model-parallel-size", "2",
                            "--moe-token-dispatcher-type", dispatcher], nproc=2,
                           save_dir=tmp_path / dispatcher)
        losses[dispatcher] = run.losses()
    assert losses["allgather"] == pytest.approx(losses["alltoall"], abs=1e-5)
    assert losses["alltoall"][-1] < losses["alltoall"][0]


def test_moe_with_biases_is_refused_in_one_line_on_cpu(tiny, tmp_path):
    run = run_pretrain([*tiny, "--num-experts", "4", "--train-iters", "1"],
                       save_dir=tmp_path / "c", expect_success=False)
    assert run.returncode == 2 and "--disable-bias-linear" in run.stderr
