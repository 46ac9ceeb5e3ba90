"""launch/slurm/pretrain_gpt.sbatch under a real single-node Slurm cluster (Debian's slurm-wlm
and munge, installed here when missing), 2 tasks, to a checkpoint; a second submission resumes."""

from __future__ import annotations

import pytest

from tests.distributed.slurm_cluster import (
    python_for_jobs,
)

pytestmark = pytest.mark.slow


@pytest.fixture
def cluster(slurm_single):
    return slurm_single


def test_sbatch_trains_two_tasks_to_a_checkpoint_then_resumes(cluster, data_cache):
    save = cluster.root / "ckpt"
    out = cluster.root / "job-%j.out"
    small = ["--num-layers", "2", "--vocab-size", "512", "--data-cache-dir", data_cache,
             "--log-interval", "1", "--eval-interval", "1000", "--eval-iters", "1"]
    env = {"SAVE": str(save), "CONFIG": "tiny-cpu", "PYTHON": python_for_jobs()}

    state, code = cluster.sbatch("--ntasks=2", f"--output={out}",
                                 "launch/slurm/pretrain_gpt.sbatch", "--train-iters", "4",
                                 *small, env=env)
    logs = "\n".join(p.read_text() for p in cluster.root.glob("job-*.out"))
    assert (state, code) == ("COMPLETED", "0:0"), logs[-4000:]
    assert "2 ranks on 1 node(s)" in logs and "x DP 2" in logs
    assert f"no checkpoint in {save} yet: starting from iteration 0" in logs
    assert (save / "latest_checkpointed_iteration.txt").read_text() == "4"

    # A longer run decays over its new length: Megatron-LM's flag says so (without it the
    # changed schedule is refused).
    state, code = cluster.sbatch("--ntasks=2", f"--output={out}",
                                 "launch/slurm/pretrain_gpt.sbatch", "--train-iters", "6",
                                 "--override-opt_param-scheduler", *small, env=env)
    logs = "\n".join(p.read_text() for p in cluster.root.glob("job-*.out"))
    assert (state, code) == ("COMPLETED", "0:0"), logs[-4000:]
    assert f"loaded checkpoint from {save} at iteration 4" in logs
    assert "decay steps (--lr-decay-iters, else --train-iters) 4 -> 6" in logs
    assert (save / "latest_checkpointed_iteration.txt").read_text() == "6"
