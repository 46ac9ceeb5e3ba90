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


def test_lgs_overlap_bench_prints_its_ratios():
    proc = subprocess.run(
        [sys.executable, "bench/lgs_overlap.py", "--rounds", "1", "--steps", "1",
         "--hidden-size", "64", "--num-layers", "2", "--seq-length", "32",
         "--intra-mb", "0.1", "--inter-mb", "0.05"],
        cwd=REPO, env=_base_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for scheme in ("no overlap", "megatron", "LGS"):
        assert f"\n{scheme} " in proc.stdout
    assert "ratio LGS exposed / no-overlap exposed:" in proc.stdout


def test_async_save_bench_prints_its_ratio(data_cache):
    proc = subprocess.run(
        [sys.executable, "bench/async_save.py", "--rounds", "1", "--steps", "2",
         *TINY_GPT, "--data-cache-dir", data_cache],
        cwd=REPO, env=_base_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "ratio async stall / sync save:" in proc.stdout
