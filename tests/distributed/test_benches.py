"""The benchmarks run (their numbers are reported, never asserted)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import REPO, TINY_GPT, _base_env

pytestmark = pytest.mark.slow


def test_step_overhead_bench_prints_its_ratio(data_cache):
    proc = subprocess.run(
        [sys.executable, "bench/step_overhead.py", "--blocks", "1", "--block-steps", "2",
         *TINY_GPT, "--data-cache-dir", data_cache],
        cwd=REPO, env=_base_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "ratio trainer/minimal:" in proc.stdout
