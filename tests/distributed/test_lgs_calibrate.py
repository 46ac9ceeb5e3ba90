"""`--lgs-hardware measured`: the calibration probe runs inside a real 2-process job, and the
cost model's start-up thresholds come from what it measured."""

from __future__ import annotations

import re

import pytest

from tests.conftest import run_pretrain

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
    assert "LGS thresholds from the cost model (measured): intra" in run.stdout
    assert len(run.logged_losses()) == 2
