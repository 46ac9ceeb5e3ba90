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


@pytest.mark.parametrize("layout", [
    [],  # the combined 1F1B without pipelining
    ["--num-layers", "4", "--pipeline-model-parallel-size", "2",
     "--num-layers-per-virtual-pipeline-stage", "1", "--micro-batch-size", "2"],  # interleaved
], ids=["ep2", "ep2-pp2-vpp2"])
def test_expert_parallel_comm_overlap_trains_as_the_plain_schedule(tiny, tmp_path, layout):
    """megatron-core's combined 1F1B (--overlap-moe-expert-parallel-comm) against its plain
    schedule on the same layout: the same losses, to BF16 reassociation (the router's and the
    experts' gradient contributions are summed in another order)."""
    moe = [*tiny, *MOE, *layout, "--bf16", "--expert-model-parallel-size", "2",
           "--moe-token-dispatcher-type", "alltoall"]
    nproc = 4 if layout else 2
    plain = run_pretrain(moe, nproc=nproc, save_dir=tmp_path / "plain").losses()
    overlap = run_pretrain([*moe, "--overlap-moe-expert-parallel-comm"], nproc=nproc,
                           save_dir=tmp_path / "overlap")
    assert "combined 1F1B schedule" in overlap.stdout
    assert len(plain) == 4
    assert overlap.losses() == pytest.approx(plain, rel=1e-4)


def test_moe_with_biases_is_refused_in_one_line_on_cpu(tiny, tmp_path):
    run = run_pretrain([*tiny, "--num-experts", "4", "--train-iters", "1"],
                       save_dir=tmp_path / "c", expect_success=False)
    assert run.returncode == 2 and "--disable-bias-linear" in run.stderr
