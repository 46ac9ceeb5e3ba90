"""`--lgs-hardware measured`: the calibration probe runs inside a real 2-process job, and the
cost model's start-up thresholds come from what it measured."""

from __future__ import annotations

import re

import pytest

from megatron_lgs.lgs.hardware import load_measurements, load_profile
from tests.conftest import _base_env, run_pretrain
from tests.forked_ranks import run_ranks

pytestmark = pytest.mark.slow


def test_measured_profile_probes_the_job_and_feeds_auto_thresholds(tiny):
    # 2 ranks as 2 "nodes" of 1: the probe measures the inter level and the compute.
    run = run_pretrain([*tiny, "--train-iters", "2", "--log-interval", "1",
                        "--use-distributed-optimizer", "--lgs", "--lgs-gpus-per-node", "1",
                        "--lgs-thresholds", "auto", "--lgs-hardware", "measured"], nproc=2)
    line = re.search(r"calibration \(([0-9.]+) s\): intra .*; inter alpha (\d+) us, bus bw "
                     r"([0-9.]+) Gbit/s; backward ([0-9.]+) ms/layer \(([0-9.]+) GFLOP/s\); "
                     r"communication beside compute: overlap ([0-9.]+)", run.stdout)
    assert line, run.stdout[-3000:]
    seconds, _, bw, backward_ms, gflops, overlap = map(float, line.groups())
    assert seconds < 60 and bw > 0 and backward_ms > 0 and gflops > 0 and 0 <= overlap <= 1
    # One rank per node: no intra-node hop, so no intra-node overlap of its own.
    assert "intra-node" not in run.stdout[line.end():].splitlines()[0]
    assert "LGS thresholds from the cost model (measured): intra" in run.stdout
    assert len(run.logged_losses()) == 2


def test_calibrate_command_saves_a_profile_the_trainer_runs_on(tiny, tmp_path):
    # `python -m megatron_lgs.lgs.calibrate` under torchrun, as a user saves a cluster's profile.
    path = tmp_path / "cluster.json"
    code, stdout, stderr = run_ranks(
        "megatron_lgs.lgs.calibrate",
        ["--out", str(path), *tiny, "--use-distributed-optimizer", "--lgs", "--lgs-gpus-per-node",
         "1"],
        2, _base_env(), 300)
    assert code == 0, stderr[-3000:]
    assert f"wrote {path}" in stdout
    hw = load_profile(path)
    samples = load_measurements(path)["inter_samples"]
    assert hw.gpus_per_node == 1 and hw.inter.bandwidth_Bps > 0 and len(samples) == 3
    run = run_pretrain([*tiny, "--train-iters", "2", "--log-interval", "1", "--lgs",
                        "--use-distributed-optimizer",
                        "--lgs-gpus-per-node", "1", "--lgs-thresholds", "auto",
                        "--lgs-hardware", str(path)], nproc=2)
    assert "LGS thresholds from the cost model" in run.stdout
    assert len(run.logged_losses()) == 2
