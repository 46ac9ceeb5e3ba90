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


def test_lgs_overlap_bench_quick_mode_on_the_emulated_cluster():
    from launch.emulate_cluster import unavailable_reason

    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    # --quick with a tiny GPT and one step per scheme: every scheme runs and is reported.
    proc = subprocess.run(
        [sys.executable, "bench/lgs_overlap.py", "--quick", "--hidden-size", "64", "--heads", "4",
         "--num-layers", "2", "--seq-length", "32", "--vocab-size", "512", "--rounds", "1",
         "--steps", "1", "--tune-max-steps", "6", "--bucket-sweep", "20000"],
        cwd=REPO, env=_base_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    for scheme in ("a no-overlap", "b megatron", "c megatron-best", "d 2-level", "e LGS model",
                   "f LGS tuned", "g LGS int8"):
        assert f"\n{scheme} " in proc.stdout
    assert "LGS exposed / (a) exposed:" in proc.stdout


def test_async_save_bench_prints_its_ratio(data_cache):
    proc = subprocess.run(
        [sys.executable, "bench/async_save.py", "--rounds", "1", "--steps", "2",
         *TINY_GPT, "--data-cache-dir", data_cache],
        cwd=REPO, env=_base_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "ratio async stall / sync save:" in proc.stdout
