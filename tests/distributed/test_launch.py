"""launch/torchrun.sh runs a named config under torchrun with the flags given after it."""

from __future__ import annotations

import subprocess

import pytest

from tests.conftest import REPO, _base_env

pytestmark = pytest.mark.slow


def test_torchrun_script_runs_the_tiny_config_on_two_processes(data_cache, tmp_path):
    env = {**_base_env(), "NPROC": "2"}
    proc = subprocess.run(
        ["launch/torchrun.sh", "tiny-cpu", "--train-iters", "3", "--log-interval", "1",
         "--num-layers", "2", "--vocab-size", "512", "--data-cache-dir", data_cache,
         "--save", str(tmp_path / "ckpt")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "x DP 2" in proc.stdout and "iteration        3/       3" in proc.stdout
    assert (tmp_path / "ckpt" / "latest_checkpointed_iteration.txt").read_text() == "3"


def test_unknown_config_is_one_clear_line():
    proc = subprocess.run(["launch/torchrun.sh", "no-such-config"], cwd=REPO, env=_base_env(),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "no config 'no-such-config'" in proc.stderr


@pytest.mark.parametrize("nproc", ["x", "0", "-2", "2.5"])
def test_a_bad_process_count_is_one_clear_line(nproc):
    proc = subprocess.run(["launch/torchrun.sh", "tiny-cpu"], cwd=REPO,
                          env={**_base_env(), "NPROC": nproc}, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        f"launch/torchrun.sh: NPROC must be a process count or auto, cpu, gpu; got '{nproc}'"]
