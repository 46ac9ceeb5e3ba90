"""bench/parallel_overhead.py runs and prints its tables (numbers reported, never asserted)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import REPO, _base_env

pytestmark = pytest.mark.slow


def test_parallel_overhead_bench_prints_memory_and_step_tables(data_cache):
    proc = subprocess.run(
        [sys.executable, "bench/parallel_overhead.py", "--layouts", "dp1,dp2-zero1",
         "--iters", "2", "--data-cache-dir", data_cache],
        cwd=REPO, env=_base_env(), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert "memory per rank at start-up (MB" in proc.stdout
    assert any(line.startswith("dp2-zero1") and line.endswith("x") for line in lines)
    assert any(line.startswith("dp1") and line.endswith("1.00x") for line in lines)
