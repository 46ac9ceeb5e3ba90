"""Data parallelism with real processes (torchrun, gloo) against the single-process reference."""

from __future__ import annotations

import pytest

from tests.conftest import run_pretrain

pytestmark = pytest.mark.slow

STEPS = ["--train-iters", "5", "--log-interval", "1"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory, data_cache) -> list[float]:
    from tests.conftest import TINY_GPT

    save = tmp_path_factory.mktemp("dp1")
    return run_pretrain([*TINY_GPT, "--data-cache-dir", data_cache, *STEPS],
                        save_dir=save).losses()


@pytest.mark.parametrize("extra", [[], ["--use-distributed-optimizer"],
                                   ["--use-distributed-optimizer", "--overlap-grad-reduce"],
                                   ["--use-distributed-optimizer", "--overlap-grad-reduce",
                                    "--reduce-scatter-with-fp32-accumulation"]])
def test_two_ranks_match_one_process_with_the_same_global_batch(reference, tiny, tmp_path,
                                                                extra):
    run = run_pretrain([*tiny, *STEPS, *extra], nproc=2, save_dir=tmp_path / "ckpt")
    losses = run.losses()
    assert len(losses) == len(reference) == 5
    for step, (one, two) in enumerate(zip(reference, losses, strict=True), start=1):
        assert abs(one - two) < 1e-5, f"step {step}: 1 process {one}, 2 ranks {two}"


def test_distributed_optimizer_shards_optimizer_state_across_ranks(tiny, tmp_path):
    def optimizer_bytes(nproc: int, extra: list[str]) -> list[int]:
        run = run_pretrain([*tiny, "--train-iters", "1", *extra], nproc=nproc,
                           save_dir=tmp_path / f"ckpt-{nproc}-{len(extra)}")
        (memory,) = run.records("memory")
        return [rank["optimizer_state"] for rank in memory["per_rank"]]

    (full,) = optimizer_bytes(1, [])
    replicated = optimizer_bytes(2, [])
    sharded = optimizer_bytes(2, ["--use-distributed-optimizer"])
    assert replicated == [full, full]
    for rank_bytes in sharded:
        # Half of the Adam moments each, up to the padding of bucket shards.
        assert abs(rank_bytes - full / 2) < 0.02 * full, (rank_bytes, full)
    assert sum(sharded) >= full
